import math

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import luminal as lm
from luminal.functional import attention as A
from optest import BACKENDS, check_op, rand

seq = lm.dim("seq", 1, 4096)
pos = lm.dim("pos", 0, 4096)


def test_sdpa_basic():
    q, k, v = rand(2, 3, 5, 8), rand(2, 3, 7, 8), rand(2, 3, 7, 6)
    check_op(
        "scaled_dot_product_attention",
        A.scaled_dot_product_attention,
        TF.scaled_dot_product_attention,
        [q, k, v],
    )
    check_op(
        "scaled_dot_product_attention",
        lambda q, k, v: A.scaled_dot_product_attention(q, k, v, scale=0.3),
        lambda q, k, v: TF.scaled_dot_product_attention(q, k, v, scale=0.3),
        [q, k, v],
    )
    # 2-D inputs, non-contiguous (transposed) key
    check_op(
        "scaled_dot_product_attention",
        lambda q, k, v: A.scaled_dot_product_attention(q, k.permute(1, 0), v),
        lambda q, k, v: TF.scaled_dot_product_attention(q, k.T, v),
        [rand(4, 3), rand(3, 6), rand(6, 5)],
    )


@pytest.mark.parametrize("lq,lk", [(5, 5), (3, 7), (7, 3)])
def test_sdpa_causal(lq, lk):
    check_op(
        "scaled_dot_product_attention",
        lambda q, k, v: A.scaled_dot_product_attention(q, k, v, is_causal=True),
        lambda q, k, v: TF.scaled_dot_product_attention(q, k, v, is_causal=True),
        [rand(2, 2, lq, 8), rand(2, 2, lk, 8), rand(2, 2, lk, 8)],
    )


def test_sdpa_masks():
    q, k, v = rand(2, 3, 5, 8), rand(2, 3, 7, 8), rand(2, 3, 7, 8)
    fmask = rand(5, 7)
    fmask[:, 2] = -np.inf
    check_op(
        "scaled_dot_product_attention",
        lambda q, k, v, m: A.scaled_dot_product_attention(q, k, v, attn_mask=m),
        lambda q, k, v, m: TF.scaled_dot_product_attention(q, k, v, attn_mask=m),
        [q, k, v, fmask],
    )
    bmask = rand(2, 1, 5, 7, dtype=np.bool_)
    bmask[..., 0] = True  # no fully masked rows (torch gives NaN there)
    check_op(
        "scaled_dot_product_attention",
        lambda q, k, v, m: A.scaled_dot_product_attention(q, k, v, attn_mask=m),
        lambda q, k, v, m: TF.scaled_dot_product_attention(q, k, v, attn_mask=m),
        [q, k, v, bmask],
    )


def test_sdpa_gqa():
    q, k, v = rand(2, 6, 5, 8), rand(2, 2, 5, 8), rand(2, 2, 5, 4)
    check_op(
        "scaled_dot_product_attention",
        lambda q, k, v: A.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
        lambda q, k, v: TF.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
        [q, k, v],
    )
    m = rand(6, 5, 5)  # per-head float mask
    check_op(
        "scaled_dot_product_attention",
        lambda q, k, v, m: A.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True),
        lambda q, k, v, m: TF.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True),
        [q, k, v, m],
    )


def test_sdpa_symbolic_seq():
    def inputs(n: int) -> list:
        return [rand(1, 4, n, 16), rand(1, 2, n, 16), rand(1, 2, n, 16)]

    shp = [(1, 4, seq, 16), (1, 2, seq, 16), (1, 2, seq, 16)]
    check_op(
        "scaled_dot_product_attention",
        lambda q, k, v: A.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
        lambda q, k, v: TF.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
        inputs(7),
        shapes=shp,
        more=[inputs(1), inputs(300)],
        atol=1e-4,
    )


def test_sdpa_kv_cache_offset_mask():
    # decode-style: q_len = seq, kv_len = pos + seq; query i sees keys j <= pos + i
    def ref(q, k, v):
        lq, lk = q.shape[-2], k.shape[-2]
        m = torch.ones(lq, lk, dtype=torch.bool).tril(lk - lq)
        return TF.scaled_dot_product_attention(q, k, v, attn_mask=m)

    def fn(q, k, v):
        m = A.causal_mask(q.graph, q.shape[-2], k.shape[-2], offset=pos)
        return A.scaled_dot_product_attention(q, k, v, attn_mask=m)

    shp = [(2, seq, 8), (2, pos + seq, 8), (2, pos + seq, 8)]
    g = lm.Graph()
    q, k, v = (g.input(n, s) for n, s in zip("qkv", shp, strict=True))
    g.output("o", fn(q, k, v))
    for p, n in [(0, 5), (6, 1), (10, 3)]:
        xs = [rand(2, n, 8), rand(2, p + n, 8), rand(2, p + n, 8)]
        want = ref(*map(torch.from_numpy, xs)).numpy()
        for run in BACKENDS.values():
            got = run(g, dict(zip("qkv", xs, strict=True)), {"pos": p})["o"]
            np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-4)


def _ref_rope(positions: np.ndarray, d: int, base: float = 10000.0):
    inv = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    freqs = torch.from_numpy(positions).float()[..., None] * inv
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def _ref_rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def test_rotary_tables_and_apply():
    pos_arr = np.arange(3, 3 + 7, dtype=np.int32)
    cos, sin = _ref_rope(pos_arr, 16)
    check_op(
        "rope_cos_sin",
        lambda p: A.rope_cos_sin(p, 16),
        lambda p: _ref_rope(p.numpy(), 16),
        [pos_arr],
    )
    check_op("rotate_half", A.rotate_half, _ref_rotate_half, [rand(2, 3, 16)])
    x = rand(2, 4, 7, 16)
    check_op(
        "apply_rotary_emb",
        A.apply_rotary_emb,
        lambda x, c, s: x * c + _ref_rotate_half(x) * s,
        [x, cos.numpy(), sin.numpy()],
    )

    # interleaved pairs (GPT-J / Meta layout) against complex multiplication
    def ref_inter(x, c, s):
        xc = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
        rot = torch.polar(torch.ones_like(c[..., ::2]), torch.atan2(s[..., ::2], c[..., ::2]))
        return torch.view_as_real(xc * rot).reshape(x.shape)

    def fn_inter(x, p):
        c, s = A.rope_cos_sin(p, 16, interleaved=True)
        return A.apply_rotary_emb(x, c, s, interleaved=True)

    ci, si = _ref_rope(pos_arr, 16)
    ci, si = ci[:, :8].repeat_interleave(2, -1), si[:, :8].repeat_interleave(2, -1)
    check_op(
        "apply_rotary_emb", fn_inter, lambda x, p: ref_inter(x, ci, si), [x, pos_arr], atol=1e-5
    )


def test_rope_symbolic_offset_large_positions():
    d = 64

    def fn(x):
        p = A.rope_positions(x.graph, x.shape[-2], offset=pos)
        c, s = A.rope_cos_sin(p, d)
        return A.rotary_embedding(x, c, s)

    g = lm.Graph()
    x = g.input("x", (1, 2, seq, d))
    g.output("o", fn(x))
    for p, n in [(0, 1), (4000, 7), (17, 300)]:
        xs = rand(1, 2, n, d)
        c, s = _ref_rope(np.arange(p, p + n), d)
        want = torch.from_numpy(xs) * c + _ref_rotate_half(torch.from_numpy(xs)) * s
        for run in BACKENDS.values():
            got = run(g, {"x": xs}, {"pos": p})["o"]
            tol = 2e-5 * max(1, math.log2(p + n))
            np.testing.assert_allclose(got, want.numpy(), atol=tol, rtol=1e-4)


def test_rope_llama3_scaling():
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    inv = A._inv_freq(32, 500000.0, scaling)
    base = A._inv_freq(32, 500000.0, None)
    assert inv[0] == base[0] and np.isclose(inv[-1], base[-1] / 8)


def test_bad_attention():
    g = lm.Graph()
    q, k = g.input("q", (2, 4, 5, 8)), g.input("k", (2, 4, 5, 6))
    with pytest.raises(
        ValueError, match=r"scaled_dot_product_attention: query \(2, 4, 5, 8\) .* head dims 8 and 6"
    ):
        A.scaled_dot_product_attention(q, k, k)
    k3 = g.input("k3", (2, 3, 5, 8))
    with pytest.raises(ValueError, match="query heads 4 and key/value heads 3"):
        A.scaled_dot_product_attention(q, k3, k3, enable_gqa=True)
    k2 = g.input("k2", (2, 2, 5, 8))
    with pytest.raises(ValueError, match="enable_gqa=True"):
        A.scaled_dot_product_attention(q, k2, k2)
    with pytest.raises(ValueError, match="value .* sequence length"):
        A.scaled_dot_product_attention(q, q, g.input("v", (2, 4, 6, 8)))
    with pytest.raises(ValueError, match="attn_mask .* does not broadcast"):
        A.scaled_dot_product_attention(q, q, q, attn_mask=g.input("m", (3, 5)))
    with pytest.raises(ValueError, match="apply_rotary_emb"):
        A.apply_rotary_emb(q, g.input("c", (5, 4)), g.input("s", (5, 4)))


def test_sdpa_rows_masked_whole_are_zero():
    """A query row whose mask allows no key (a left-padded batch's pad rows) is 0, as
    PyTorch's safe softmax gives for a bool mask; a -inf or finfo.min bias on every key too,
    in the graph and in compiled plans (a finfo.min bias times softmax's log2 scale overflows
    f32 in the one-pass kernel). Rows with a key left are PyTorch's."""
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, 3, 5, 8)).astype(np.float32) for _ in range(3))
    allow = np.tril(np.ones((5, 5), bool))[None, None].repeat(2, 0)
    allow[0, :, 1] = False  # batch 0, query row 1: no key
    lowest = float(np.finfo(np.float32).min)
    for mask in (allow, np.where(allow, 0.0, -np.inf), np.where(allow, 0.0, lowest)):
        mask = mask.astype(allow.dtype if mask.dtype == bool else np.float32)
        g = lm.Graph("sdpa_empty_rows")
        ts = [g.input(n, (2, 3, 5, 8)) for n in "qkv"]
        m = g.input("m", mask.shape, "bool" if mask.dtype == bool else "f32")
        g.output("o", A.scaled_dot_product_attention(*ts, attn_mask=m))
        ins = {"q": q, "k": k, "v": v, "m": mask}
        for backend in BACKENDS:
            got = BACKENDS[backend](g, ins, {})["o"]
            assert np.isfinite(got).all(), backend
            np.testing.assert_array_equal(got[0, :, 1], 0.0)
            t = {n: torch.from_numpy(a) for n, a in ins.items()}
            ref = TF.scaled_dot_product_attention(t["q"], t["k"], t["v"], attn_mask=t["m"])
            live = allow[:, 0, :, :].any(-1)  # (2, 5)
            np.testing.assert_allclose(got[live[:, None, :].repeat(3, 1)],
                                       ref.numpy()[live[:, None, :].repeat(3, 1)],
                                       atol=1e-5, rtol=1e-5)  # fmt: skip
