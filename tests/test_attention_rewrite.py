"""The online-softmax rewrite (compiler/attention.py): naive attention written with the
primitives compiles to one pass over the keys, with no (seq x seq) buffer in the plan."""

import numpy as np
import pytest
import torch

import luminal as lm
import luminal.functional as F
from luminal.compiler import kernel_ir as K
from luminal.compiler.lower import lower
from luminal.graph import symbolic as sym


def _naive(g, q, k, v, scale):
    # written out by hand: QK^T, scale, softmax, times V
    s = q.matmul(k.transpose(-1, -2)).mul(scale)
    return F.softmax(s, -1).matmul(v)


def _run(g, shapes, dims=None, seed=0):
    rng = np.random.default_rng(seed)
    dims = dims or {}
    xs = {
        n: rng.standard_normal(tuple(int(sym.evaluate(x, dims)) for x in s)).astype(np.float32)
        for n, s in shapes.items()
    }
    return xs, lm.compile(g).run(xs, **dims)["o"]


def _no_square_buffer(cg_plan_buffers, seq):
    for b in cg_plan_buffers:
        numel = 1
        for s in b.shape:
            numel *= int(s) if isinstance(s, int) else 1
        assert numel < seq * seq, f"buffer {b.name} {b.shape} holds a seq x seq matrix"


def test_naive_attention_seq2048_is_one_pass_and_matches_sdpa():
    seq, d, heads = 2048, 64, 2
    g = lm.Graph("attention")
    q, k, v = (g.input(n, (heads, seq, d)) for n in "qkv")
    g.output("o", _naive(g, q, k, v, 1 / np.sqrt(d)))
    low = lower(g)
    assert any(isinstance(x, K.SoftmaxSum) for kk in low.kernels for x in K.walk(kk.value))
    _no_square_buffer(low.buffers, seq)
    xs, out = _run(g, {n: (heads, seq, d) for n in "qkv"})
    ref = torch.nn.functional.scaled_dot_product_attention(
        *(torch.from_numpy(xs[n]) for n in "qkv")
    ).numpy()
    np.testing.assert_allclose(out, ref, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("causal", [False, True])
def test_symbolic_seq_and_causal(causal):
    L = sym.dim("L", 1, 300)
    g = lm.Graph("attention_sym")
    q, k, v = (g.input(n, (3, L, 16)) for n in "qkv")
    g.output("o", F.scaled_dot_product_attention(q, k, v, is_causal=causal))
    low = lower(g)
    assert len(low.kernels) == 1
    for seqv in (1, 50, 299):
        xs, out = _run(g, {n: (3, L, 16) for n in "qkv"}, {"L": seqv}, seed=seqv)
        ref = torch.nn.functional.scaled_dot_product_attention(
            *(torch.from_numpy(xs[n]) for n in "qkv"), is_causal=causal
        ).numpy()
        np.testing.assert_allclose(out, ref, atol=2e-5, rtol=1e-4)


def test_gqa_float_mask_and_odd_value_width():
    g = lm.Graph("attention_gqa")
    q, k, v = g.input("q", (6, 33, 16)), g.input("k", (2, 50, 16)), g.input("v", (2, 50, 23))
    m = g.input("m", (33, 50))
    g.output("o", F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True))
    xs, out = _run(g, {"q": (6, 33, 16), "k": (2, 50, 16), "v": (2, 50, 23), "m": (33, 50)})
    t = {n: torch.from_numpy(a) for n, a in xs.items()}
    ref = torch.nn.functional.scaled_dot_product_attention(
        t["q"], t["k"], t["v"], attn_mask=t["m"], enable_gqa=True
    ).numpy()
    np.testing.assert_allclose(out, ref, atol=2e-5, rtol=1e-4)


def test_fully_masked_rows_and_infinities_follow_the_naive_graph():
    # a row whose mask is all -inf gives NaN, as the naive softmax does
    g = lm.Graph("masked")
    q, k, v = g.input("q", (4, 8)), g.input("k", (5, 8)), g.input("v", (5, 3))
    m = g.input("m", (4, 5))
    g.output("o", F.softmax(q.matmul(k.transpose(-1, -2)).add(m), -1).matmul(v))
    rng = np.random.default_rng(3)
    xs = {
        "q": rng.standard_normal((4, 8)),
        "k": rng.standard_normal((5, 8)),
        "v": rng.standard_normal((5, 3)),
        "m": np.zeros((4, 5)),
    }
    xs = {n: a.astype(np.float32) for n, a in xs.items()}
    xs["m"][1, :] = -np.inf
    xs["m"][2, 1:] = -np.inf
    out = lm.compile(g).run(xs)["o"]
    ref = g.run(xs)["o"]  # the reference interpreter on the naive graph
    np.testing.assert_allclose(out, ref, atol=1e-5, rtol=1e-5)
    assert np.isnan(out[1]).all() and np.isfinite(out[2]).all()


def test_weights_used_elsewhere_keep_the_naive_form():
    # the attention probabilities are an output too: the rule's premises fail, nothing fuses
    g = lm.Graph("probs_out")
    q, k, v = g.input("q", (5, 7)), g.input("k", (9, 7)), g.input("v", (9, 3))
    p = F.softmax(q.matmul(k.transpose(-1, -2)), -1)
    g.output("p", p)
    g.output("o", p.matmul(v))
    low = lower(g)
    assert not any(isinstance(x, K.SoftmaxSum) for kk in low.kernels for x in K.walk(kk.value))


def test_gated_attention_keeps_its_kernel():
    """An elementwise op on the attention output (a sigmoid gate, as gated-attention models
    apply before the output projection) leaves the softmax-weighted sum matched (the e-graph
    moves the scale under the row max's broadcast there) and in a kernel of its own, where the
    attention code path runs; the gate and the projection come after it."""
    seq, d, heads, n = 300, 24, 3, 17
    g = lm.Graph("gated")
    q, k, v, gate = (g.input(name, (heads, seq, d)) for name in ("q", "k", "v", "gate"))
    o = _naive(g, q, k, v, 1 / np.sqrt(d)) * F.sigmoid(gate)
    w = g.input("w", (n, heads * d))
    g.output("o", F.linear(o.permute(1, 0, 2).reshape(seq, heads * d), w))
    from luminal.compiler.pipeline import graph_passes

    low = lower(graph_passes(g))
    tops = [kk for kk in low.kernels if any(isinstance(x, K.SoftmaxSum) for x in K.walk(kk.value))]
    assert len(tops) == 1 and isinstance(tops[0].value, K.SoftmaxSum)
    _no_square_buffer(low.buffers, seq)
    shapes = {name: (heads, seq, d) for name in ("q", "k", "v", "gate")} | {"w": (n, heads * d)}
    xs, out = _run(g, shapes)
    t = {name: torch.from_numpy(x) for name, x in xs.items()}
    att = torch.nn.functional.scaled_dot_product_attention(t["q"], t["k"], t["v"])
    ref = (att * torch.sigmoid(t["gate"])).permute(1, 0, 2).reshape(seq, -1) @ t["w"].T
    np.testing.assert_allclose(out, ref.numpy(), atol=1e-4, rtol=1e-4)


def test_mask_added_with_heads_split_off_the_batch_axis():
    """Scores (batch*heads, L, S) reshaped to (batch, heads, L, S) to add a mask and back
    (XGLM's and other bmm-based attentions): the one-pass form reads the scores through that
    reshape, each element where the reshape puts it."""
    b, h, lq, s, d = 2, 3, 9, 13, 8
    g = lm.Graph("attention_split_heads")
    q, k, v = g.input("q", (b * h, lq, d)), g.input("k", (b * h, s, d)), g.input("v", (b * h, s, d))
    m = g.input("m", (b, 1, lq, s))
    scores = q.matmul(k.transpose(1, 2)).reshape(b, h, lq, s).add(m).reshape(b * h, lq, s)
    g.output("o", F.softmax(scores, -1).matmul(v))
    assert any(isinstance(x, K.SoftmaxSum) for kk in lower(g).kernels for x in K.walk(kk.value))
    xs, out = _run(g, {"q": (b * h, lq, d), "k": (b * h, s, d), "v": (b * h, s, d),
                       "m": (b, 1, lq, s)})  # fmt: skip
    t = {n: torch.from_numpy(a).double() for n, a in xs.items()}
    sc = (t["q"] @ t["k"].transpose(1, 2)).reshape(b, h, lq, s) + t["m"]
    ref = (torch.softmax(sc.reshape(b * h, lq, s), -1) @ t["v"]).numpy()
    np.testing.assert_allclose(out, ref, atol=2e-5, rtol=1e-4)
