"""Copy + GEMM: an operand read through a view with no unit-stride axis (the head-major
attention output read as (seq, heads * head_dim)) is copied into a contiguous scratch buffer
by a generated kernel, then multiplied by a gemm call. Checked against numpy at odd sizes,
with the search forced to the library alternative (a fake measure), and through compile."""

from typing import Any

import numpy as np
import pytest

import luminal as lm
import luminal.functional as F
from kernel_cache import use_kernel_cache
from luminal.compile import build_plan
from luminal.compiler import kernel_ir as K
from luminal.compiler.lower import lower
from luminal.compiler.search import select
from luminal.compiler.search.gemm import match_gemm, match_gemm_copy
from optest import rand

SEQ = lm.dim("seq", 1, 64)
H, HD, N = 3, 20, 37  # heads, head dim, output features


def _prefer_library(sub, dims):
    return 1.0 if any(isinstance(s, K.LibCall) for s in sub.kernels) else 2.0


def _forced(g: lm.Graph, tmp_path, monkeypatch) -> tuple[list, Any]:
    """The program the search keeps when the library alternative measures faster."""
    use_kernel_cache(monkeypatch, tmp_path)
    low = select.choose_library_calls(lower(g), _prefer_library, "test")
    for s in low.kernels:
        s.verify()  # the copy and epilogue kernels are well formed
    return low.kernels, lm.load(build_plan(low, g.name).to_bytes())


def _kinds(steps: list) -> list[str]:
    return ["call" if isinstance(s, K.LibCall) else "kernel" for s in steps]


def _head_major_proj(residual: bool) -> lm.Graph:
    g = lm.Graph("proj")
    o = g.input("o", (H, SEQ, HD))  # attention output, head-major
    w = g.input("w", (N, H * HD))
    y = F.linear(o.permute(1, 0, 2).reshape(SEQ, H * HD), w)
    if residual:
        y = y + g.input("x", (SEQ, N))
    g.output("y", y)
    return g


@pytest.mark.parametrize("residual", [False, True])
def test_head_major_left_operand_is_copied_then_gemm(residual, tmp_path, monkeypatch):
    g = _head_major_proj(residual)
    low = lower(g)
    kern = low.kernels[0]
    assert match_gemm(kern, len(low.buffers)) is None  # no unit-stride axis as read
    alt = match_gemm_copy(kern, len(low.buffers))
    # the copy loops over (seq, head, d): the view's own split of k, so its reads are affine
    assert alt is not None and [c.shape for c in alt.copies] == [(SEQ, H, HD)]
    assert alt.call.args[0] == alt.copies[0].out and alt.call.fields["trans_a"] == 0
    steps, ex = _forced(g, tmp_path, monkeypatch)
    assert _kinds(steps) == ["kernel", "call"] + (["kernel"] if residual else [])
    wv = rand(N, H * HD)
    for s in (1, 7, 33):
        ov = rand(H, s, HD)
        inputs = {"o": ov, "w": wv}
        ref = ov.transpose(1, 0, 2).reshape(s, H * HD) @ wv.T
        if residual:
            inputs["x"] = rand(s, N)
            ref = ref + inputs["x"]
        np.testing.assert_allclose(ex.run(inputs)["y"], ref, rtol=1e-4, atol=1e-4)


def test_axis_split_by_a_chain_of_divisors(tmp_path, monkeypatch):
    """k = (g, a, d) read from an input laid out (a, g, seq, d): the copy loops over all three."""
    g = lm.Graph("chain")
    o = g.input("o", (2, 3, SEQ, 8))
    w = g.input("w", (N, 48))
    g.output("y", F.linear(o.permute(2, 1, 0, 3).reshape(SEQ, 48), w))
    low = lower(g)
    alt = match_gemm_copy(low.kernels[0], len(low.buffers))
    assert alt is not None and [c.shape for c in alt.copies] == [(SEQ, 3, 2, 8)]
    _, ex = _forced(g, tmp_path, monkeypatch)
    ov, wv = rand(2, 3, 9, 8), rand(N, 48)
    ref = ov.transpose(2, 1, 0, 3).reshape(9, 48) @ wv.T
    np.testing.assert_allclose(ex.run({"o": ov, "w": wv})["y"], ref, rtol=1e-4, atol=1e-4)


def test_head_major_right_operand_is_copied_then_gemm(tmp_path, monkeypatch):
    g = lm.Graph("right")
    a = g.input("a", (SEQ, H * HD))
    b = g.input("b", (H, N, HD))  # read as (H * HD, N): k splits across two strides
    g.output("y", a @ b.permute(0, 2, 1).reshape(H * HD, N))
    low = lower(g)
    assert match_gemm(low.kernels[0], len(low.buffers)) is None
    alt = match_gemm_copy(low.kernels[0], len(low.buffers))
    assert alt is not None and [c.shape for c in alt.copies] == [(H, HD, N)]
    assert alt.call.args[1] == alt.copies[0].out
    steps, ex = _forced(g, tmp_path, monkeypatch)
    assert _kinds(steps) == ["kernel", "call"]
    bv = rand(H, N, HD)
    for s in (1, 19):
        av = rand(s, H * HD)
        ref = av @ bv.transpose(0, 2, 1).reshape(H * HD, N)
        np.testing.assert_allclose(ex.run({"a": av, "b": bv})["y"], ref, rtol=1e-4, atol=1e-4)


def test_both_operands_copied_in_a_batch(tmp_path, monkeypatch):
    """Batched (as in BERT: sentences x seq), both operands head-major views: two copies, the
    batch dims copied along for the operand that moves with them."""
    g = lm.Graph("both")
    o = g.input("o", (2, H, SEQ, HD))
    b = g.input("b", (2, H, N, HD))
    left = o.permute(0, 2, 1, 3).reshape(2, SEQ, H * HD)
    right = b.permute(0, 1, 3, 2).reshape(2, H * HD, N)
    g.output("y", left @ right)
    low = lower(g)
    assert match_gemm(low.kernels[0], len(low.buffers)) is None
    alt = match_gemm_copy(low.kernels[0], len(low.buffers))
    assert alt is not None
    assert [c.shape for c in alt.copies] == [(2, SEQ, H, HD), (2, H, HD, N)]
    steps, ex = _forced(g, tmp_path, monkeypatch)
    assert _kinds(steps) == ["kernel", "kernel", "call"]
    bv = rand(2, H, N, HD)
    for s in (1, 13):
        ov = rand(2, H, s, HD)
        ref = ov.transpose(0, 2, 1, 3).reshape(2, s, H * HD) @ bv.transpose(0, 1, 3, 2).reshape(
            2, H * HD, N
        )
        np.testing.assert_allclose(ex.run({"o": ov, "b": bv})["y"], ref, rtol=1e-4, atol=1e-4)


def test_batched_head_major_with_shared_weight(tmp_path, monkeypatch):
    """BERT's output projection: (batch, heads, seq, hd) read as (batch, seq, hidden) times one
    weight shared by the batch."""
    g = lm.Graph("bert_out")
    o = g.input("o", (3, H, SEQ, HD))
    w = g.input("w", (N, H * HD))
    g.output("y", F.linear(o.permute(0, 2, 1, 3).reshape(3, SEQ, H * HD), w))
    low = lower(g)
    alt = match_gemm_copy(low.kernels[0], len(low.buffers))
    assert alt is not None and [c.shape for c in alt.copies] == [(3, SEQ, H, HD)]
    assert alt.call.fields["stride_b"] == 0
    _, ex = _forced(g, tmp_path, monkeypatch)
    wv = rand(N, H * HD)
    ov = rand(3, H, 11, HD)
    ref = ov.transpose(0, 2, 1, 3).reshape(3, 11, H * HD) @ wv.T
    np.testing.assert_allclose(ex.run({"o": ov, "w": wv})["y"], ref, rtol=1e-4, atol=1e-4)


def test_compile_keeps_the_result_whatever_it_picks():
    g = _head_major_proj(residual=True)
    cg = lm.compile(g)
    ov, wv, xv = rand(H, 21, HD), rand(N, H * HD), rand(21, N)
    ref = ov.transpose(1, 0, 2).reshape(21, H * HD) @ wv.T + xv
    np.testing.assert_allclose(cg.run({"o": ov, "w": wv, "x": xv})["y"], ref, rtol=1e-4, atol=1e-4)


def _refused_graphs() -> list[lm.Graph]:
    ints = lm.Graph("ints")  # integer operands: BLAS multiplies floats
    x = ints.input("x", (5, 8), lm.i32)
    w = ints.input("w", (3, 8), lm.i32)
    ints.output("y", (x.unsqueeze(1) * w.unsqueeze(0)).sum(-1))
    heads = lm.Graph("heads")  # the inner product's loads use the outer head sum's variable
    o = heads.input("o", (3, SEQ, 64))
    wh = heads.input("w", (3, 64, 40))
    heads.output("y", o.matmul(wh).sum_reduce([0]))
    # one sum per row read by every output column (a group norm's mean of x times 1/n, read
    # by each element of its group, lowered so): copied, the operand would be a matrix of
    # repeats and the GEMM n times the kernel's work
    scaled = lm.Graph("scaled_sum")
    xs, v = scaled.input("x", (5, 24)), scaled.input("v", (24,))
    scaled.output("y", (xs.unsqueeze(1) * v.unsqueeze(0).unsqueeze(0)).expand((5, 7, 24)).sum(-1))
    return [ints, heads, scaled]  # a padded operand is computed into scratch
    # (test_siblings.py)


@pytest.mark.parametrize("g", _refused_graphs(), ids=lambda g: g.name)
def test_refusals_stay_refused(g):
    low = lower(g)
    for kern in low.kernels:
        assert match_gemm(kern, len(low.buffers)) is None
        assert match_gemm_copy(kern, len(low.buffers)) is None


def test_a_product_under_a_mask_of_the_output_is_no_gemm():
    """A product computed only where ``_i1 < 16`` in a kernel of 24 columns (its part of a
    concatenation, fused): a GEMM over the whole output would read 8 rows past its weight."""
    from dataclasses import replace

    from luminal.graph import symbolic as S

    g = lm.Graph("part")
    x, w = g.input("x", (SEQ, 24)), g.input("w", (16, 24))
    g.output("y", F.linear(x, w))
    low = lower(g)
    (k,) = low.kernels
    assert match_gemm(k, len(low.buffers)) is not None  # the product alone is a GEMM
    part = S.lt(S.index_var(1, 24), 16)
    masked = replace(k, shape=(k.shape[0], 24), value=K.Masked(part, k.value, k.dtype))
    assert match_gemm(masked, len(low.buffers)) is None
    assert match_gemm_copy(masked, len(low.buffers)) is None


def test_split_axis_follows_the_divisors_of_an_index():
    from luminal.graph import symbolic as S
    from luminal.graph.view import split_axis

    i = S.index_var(1, 192)
    head_major = S.add(S.mul(S.floordiv(i, 64), 1000), S.mod(i, 64))
    assert split_axis(head_major, "_i1", 192) == [(3, 64), (64, 1)]
    assert split_axis(S.mul(i, 2), "_i1", 192) == [(192, 1)]  # no division: one loop
    # divisors from any of several indices, kept only while they divide each other
    pair = S.floordiv(i, 2)
    assert split_axis([head_major, pair], "_i1", 192) == [(3, 64), (32, 2), (2, 1)]
    seq = S.dim("seq", 1, 64)
    assert split_axis(head_major, "_i1", seq) == [(seq, 1)]  # a symbolic extent: one loop
