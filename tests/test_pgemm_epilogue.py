"""pgemm running its GEMM's epilogue on each stored tile (targets/pgemm_epilogue.py,
csrc/cpu/pgemm_epilogue.inc): a bias along the output's rows or columns and an activation, fused and
unfused (the search forced to each), against PyTorch at odd sizes; the program it encodes;
the plan's checks of the fields."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import luminal as lm
import luminal.functional as F
from kernel_cache import use_kernel_cache
from luminal.codegen.cpu.jam import vector_registers
from luminal.compile import build_plan
from luminal.compiler import kernel_ir as K
from luminal.compiler.lower import lower
from luminal.compiler.search import select
from luminal.compiler.search.tuner import Tuner, clear_memory_cache
from luminal.targets import pgemm_epilogue as PE
from luminal.targets.cpu import CpuTarget

pytestmark = pytest.mark.skipif(vector_registers() < 32, reason="pgemm is offered on AVX-512")

ACTS = {
    "none": (lambda x: x, lambda x: x),
    "relu": (F.relu, torch.relu),
    "silu": (F.silu, torch.nn.functional.silu),
    "gelu": (F.gelu, torch.nn.functional.gelu),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"),
                  lambda x: torch.nn.functional.gelu(x, approximate="tanh")),
    "sigmoid": (F.sigmoid, torch.sigmoid),
}  # fmt: skip


def rand(*shape: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _fused(step: K.Kernel | K.LibCall) -> bool:
    return isinstance(step, K.LibCall) and "epi" in step.fields


def _compile(g: lm.Graph, fused: bool, monkeypatch, swap: int | None = None):
    """The graph's steps and plan with the search made to keep the fused pgemm (or pgemm and
    the epilogue kernel apart) wherever it is offered; ``swap``: its form, plain or swapped."""
    monkeypatch.setattr(select, "MIN_GEMM_WORK", 0)
    clear_memory_cache()

    def measure(sub, dims):
        calls = [s for s in sub.kernels if isinstance(s, K.LibCall)]
        other = any(c.func == "pgemm" and c.fields.get("swap", 0) != swap for c in calls)
        penalty = 0.5 if swap is not None and other else 0.0
        if any(_fused(c) for c in calls):
            return (1.0 if fused else 3.0) + penalty
        return (2.0 if any(c.func == "pgemm" for c in calls) else 4.0) + penalty

    target = CpuTarget()
    tuner = Tuner(measure, f"test-epilogue-{fused}", variants=target.library_variants,
                  epilogues=target.library_epilogues, max_candidates=20)  # fmt: skip
    low = select.choose_library_calls(lower(g), tuner)
    return low.kernels, build_plan(low, g.name)


def _run(g, inputs, fused, monkeypatch, swap=None):
    steps, plan = _compile(g, fused, monkeypatch, swap)
    assert any(_fused(s) for s in steps) == fused
    if swap is not None:
        assert all(s.fields.get("swap", 0) == swap for s in steps if isinstance(s, K.LibCall))
    assert any(isinstance(s, K.LibCall) and s.func == "pgemm" for s in steps)
    return lm.load(plan.to_bytes()).run(inputs)["y"]


@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("m,n", [(3, 13), (17, 77)])
def test_bias_along_columns(act: str, m: int, n: int, tmp_path, monkeypatch) -> None:
    """act(x @ W^T + b), b along the output's columns (a Linear), W a weight."""
    use_kernel_cache(monkeypatch, tmp_path)
    k = 19
    w, b = rand(n, k, seed=1), rand(n, seed=2)
    g = lm.Graph("lin")
    x = g.input("x", (m, k))
    y = x @ g.weight("w", data=w).transpose(0, 1) + g.weight("b", data=b)
    g.output("y", ACTS[act][0](y))
    xv = rand(m, k, seed=3) * 2
    want = ACTS[act][1](torch.from_numpy(xv) @ torch.from_numpy(w).T + torch.from_numpy(b))
    outs = [_run(g, {"x": xv}, fused, monkeypatch) for fused in (True, False)]
    for out in outs:
        np.testing.assert_allclose(out, want.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("swap", [0, 1])
@pytest.mark.parametrize("act", ["relu", "gelu", "silu"])
@pytest.mark.parametrize("m,n", [(3, 13), (17, 77)])
def test_bias_along_rows(act: str, m: int, n: int, swap: int, tmp_path, monkeypatch) -> None:
    """act(W @ x + c[:, None]) for a batch of 2 x: c along the output's rows (a convolution's
    per-channel bias), W a weight on the left, in pgemm's plain and swapped forms."""
    use_kernel_cache(monkeypatch, tmp_path)
    k = 19
    w, c = rand(m, k, seed=4), rand(m, seed=5)
    g = lm.Graph("rows")
    x = g.input("x", (2, k, n))
    y = g.weight("w", data=w) @ x + g.weight("c", data=c).reshape(m, 1)
    g.output("y", ACTS[act][0](y))
    xv = rand(2, k, n, seed=6) * 2
    want = ACTS[act][1](torch.from_numpy(w) @ torch.from_numpy(xv) + torch.from_numpy(c)[:, None])
    outs = [_run(g, {"x": xv}, fused, monkeypatch, swap) for fused in (True, False)]
    for out in outs:
        np.testing.assert_allclose(out, want.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-6, atol=1e-6)


def test_row_bias_of_merged_batches_and_an_offset_vector(tmp_path, monkeypatch) -> None:
    """A batch of x by a shared weight (its rows merged into one product of 2 m rows) with a
    bias along each matrix's rows (the vector's index wraps at m), and a bias read from the
    middle of a longer vector (vec_off)."""
    use_kernel_cache(monkeypatch, tmp_path)
    m, k, n = 17, 19, 13
    w, c, b = rand(n, k, seed=12), rand(m, seed=13), rand(n + 5, seed=14)
    g = lm.Graph("merged")
    x = g.input("x", (2, m, k))
    y = x @ g.weight("w", data=w).transpose(0, 1) + g.weight("c", data=c).reshape(m, 1)
    g.output("y", F.silu(y))
    xv = rand(2, m, k, seed=15)
    t = torch.from_numpy(xv) @ torch.from_numpy(w).T + torch.from_numpy(c)[:, None]
    out = _run(g, {"x": xv}, True, monkeypatch, swap=0)
    np.testing.assert_allclose(out, F_torch_silu(t), rtol=1e-5, atol=1e-5)
    g = lm.Graph("offset")
    x = g.input("x", (m, k))
    y = x @ g.weight("w", data=w).transpose(0, 1) + g.weight("b", data=b)[3 : 3 + n]
    g.output("y", F.relu(y))
    xv = rand(m, k, seed=16)
    want = torch.relu(torch.from_numpy(xv) @ torch.from_numpy(w).T + torch.from_numpy(b[3 : 3 + n]))
    out = _run(g, {"x": xv}, True, monkeypatch)
    np.testing.assert_allclose(out, want.numpy(), rtol=1e-5, atol=1e-5)


def test_operand_copy_then_fused_call(tmp_path, monkeypatch) -> None:
    """gelu(relu(x + b0) @ W^T + b1): the operand computed into a copy first (copy+), then
    the fused call."""
    use_kernel_cache(monkeypatch, tmp_path)
    m, k, n = 17, 19, 13
    w, b0, b1 = rand(n, k, seed=17), rand(k, seed=18), rand(n, seed=19)
    g = lm.Graph("copy")
    x = g.input("x", (m, k))
    a = F.relu(x + g.weight("b0", data=b0))
    g.output("y", F.gelu(a @ g.weight("w", data=w).transpose(0, 1) + g.weight("b1", data=b1)))
    steps, plan = _compile(g, True, monkeypatch)
    assert [type(s) for s in steps] == [K.Kernel, K.LibCall] and _fused(steps[1])
    xv = rand(m, k, seed=20)
    t = torch.relu(torch.from_numpy(xv + b0)) @ torch.from_numpy(w).T + torch.from_numpy(b1)
    out = lm.load(plan.to_bytes()).run({"x": xv})["y"]
    np.testing.assert_allclose(out, torch.nn.functional.gelu(t).numpy(), rtol=1e-5, atol=1e-5)


def F_torch_silu(t):  # noqa: N802
    return torch.nn.functional.silu(t).numpy()


@pytest.mark.parametrize("act", ["gelu_tanh", "relu"])
def test_batched_rows_and_symbolic_dim(act: str, tmp_path, monkeypatch) -> None:
    """A batch x seq product by a shared weight (its rows merged into one product) with a
    symbolic seq: one plan at several sizes, fused, against PyTorch."""
    use_kernel_cache(monkeypatch, tmp_path)
    k, n = 19, 77
    w, b = rand(n, k, seed=7), rand(n, seed=8)
    g = lm.Graph("seq")
    seq = lm.dim("seq", 1, 64)
    x = g.input("x", (2, seq, k))
    y = x @ g.weight("w", data=w).transpose(0, 1) + g.weight("b", data=b)
    g.output("y", ACTS[act][0](y))
    steps, plan = _compile(g, True, monkeypatch)
    assert any(_fused(s) for s in steps)
    ex = lm.load(plan.to_bytes())
    for s in (1, 3, 17, 40):
        xv = rand(2, s, k, seed=s)
        want = ACTS[act][1](torch.from_numpy(xv) @ torch.from_numpy(w).T + torch.from_numpy(b))
        np.testing.assert_allclose(ex.run({"x": xv})["y"], want.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("isa", ["", "portable"])
def test_other_programs_run_interpreted(isa: str, tmp_path, monkeypatch) -> None:
    """An epilogue that is none of the compiled-in programs (|y|, a square root, a max of two
    values, a constant product) runs through the interpreter, in the AVX-512 and the portable
    kernels' stores alike."""
    use_kernel_cache(monkeypatch, tmp_path)
    if isa:
        monkeypatch.setenv("LUMINAL_PGEMM_ISA", isa)
    m, k, n = 17, 19, 77
    w, b = rand(n, k, seed=9), rand(n, seed=10)
    g = lm.Graph("other")
    x = g.input("x", (m, k))
    y = x @ g.weight("w", data=w).transpose(0, 1) + g.weight("b", data=b)
    g.output("y", y.abs().sqrt() * 0.5 + F.relu(y) - F.sigmoid(y * 3.0))
    xv = rand(m, k, seed=11)
    t = torch.from_numpy(xv) @ torch.from_numpy(w).T + torch.from_numpy(b)
    want = t.abs().sqrt() * 0.5 + torch.relu(t) - torch.sigmoid(t * 3.0)
    outs = [_run(g, {"x": xv}, fused, monkeypatch) for fused in (True, False)]
    for out in outs:
        np.testing.assert_allclose(out, want.numpy(), rtol=1e-5, atol=1e-5)


# activations whose programs pgemm_epilogue.inc compiles in (kKnown), with a bias or without
KNOWN = [("none", True), ("relu", True), ("silu", True), ("gelu", True), ("gelu_tanh", True),
         ("sigmoid", True), ("sigmoid", False)]  # fmt: skip


def _codes(act: str, bias: bool) -> list[int]:
    g = lm.Graph("p")
    x = g.input("x", (5, 7))
    y = x @ g.input("w", (7, 9))
    g.output("y", ACTS[act][0](y + g.input("b", (9,)) if bias else y))
    for kern in lower(g).kernels:
        alt = select.match_any(kern, 100) if isinstance(kern, K.Kernel) else None
        if alt is not None and alt.epilogue is not None:
            prog = PE.program(alt.epilogue, alt.call.out)
            assert prog is not None
            codes = PE.allocate(prog)
            assert codes is not None
            return codes
    raise AssertionError(f"{act}: no epilogue")


def test_compiled_in_programs_are_what_the_target_writes() -> None:
    """The table of compiled-in programs (pgemm_epilogue.inc) holds the program written for
    each common activation (a change to how one lowers leaves it interpreted: slower, still
    right)."""
    import re
    from pathlib import Path

    src = (Path(__file__).resolve().parents[1] / "csrc" / "cpu" / "pgemm_epilogue.inc").read_text()
    table = src[src.index("const KnownProgram kKnown[]") :]
    table = table[: table.index("};")]
    known = [[int(c, 16) for c in re.findall(r"0x[0-9a-f]+", m)]
             for m in re.findall(r"LM_KNOWN\(([^)]*)\)", table)]  # fmt: skip
    for act, bias in KNOWN:
        assert _codes(act, bias) in known, (act, bias)


def test_program_of_gelu_and_refusals() -> None:
    """The encoded program: registers within the interpreter's, constants folded into the
    ops; an epilogue reading another operand than one vector, or writing another type, has
    no program."""
    g = lm.Graph("p")
    x = g.input("x", (5, 7))
    g.output("y", F.gelu(x @ g.input("w", (7, 9)) + g.input("b", (9,))))
    (kern,) = [k for k in lower(g).kernels if isinstance(k, K.Kernel)]
    alt = select.match_any(kern, 100)
    assert alt is not None and alt.epilogue is not None
    prog = PE.program(alt.epilogue, alt.call.out)
    assert prog is not None and prog.vec_axis == 2
    codes = PE.allocate(prog)
    assert codes is not None and len(codes) < len(prog.ops)
    assert all((c >> 8 & 255) < PE.REGISTERS for c in codes)
    # an output of another type, or a second vector operand: not fused
    bad = PE.program(K.Kernel("e", (5, 9), 3, alt.epilogue.value, lm.f16), alt.call.out)
    assert bad is None
    two = K.Alu(K.Op.ADD, (alt.epilogue.value, K.Load(7, sym_i(0), 1, lm.f32)), lm.f32)
    assert PE.program(K.Kernel("e", (5, 9), 3, two, lm.f32), alt.call.out) is None


def sym_i(j: int):
    from luminal.graph import symbolic as sym

    return sym.index_var(j, 5)
