"""compiler/siblings.py: products of one operand by several weights (q/k/v, gate/up) merge into
one product of stacked weights; every result is the same sum, so outputs do not change. The
MLP's silu(gate) * up then reads two slices of one product: the gemm search's copy alternative
computes it into scratch before the down projection's GEMM."""

from __future__ import annotations

import numpy as np
import pytest

import luminal as lm
import luminal.functional as F
from kernel_cache import use_kernel_cache
from luminal.compiler import kernel_ir as K
from luminal.compiler.lower import lower
from luminal.compiler.search import select
from luminal.compiler.search.gemm import match_gemm, match_gemm_copy
from luminal.compiler.siblings import merge_sibling_products
from luminal.graph.ops import Op

RNG = np.random.default_rng(3)
D, NQ, NKV, FF = 24, 24, 8, 40


def _w(*shape: int) -> np.ndarray:
    return (RNG.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)


def _sums(g: lm.Graph) -> int:
    return sum(1 for n in g.nodes if n.op is Op.SUM_REDUCE)


def _block(ws: dict[str, np.ndarray]) -> lm.Graph:
    """q/k/v projections of one activation and a SwiGLU MLP of another (a Llama block's)."""
    seq = lm.dim("seq", 1, 32)
    g = lm.Graph("block")
    x = g.input("x", (seq, D))
    xm = x * 0.5  # the MLP's operand: a different node from the projections' one
    q, k, v = (F.linear(x, g.weight(n, data=ws[n])) for n in ("wq", "wk", "wv"))
    g.output("qkv", (q[:, :NKV] * k + v).sum(-1, keepdim=True) + q)
    gate, up = (F.linear(xm, g.weight(n, data=ws[n])) for n in ("wg", "wu"))
    g.output("mlp", F.linear(F.silu(gate) * up, g.weight("wd", data=ws["wd"])))
    return g


def _weights() -> dict[str, np.ndarray]:
    return {
        "wq": _w(NQ, D), "wk": _w(NKV, D), "wv": _w(NKV, D),
        "wg": _w(FF, D), "wu": _w(FF, D), "wd": _w(D, FF),
    }  # fmt: skip


def _reference(ws: dict[str, np.ndarray], x: np.ndarray) -> dict[str, np.ndarray]:
    q, k, v = x @ ws["wq"].T, x @ ws["wk"].T, x @ ws["wv"].T
    gate, up = 0.5 * x @ ws["wg"].T, 0.5 * x @ ws["wu"].T
    act = gate / (1 + np.exp(-gate)) * up
    return {"qkv": (q[:, :NKV] * k + v).sum(-1, keepdims=True) + q, "mlp": act @ ws["wd"].T}


@pytest.mark.parametrize("seq", [1, 13])
def test_siblings_merge_and_results_do_not_change(seq: int) -> None:
    ws = _weights()
    g = _block(ws)
    merged = merge_sibling_products(g)
    assert _sums(g) - _sums(merged) == 3  # q/k/v -> 1 and gate/up -> 1
    stacked = sorted(n for n in merged.weights if "#stacked" in n)
    assert sorted(merged.weights[n].shape for n in stacked) == [(NQ + 2 * NKV, D), (2 * FF, D)]
    assert not {"wq", "wk", "wv", "wg", "wu"} & set(merged.weights)  # rows live in the stacks
    x = RNG.standard_normal((seq, D)).astype(np.float32)
    ref = _reference(ws, x)
    for name, got in merged.run({"x": x}).items():
        np.testing.assert_allclose(got, ref[name], rtol=1e-5, atol=1e-5)
    cg = lm.compile(g)
    for name, got in cg.run({"x": x}).items():
        np.testing.assert_allclose(got, ref[name], rtol=1e-4, atol=1e-4)


def test_what_is_not_merged() -> None:
    seq = lm.dim("seq", 1, 8)
    g = lm.Graph("apart")
    x, y = g.input("x", (seq, D)), g.input("y", (seq, D))
    w1 = g.weight("w1", data=_w(8, D))
    w2 = g.weight("w2", data=_w(8, D))
    g.output("a", F.linear(x, w1) + F.linear(y, w2))  # different operands
    g.output("b", F.linear(x, g.input("w3", (8, D))))  # a runtime input, not a weight
    g.output("c", x.matmul(g.weight("w4", data=_w(D, 8))))  # read as W[k, n]: not rows
    assert merge_sibling_products(g) is g


def test_merged_products_chained_and_of_two_weights() -> None:
    """A pair's merged result is the next pair's shared operand (a 2-d DFT: cos and sin
    products along one axis, then along the other), and a pair whose shared operand is a
    weight too (a constant transformed): each operand is read from the new graph."""
    seq = lm.dim("seq", 1, 8)
    g = lm.Graph("chained")
    x = g.input("x", (seq, D))
    c, s, c2, s2 = (g.weight(n, data=_w(D, D)) for n in ("c", "s", "c2", "s2"))
    a, b = F.linear(x, c), F.linear(x, s)
    g.output("y", F.linear(a, c2) - F.linear(b, s2) + F.linear(a, s2))
    k = g.weight("k", data=_w(3, D))
    g.output("z", F.linear(k, c2) * F.linear(k, s2))
    merged = merge_sibling_products(g)
    assert _sums(g) - _sums(merged) == 3
    xv = RNG.standard_normal((5, D)).astype(np.float32)
    ws = {n: g.weights[n] for n in ("c", "s", "c2", "s2", "k")}
    av, bv = xv @ ws["c"].T, xv @ ws["s"].T
    ref = {"y": av @ ws["c2"].T - bv @ ws["s2"].T + av @ ws["s2"].T,
           "z": (ws["k"] @ ws["c2"].T) * (ws["k"] @ ws["s2"].T)}  # fmt: skip
    for name, got in merged.run({"x": xv}).items():
        np.testing.assert_allclose(got, ref[name], rtol=1e-5, atol=1e-5)


def _glu_down(silu: bool) -> tuple[lm.Graph, np.ndarray, np.ndarray]:
    """act(gate) * up read from two slices of one product, then projected (act: SiLU, or
    none for a cheap operand)."""
    seq = lm.dim("seq", 1, 32)
    g = lm.Graph("swiglu")
    h = g.input("h", (seq, 2 * FF))
    wd = _w(D, FF)
    gate = F.silu(h[:, :FF]) if silu else h[:, :FF]
    g.output("y", F.linear(gate * h[:, FF:], g.input("wd", (D, FF))))
    return g, wd, RNG.standard_normal((11, 2 * FF)).astype(np.float32)


def _glu_reference(h: np.ndarray, wd: np.ndarray, silu: bool) -> np.ndarray:
    gate, up = h[:, :FF], h[:, FF:]
    if silu:
        gate = gate / (1 + np.exp(-gate))
    return (gate * up) @ wd.T


def test_elementwise_operand_is_computed_into_scratch_then_gemm(tmp_path, monkeypatch) -> None:
    """A cheap operand (gate * up, read once per output column: 24 times) stays inlined in
    the product; the gemm search's copy alternative computes it into scratch."""
    g, wd, h = _glu_down(silu=False)
    low = lower(g)
    (kern,) = [k for k in low.kernels if isinstance(k, K.Kernel)]
    assert match_gemm(kern, len(low.buffers)) is None  # the operand is not a load
    alt = match_gemm_copy(kern, len(low.buffers))
    assert alt is not None and len(alt.copies) == 1
    assert any(isinstance(x, K.Alu) for x in K.walk(alt.copies[0].value))  # computes, not copies
    use_kernel_cache(monkeypatch, tmp_path)
    monkeypatch.setattr(select, "MIN_GEMM_WORK", 0)
    forced = select.choose_library_calls(
        low, lambda sub, dims: 1.0 if any(isinstance(s, K.LibCall) for s in sub.kernels) else 2.0
    )
    assert [type(s).__name__ for s in forced.kernels] == ["Kernel", "LibCall"]
    from luminal.compile import build_plan

    ex = lm.load(build_plan(forced, g.name).to_bytes())
    ref = _glu_reference(h, wd, silu=False)
    np.testing.assert_allclose(ex.run({"h": h, "wd": wd})["y"], ref, rtol=1e-4, atol=1e-4)


def test_a_transcendental_operand_is_stored_and_the_product_is_a_gemm() -> None:
    """silu(gate) * up would be computed again for every output column inside the product's
    loop: it is stored by a kernel of its own, and the product reads it as a plain GEMM."""
    g, wd, h = _glu_down(silu=True)
    low = lower(g)
    kernels = [k for k in low.kernels if isinstance(k, K.Kernel)]
    assert len(kernels) == 2
    act, prod = kernels
    assert any(isinstance(x, K.Alu) and x.op is Op.EXP2 for x in K.walk(act.value))
    assert match_gemm(prod, len(low.buffers)) is not None
    ref = _glu_reference(h, wd, silu=True)
    got = lm.compile(g).run({"h": h, "wd": wd})["y"]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_padded_operand_is_computed_with_its_zeros(tmp_path, monkeypatch) -> None:
    g = lm.Graph("padded")
    x = g.input("x", (5, 8))
    w = F.pad(g.input("w", (3, 6)), (1, 1))  # reads of padding give 0
    g.output("y", (x.unsqueeze(1) * w.unsqueeze(0)).sum(-1))
    low = lower(g)
    assert match_gemm(low.kernels[0], len(low.buffers)) is None
    assert match_gemm_copy(low.kernels[0], len(low.buffers)) is not None
    xv, wv = RNG.standard_normal((5, 8)), RNG.standard_normal((3, 6))
    xv, wv = xv.astype(np.float32), wv.astype(np.float32)
    ref = xv @ np.pad(wv, ((0, 0), (1, 1))).T
    np.testing.assert_allclose(
        lm.compile(g).run({"x": xv, "w": wv})["y"], ref, rtol=1e-4, atol=1e-5
    )
