"""The blocked form of attention's C kernel (codegen/cpu/attention.py): query rows in blocks,
key tiles copied once per block, the score's dot product as a micro-GEMM. Odd sizes reach
every edge: sequences that end mid tile and mid block, blocks too short for the blocked form
(they take the row form), head dims that are not a multiple of the vector width, value widths
that differ from the key width, several batches and heads, masks, NaN and fully masked rows."""

import numpy as np
import pytest
import torch

import luminal as lm
import luminal.functional as F
from luminal.codegen.cpu import render_kernel
from luminal.compiler import kernel_ir as K
from luminal.compiler.lower import lower
from luminal.functional._base import iota
from luminal.graph import dtypes as dt
from luminal.graph import symbolic as sym


def _forms(g) -> set[str]:
    """Which forms the graph's attention kernels render in: 'blocked' (the micro-GEMM, with
    the row form for short blocks) or 'row' (the row form alone)."""
    low = lower(g)
    out = set()
    for kk in low.kernels:
        if any(isinstance(x, K.SoftmaxSum) for x in K.walk(kk.value)):
            src = render_kernel(kk, list(low.dims)).source
            out.add("blocked" if "st[jj][ri]" in src else "row")
    return out


def _inputs(shapes, dims, seed):
    rng = np.random.default_rng(seed)
    return {
        n: rng.standard_normal(tuple(int(sym.evaluate(x, dims)) for x in s)).astype(np.float32)
        for n, s in shapes.items()
    }


def _sdpa(xs, **kw):
    t = {n: torch.from_numpy(a) for n, a in xs.items()}
    mask = t.pop("m", None)
    return torch.nn.functional.scaled_dot_product_attention(
        t["q"], t["k"], t["v"], attn_mask=mask, **kw
    ).numpy()


@pytest.mark.parametrize(
    "batch,heads,d,dv,causal",
    [(2, 3, 40, 24, False), (1, 2, 80, 80, True), (2, 1, 64, 72, True), (1, 2, 17, 5, False)],
)
def test_odd_sizes_match_sdpa(batch, heads, d, dv, causal):
    L = sym.dim("L", 1, 300)
    g = lm.Graph("attention_blocked")
    shapes = {
        "q": (batch, heads, L, d),
        "k": (batch, heads, L, d),
        "v": (batch, heads, L, dv),
    }
    q, k, v = (g.input(n, s) for n, s in shapes.items())
    g.output("o", F.scaled_dot_product_attention(q, k, v, is_causal=causal))
    assert _forms(g) == {"blocked"}
    cg = lm.compile(g)
    # 1..21 (AVX-512): keys too few for a tile, the row form over keys computed once per
    # task; 22: the fewest keys of the blocked form; 64, 65, 67: a full block then 1 or 3
    # rows, 3 of them the row form; 133, 300: key tiles and query blocks both end mid way
    for seqv in (1, 3, 4, 5, 21, 22, 64, 65, 67, 133, 300):
        xs = _inputs(shapes, {"L": seqv}, seqv)
        out = cg.run(xs, L=seqv)["o"]
        np.testing.assert_allclose(out, _sdpa(xs, is_causal=causal), atol=3e-5, rtol=1e-4)


@pytest.mark.parametrize(
    "heads,kv_heads,d,dv,causal",
    [
        (4, 2, 24, 24, True),
        (2, 1, 72, 40, False),
        (3, 3, 128, 128, True),
        (2, 2, 80, 130, False),
        (4, 2, 32, 48, False),
    ],
)
def test_head_dims_tiles_and_blocks_end_mid_way(heads, kv_heads, d, dv, causal):
    # the blocked form's edges: key tiles (64 keys) and register blocks of rows (5) that end
    # mid way, query blocks (64 rows) taken in the interleaved order, value widths that are no
    # multiple of four vectors (130: a group of four, then the rest), shared key heads (GQA),
    # key and value tiles read in place (unit stride, whole vectors: 48) or copied (24, 40, 130);
    # the causal mask, else an additive float mask
    L = sym.dim("L", 1, 400)
    g = lm.Graph("attention_blocked_dims")
    shapes = {"q": (1, heads, L, d), "k": (1, kv_heads, L, d), "v": (1, kv_heads, L, dv)}
    if not causal:
        shapes["m"] = (L, L)
    ins = {n: g.input(n, s) for n, s in shapes.items()}
    gqa = heads != kv_heads
    kw = {"is_causal": True} if causal else {"attn_mask": ins["m"]}
    g.output(
        "o", F.scaled_dot_product_attention(ins["q"], ins["k"], ins["v"], enable_gqa=gqa, **kw)
    )
    assert _forms(g) == {"blocked"}
    cg = lm.compile(g)
    for seqv in (5, 6, 9, 47, 48, 49, 97, 130, 331):
        xs = _inputs(shapes, {"L": seqv}, seqv + d)
        if not causal:
            xs["m"][:, seqv // 3] = -np.inf  # one key masked for every row
            xs["m"][seqv // 2, 1:] = -np.inf  # one row left one key (the first)
        out = cg.run(xs, L=seqv)["o"]
        ref = _sdpa(xs, is_causal=causal, enable_gqa=gqa)
        np.testing.assert_allclose(out, ref, atol=5e-5, rtol=2e-4)


@pytest.mark.parametrize("window", [None, 70])
def test_index_masks_with_an_offset_and_a_window(window):
    # a KV cache's causal mask (key <= row + kv_len - q_len) and a sliding window beside it:
    # comparisons linear in the row and key, which whole tiles pass or fail (then evaluated
    # without them, or skipped), and tiles that hold the edge
    Q, L = sym.dim("Q", 1, 300), sym.dim("L", 1, 400)
    g = lm.Graph("attention_blocked_offset")
    q, k, v = g.input("q", (2, Q, 40)), g.input("k", (2, L, 40)), g.input("v", (2, L, 24))
    i, j = sym.index_var(0, Q), sym.index_var(1, L)
    off = sym.add(L, sym.mul(Q, -1))
    ok = sym.lt(j, sym.add(sym.add(i, off), 1))
    if window is not None:  # and row + off - key < window
        ok = sym.logical_and(ok, sym.lt(sym.add(sym.add(i, off), -window), j))
    mask = iota(g, (Q, L), ok).cast(dt.bool_)
    g.output("o", F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    assert _forms(g) == {"blocked"}
    cg = lm.compile(g)
    # 70 x 132: key offset 62, the first 64-key tile's last key one past row 0's last key
    for qv, lv in ((5, 5), (64, 64), (67, 200), (70, 132), (130, 131), (300, 400)):
        xs = _inputs({"q": (2, qv, 40), "k": (2, lv, 40), "v": (2, lv, 24)}, {}, qv + lv)
        ii, jj = np.arange(qv)[:, None], np.arange(lv)[None, :]
        keep = jj <= ii + lv - qv
        if window is not None:
            keep &= ii + lv - qv - window < jj
        m = np.where(keep, 0.0, -np.inf).astype(np.float32)
        out = cg.run(xs, Q=qv, L=lv)["o"]
        np.testing.assert_allclose(out, _sdpa({**xs, "m": m}), atol=3e-5, rtol=1e-4)


@pytest.mark.parametrize("keys", [97, 13])
def test_gqa_transposed_keys_and_float_mask(keys):
    # keys stored (d, seq) and read through a permute; 6 query heads share 2 key heads; 13
    # keys: the short row form (keys transposed once per task, dot products as vectors)
    g = lm.Graph("attention_blocked_gqa")
    q, kt, v = g.input("q", (6, 150, 32)), g.input("kt", (2, 32, keys)), g.input("v", (2, keys, 48))
    m = g.input("m", (150, keys))
    k = kt.permute(0, 2, 1)
    g.output("o", F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True))
    assert _forms(g) == {"blocked"}
    rng = np.random.default_rng(5)
    xs = {
        "q": rng.standard_normal((6, 150, 32)),
        "kt": rng.standard_normal((2, 32, keys)),
        "v": rng.standard_normal((2, keys, 48)),
        "m": rng.standard_normal((150, keys)),
    }
    xs = {n: a.astype(np.float32) for n, a in xs.items()}
    out = lm.compile(g).run(xs)["o"]
    ref = _sdpa(
        {"q": xs["q"], "k": xs["kt"].transpose(0, 2, 1).copy(), "v": xs["v"], "m": xs["m"]},
        enable_gqa=True,
    )
    np.testing.assert_allclose(out, ref, atol=3e-5, rtol=1e-4)


def test_masked_tiles_rows_and_nan_follow_the_naive_graph():
    # rows fully masked give NaN; a row masked over whole key tiles skips them and stays
    # exact; a NaN in one query row makes that row NaN and no other
    n, d = 150, 16
    g = lm.Graph("attention_blocked_masked")
    q, k, v = g.input("q", (n, d)), g.input("k", (n, d)), g.input("v", (n, 7))
    m = g.input("m", (n, n))
    g.output("o", F.softmax(q.matmul(k.transpose(-1, -2)).add(m), -1).matmul(v))
    assert _forms(g) == {"blocked"}
    rng = np.random.default_rng(7)
    xs = {
        "q": rng.standard_normal((n, d)),
        "k": rng.standard_normal((n, d)),
        "v": rng.standard_normal((n, 7)),
        "m": np.zeros((n, n)),
    }
    xs = {name: a.astype(np.float32) for name, a in xs.items()}
    xs["m"][3, :] = -np.inf  # in the first block
    xs["m"][140, :] = -np.inf  # in the last block, of 22 rows
    xs["m"][10, :130] = -np.inf  # the first two tiles, and part of the third, masked
    xs["m"][11, 5:] = -np.inf  # one key left
    xs["q"][70, 2] = np.nan
    out = lm.compile(g).run(xs)["o"]
    ref = g.run(xs)["o"]  # the reference interpreter on the naive graph
    np.testing.assert_allclose(out, ref, atol=2e-5, rtol=1e-4)
    assert np.isnan(out[[3, 70, 140]]).all()
    assert np.isfinite(np.delete(out, [3, 70, 140], axis=0)).all()


def test_scores_without_a_dot_product_keep_the_row_form():
    # a score that is no sum of products (an L1 distance) renders in the row form
    g = lm.Graph("attention_l1")
    q, k, v = g.input("q", (9, 6)), g.input("k", (11, 6)), g.input("v", (11, 4))
    diff = q.reshape(9, 1, 6).sub(k.reshape(1, 11, 6))
    s = diff.mul(diff).sqrt().sum(-1).mul(-1.0)
    g.output("o", F.softmax(s, -1).matmul(v))
    assert _forms(g) == {"row"}  # the score's reduce sums square roots, not products
    rng = np.random.default_rng(2)
    xs = {
        "q": rng.standard_normal((9, 6)),
        "k": rng.standard_normal((11, 6)),
        "v": rng.standard_normal((11, 4)),
    }
    xs = {name: a.astype(np.float32) for name, a in xs.items()}
    np.testing.assert_allclose(lm.compile(g).run(xs)["o"], g.run(xs)["o"], atol=2e-5, rtol=1e-4)


def test_decode_rows_read_a_computed_query_once_and_match_sdpa():
    """1-3 query rows against many keys (a decode step): the row form with the score's dot
    product, its query operand (here an expression, as RoPE is) computed once per row."""
    Q, L = sym.dim("Q", 1, 3), sym.dim("L", 1, 300)
    g = lm.Graph("attention_decode")
    shapes = {"q": (2, 3, Q, 24), "k": (2, 3, L, 24), "v": (2, 3, L, 20)}
    q, k, v = (g.input(n, s) for n, s in shapes.items())
    g.output("o", F.scaled_dot_product_attention(q.mul(0.5).add(0.25), k, v))
    low = lower(g)
    srcs = [
        render_kernel(kk, list(low.dims)).source
        for kk in low.kernels
        if any(isinstance(x, K.SoftmaxSum) for x in K.walk(kk.value))
    ]
    assert srcs and all("qrow[" in s for s in srcs)
    cg = lm.compile(g)
    for qv, lv in ((1, 1), (1, 133), (2, 37), (3, 300)):
        xs = _inputs(shapes, {"Q": qv, "L": lv}, qv * 1000 + lv)
        ref = {**xs, "q": xs["q"] * 0.5 + 0.25}
        out = cg.run(xs, Q=qv, L=lv)["o"]
        np.testing.assert_allclose(out, _sdpa(ref), atol=3e-5, rtol=1e-4)


def _skips(g) -> bool:
    low = lower(g)
    srcs = [
        render_kernel(kk, list(low.dims)).source
        for kk in low.kernels
        if any(isinstance(x, K.SoftmaxSum) for x in K.walk(kk.value))
    ]
    return any("if (dead) continue;" in s for s in srcs)


def test_tiles_masked_for_a_whole_block_are_skipped_and_results_stay():
    # a score monotone in its dot product (scale, additive mask) gets the tile skip: causal
    # blocks skip the keys past their last row; a block whose rows are all masked skips
    # every tile and gives NaN like the naive graph
    n, d = 200, 24
    g = lm.Graph("attention_skip")
    q, k, v = g.input("q", (n, d)), g.input("k", (n, d)), g.input("v", (n, 9))
    m = g.input("m", (n, n))
    g.output("o", F.softmax(q.matmul(k.transpose(-1, -2)).mul(0.2).add(m), -1).matmul(v))
    assert _forms(g) == {"blocked"} and _skips(g)
    rng = np.random.default_rng(11)
    xs = {name: rng.standard_normal(s).astype(np.float32) for name, s in
          (("q", (n, d)), ("k", (n, d)), ("v", (n, 9)))}  # fmt: skip
    causal = np.triu(np.full((n, n), -np.inf, np.float32), 1)
    xs["m"] = causal.copy()
    xs["m"][64:128, :] = -np.inf  # the second block of 64 rows: nothing left
    out = lm.compile(g).run(xs)["o"]
    ref = g.run(xs)["o"]
    assert np.isnan(out[64:128]).all() and np.isnan(ref[64:128]).all()
    keep = np.r_[0:64, 128:n]
    np.testing.assert_allclose(out[keep], ref[keep], atol=2e-5, rtol=1e-4)
    np.testing.assert_allclose(
        out[keep], _sdpa({**xs, "m": causal}, scale=0.2)[keep], atol=3e-5, rtol=1e-4
    )


def test_scores_not_monotone_in_the_dot_product_keep_every_tile():
    # a score that squares its dot product is not monotone in it: no skip
    g = lm.Graph("attention_square")
    q, k, v = g.input("q", (70, 16)), g.input("k", (70, 16)), g.input("v", (70, 8))
    qk = q.matmul(k.transpose(-1, -2))
    s = qk.mul(qk).mul(0.01)
    g.output("o", F.softmax(s, -1).matmul(v))
    assert _forms(g) == {"blocked"} and not _skips(g)
    rng = np.random.default_rng(4)
    xs = {name: rng.standard_normal(sh).astype(np.float32) for name, sh in
          (("q", (70, 16)), ("k", (70, 16)), ("v", (70, 8)))}  # fmt: skip
    np.testing.assert_allclose(lm.compile(g).run(xs)["o"], g.run(xs)["o"], atol=2e-5, rtol=1e-4)
