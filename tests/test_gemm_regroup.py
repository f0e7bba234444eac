"""Convolutions as GEMMs: a kernel whose output axes are not (batch, m, n) as they stand is
regrouped (a conv's (batch, channel, height, width) as (batch, channel, pixels)) and its
windowed operand copied contiguously first (im2col). Checked against PyTorch at odd sizes
with the search forced to the library alternative, and through compile."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import luminal as lm
import luminal.functional as F
from kernel_cache import use_kernel_cache
from luminal.codegen.cpu import render_kernel
from luminal.compile import build_plan
from luminal.compiler import kernel_ir as K
from luminal.compiler.lower import lower
from luminal.compiler.pipeline import graph_passes
from luminal.compiler.search import select
from luminal.compiler.search.gemm import match_any, match_gemm, regrouped
from luminal.compiler.stage import stage_strided_reads, summed_major_operands
from luminal.graph import symbolic as sym


def _prefer_library(sub, dims):
    return 1.0 if any(isinstance(s, K.LibCall) for s in sub.kernels) else 2.0


def test_nested_div_mod_folds_back() -> None:
    r = sym.var("r", 0, 26, 27)
    mid = sym.mul(3, sym.mod(sym.floordiv(r, 3), 3))
    merged = sym.add(sym.add(sym.mul(9, sym.floordiv(r, 9)), mid), sym.mod(r, 3))
    assert merged is r
    i = sym.var("i", 0, 6, 7)
    assert sym.add(sym.mul(7, sym.floordiv(i, 7)), sym.mod(i, 7)) is i
    # different strides do not fold
    other = sym.add(sym.mul(32, sym.mod(sym.floordiv(r, 3), 3)), sym.mod(r, 3))
    assert isinstance(other, sym.Expr) and other.kind == sym.ADD


def test_symbolic_monomial_divisors_simplify_and_stay_exact() -> None:
    """(c*i + j) // (c*d) is i // d and d*(i // d) + i % d is i: a reshape of (b, s, k) to
    (b*s, k) with symbolic s reads affinely. Checked against Python's ints everywhere."""
    d = sym.dim("d", 1, 9)
    i = sym.var("i", 0, 40, None)
    j = sym.var("j", 0, 15, 16)
    q = sym.floordiv(sym.add(sym.mul(16, i), j), sym.mul(16, d))
    r = sym.mod(sym.add(sym.mul(16, i), j), sym.mul(16, d))
    assert q is sym.floordiv(i, d)
    assert sym.add(sym.mul(d, q), sym.mod(i, d)) is i
    loose = sym.floordiv(sym.add(sym.mul(16, i), sym.mul(3, j)), sym.mul(16, d))  # 3j >= 16
    for dv in range(1, 10):
        for iv in range(41):
            for jv in range(16):
                env = {"d": dv, "i": iv, "j": jv}
                assert sym.evaluate(q, env) == (16 * iv + jv) // (16 * dv)
                assert sym.evaluate(r, env) == (16 * iv + jv) % (16 * dv)
                assert sym.evaluate(loose, env) == (16 * iv + 3 * jv) // (16 * dv)


def test_regrouped_kernel_keeps_values() -> None:
    g = lm.Graph("r")
    x = g.input("x", (2, 5, 6, 7))
    g.output("y", (x * 2.0).sum(1, keepdim=True).expand(2, 3, 6, 7) + 1.0)
    low = lower(g)
    kern = low.kernels[-1]
    rk = regrouped(kern, 1, 2)
    assert rk is not None and rk.shape == (2, 3, 42)
    rk.verify()
    ref = lm.load(build_plan(low, "r").to_bytes())
    low2 = type(low)(low.buffers, [*low.kernels[:-1], rk], low.dims, low.weights)
    got = lm.load(build_plan(low2, "r").to_bytes())
    xv = np.random.default_rng(0).standard_normal((2, 5, 6, 7)).astype(np.float32)
    np.testing.assert_array_equal(got.run({"x": xv})["y"], ref.run({"x": xv})["y"])
    assert regrouped(kern, 0, 4) is None  # n empty


@pytest.mark.parametrize(
    "cin,cout,size,k,stride,pad,groups",
    [(3, 8, 13, 3, 1, 1, 1), (4, 8, 21, 3, 2, 1, 2), (5, 7, 17, 2, 1, 0, 1)],
)
def test_conv_runs_as_copy_and_gemm(cin, cout, size, k, stride, pad, groups, tmp_path,
                                    monkeypatch) -> None:  # fmt: skip
    use_kernel_cache(monkeypatch, tmp_path)
    rng = np.random.default_rng(1)
    xv = rng.standard_normal((2, cin, size, size + 2)).astype(np.float32)
    wv = rng.standard_normal((cout, cin // groups, k, k)).astype(np.float32)
    g = lm.Graph("conv")
    x = g.input("x", xv.shape)
    w = g.weight("w", data=wv)
    g.output("y", F.relu(F.conv2d(x, w, stride=stride, padding=pad, groups=groups)))
    low = lower(graph_passes(g))
    conv = next(k for k in low.kernels if isinstance(k, K.Kernel) and "sum_reduce" in k.name)
    assert match_gemm(conv, len(low.buffers)) is None  # not (batch, m, n) as it stands
    assert match_any(conv, len(low.buffers)) is not None
    chosen = select.choose_library_calls(low, _prefer_library, "test")
    assert any(isinstance(s, K.LibCall) for s in chosen.kernels)
    for s in chosen.kernels:
        if isinstance(s, K.Kernel):
            s.verify()
    got = lm.load(build_plan(chosen, "conv").to_bytes()).run({"x": xv})["y"]
    conv2d = torch.nn.functional.conv2d
    ref = torch.relu(conv2d(torch.from_numpy(xv), torch.from_numpy(wv), stride=stride,
                            padding=pad, groups=groups))  # fmt: skip
    np.testing.assert_allclose(got, ref.numpy(), rtol=1e-4, atol=1e-4)


def test_pooled_operand_is_copied() -> None:
    """A max pool feeding a convolution is computed inside the operand's copy."""
    g = lm.Graph("pool_conv")
    x = g.input("x", (2, 4, 10, 10))
    w = g.weight("w", data=np.ones((5, 4, 3, 3), np.float32))
    g.output("y", F.conv2d(F.max_pool2d(F.relu(x), 2), w, padding=1))
    low = lower(graph_passes(g))
    conv = next(k for k in low.kernels if isinstance(k, K.Kernel) and "sum_reduce" in k.name)
    alt = match_any(conv, len(low.buffers))
    assert alt is not None and alt.copies
    assert any(isinstance(v, K.Reduce) for c in alt.copies for v in K.walk(c.value))
    cg = lm.compile(g)
    xv = np.random.default_rng(2).standard_normal((2, 4, 10, 10)).astype(np.float32)
    np.testing.assert_allclose(cg.run({"x": xv})["y"], g.run({"x": xv})["y"], rtol=1e-4,
                               atol=1e-4)  # fmt: skip


@pytest.mark.parametrize("columns", [False, True])
@pytest.mark.parametrize("k,stride,pad", [(7, 2, 3), (3, 1, 1), (3, 2, 1)])
def test_staged_patches_of_symbolic_size_feed_the_gemm_directly(
    k, stride, pad, columns, monkeypatch
) -> None:
    """A conv of symbolic batch and size reads its staged patch copy, in row order
    ((batch, oy, ox, taps)) or summed axis first ((taps, batch, oy, ox)): with (oy, ox)
    regrouped as one pixel axis, the copy is an operand of the GEMM, which reads it in place
    (no second copy of the patches; summed axis first, its leading dimension spans the
    batch). Row-order copies of rows shorter than a vector, and summed-axis-first copies at
    stride 2, run as vectors of lanes. The compiled product matches PyTorch at several sizes."""
    h, n = lm.dim("h", 4, 300), lm.dim("n", 1, 15)
    g = lm.Graph("conv")
    x = g.input("x", (n, 3, h, h))
    wv = np.random.default_rng(3).standard_normal((16, 3, k, k)).astype(np.float32)
    g.output("y", F.conv2d(x, g.weight("w", data=wv), stride=stride, padding=pad))
    monkeypatch.setenv("LUMINAL_STAGE", "0")
    unstaged = graph_passes(g)
    major = summed_major_operands(unstaged) if columns else frozenset()
    low = lower(stage_strided_reads(unstaged, major))
    copy, conv = [s for s in low.kernels if isinstance(s, K.Kernel)][:2]
    assert "cast" in copy.name and "sum_reduce" in conv.name
    alt = match_any(conv, len(low.buffers))
    assert alt is not None and not alt.copies, "the staged patches were copied again"
    src = render_kernel(copy, sorted(low.dims)).source
    if not columns:
        assert "lm_vload_f32_lanes(" in src and "lm_vstore_f32_lanes(" in src
    elif stride == 2:
        assert "lm_vload_f32_s2_lanes(" in src
    chosen = select.choose_library_calls(low, _prefer_library, "test")
    assert any(isinstance(s, K.LibCall) for s in chosen.kernels)
    plan = lm.load(build_plan(chosen, "conv").to_bytes())
    for b, size in ((1, 4), (2, 9), (3, 23)):
        xv = np.random.default_rng(size).standard_normal((b, 3, size, size)).astype(np.float32)
        ref = torch.nn.functional.conv2d(torch.from_numpy(xv), torch.from_numpy(wv),
                                         stride=stride, padding=pad)  # fmt: skip
        np.testing.assert_allclose(plan.run({"x": xv})["y"], ref.numpy(), rtol=1e-4, atol=1e-4)
