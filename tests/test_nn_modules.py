import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import luminal as lm
from luminal import nn
from luminal.functional import attention as A
from optest import BACKENDS, rand

seq = lm.dim("seq", 1, 4096)
pos = lm.dim("pos", 0, 4096)
torch.manual_seed(0)


def run_module(mod, tmod, inputs, shapes=None, more=(), atol=1e-5, rtol=1e-4, **kw):
    """Load ``tmod``'s state dict into ``mod``, build one graph, compare on every input list."""
    mod.load_state_dict(tmod.state_dict())
    tmod.eval()
    g = lm.Graph(type(mod).__name__)
    xs = [
        g.input(f"x{i}", shapes[i] if shapes else a.shape, lm.graph.dtypes.to_dtype(a.dtype))
        for i, a in enumerate(inputs)
    ]
    out = mod(*xs, **kw)
    outs = out if isinstance(out, tuple) else (out,)
    for k, o in enumerate(outs):
        if o is not None:
            g.output(f"o{k}", o)
    g.verify()
    for arrays in [inputs, *more]:
        with torch.no_grad():
            want = tmod(*[torch.from_numpy(a) for a in arrays], **kw)
        want = want if isinstance(want, tuple) else (want,)
        for run in BACKENDS.values():
            got = run(g, {f"x{i}": a for i, a in enumerate(arrays)}, {})
            for k, w in enumerate(want):
                if w is not None:
                    np.testing.assert_allclose(got[f"o{k}"], w.numpy(), atol=atol, rtol=rtol)
    return g


def test_linear_and_names():
    m = nn.Linear(50, 7)
    assert [k for k, _ in m.named_parameters()] == ["weight", "bias"]
    run_module(m, torch.nn.Linear(50, 7), [rand(2, 3, 50)])
    run_module(
        nn.Linear(16, 4, bias=False),
        torch.nn.Linear(16, 4, bias=False),
        [rand(7, 16)],
        shapes=[(seq, 16)],
        more=[[rand(1, 16)], [rand(300, 16)]],
    )


def test_sequential_and_activations():
    acts = [
        (nn.ReLU(), torch.nn.ReLU()),
        (nn.GELU(), torch.nn.GELU()),
        (nn.GELU("tanh"), torch.nn.GELU("tanh")),
        (nn.SiLU(), torch.nn.SiLU()),
        (nn.Tanh(), torch.nn.Tanh()),
        (nn.Sigmoid(), torch.nn.Sigmoid()),
        (nn.Dropout(0.2), torch.nn.Dropout(0.2)),
        (nn.Identity(), torch.nn.Identity()),
    ]
    for a, ta in acts:
        m = nn.Sequential(nn.Linear(5, 8), a, nn.Linear(8, 3), nn.Softmax(-1))
        tm = torch.nn.Sequential(
            torch.nn.Linear(5, 8), ta, torch.nn.Linear(8, 3), torch.nn.Softmax(-1)
        )
        run_module(m, tm, [rand(4, 5, low=-4, high=4)])
    assert list(m.state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert m[0].weight.name == "0.weight" and len(m) == 4


def test_embedding_layernorm_rmsnorm_groupnorm():
    idx = np.array([[0, 3, 9], [9, 9, 1]], dtype=np.int64)
    run_module(nn.Embedding(10, 6), torch.nn.Embedding(10, 6), [idx])
    ln, tln = nn.LayerNorm(50), torch.nn.LayerNorm(50)
    with torch.no_grad():
        tln.weight.normal_(), tln.bias.normal_()
    run_module(ln, tln, [rand(7, 50)], shapes=[(seq, 50)], more=[[rand(1, 50)], [rand(300, 50)]])
    rn, trn = nn.RMSNorm(16, eps=1e-6), torch.nn.RMSNorm(16, eps=1e-6)
    with torch.no_grad():
        trn.weight.normal_()
    run_module(rn, trn, [rand(3, 16)])
    run_module(nn.GroupNorm(2, 6), torch.nn.GroupNorm(2, 6), [rand(2, 6, 5)])


def test_conv_batchnorm():
    m = nn.Sequential(
        nn.Conv2d(3, 8, 3, stride=2, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 4, (1, 3), groups=4, bias=False),
        nn.Flatten(),
    )
    tm = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, stride=2, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.Conv2d(8, 4, (1, 3), groups=4, bias=False),
        torch.nn.Flatten(),
    )
    with torch.no_grad():
        tm[1].running_mean.normal_(), tm[1].running_var.uniform_(0.5, 2), tm[1].weight.normal_()
    assert "1.num_batches_tracked" in m.state_dict()
    run_module(m, tm, [rand(2, 3, 9, 11)], atol=1e-4)
    c1 = nn.Conv1d(4, 6, 3, padding="same")
    run_module(
        c1,
        torch.nn.Conv1d(4, 6, 3, padding="same"),
        [rand(2, 4, 7)],
        shapes=[(2, 4, seq)],
        more=[[rand(2, 4, 1)], [rand(2, 4, 300)]],
        atol=1e-4,
    )


@pytest.mark.parametrize("batch_first", [False, True])
def test_multihead_attention(batch_first):
    e, h = 16, 4
    m, tm = (
        nn.MultiheadAttention(e, h, batch_first=batch_first),
        torch.nn.MultiheadAttention(e, h, batch_first=batch_first),
    )
    with torch.no_grad():
        tm.in_proj_bias.normal_()
    shp = (2, 5, e) if batch_first else (5, 2, e)
    kshp = (2, 7, e) if batch_first else (7, 2, e)
    q, kv = rand(*shp), rand(*kshp)
    run_module(m, tm, [q, kv, kv], atol=1e-4)
    run_module(m, tm, [q, kv, kv], need_weights=False, atol=1e-4)
    amask = rand(5, 7, dtype=np.bool_)
    amask[:, 0] = False
    kpm = np.zeros((2, 7), dtype=np.bool_)
    kpm[1, 5:] = True

    def fn_mask(mod, tmod):
        return run_module(mod, tmod, [q, kv, kv, amask, kpm], average_attn_weights=False, atol=1e-4)

    class WithMasks(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, q, k, v, am, kp, **kw):
            return self.inner(q, k, v, attn_mask=am, key_padding_mask=kp, **kw)

    class LWithMasks(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, q, k, v, am, kp, **kw):
            return self.inner(q, k, v, attn_mask=am, key_padding_mask=kp, **kw)

    fn_mask(LWithMasks(m), WithMasks(tm))


def test_mha_self_attention_symbolic_and_unbatched():
    e, h = 8, 2
    m, tm = (
        nn.MultiheadAttention(e, h, batch_first=True),
        torch.nn.MultiheadAttention(e, h, batch_first=True),
    )

    class Self(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = m

        def forward(self, x):
            return self.attn(x, x, x, need_weights=False, is_causal=True, attn_mask=None)[0]

    class TSelf(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = tm

        def forward(self, x):
            n = x.shape[-2]
            mask = torch.ones(n, n, dtype=torch.bool).triu(1)
            return self.attn(x, x, x, need_weights=False, attn_mask=mask)[0]

    run_module(
        Self(),
        TSelf(),
        [rand(2, 7, e)],
        shapes=[(2, seq, e)],
        more=[[rand(2, 1, e)], [rand(2, 300, e)]],
        atol=1e-4,
    )
    run_module(m, tm, [rand(5, e), rand(6, e), rand(6, e)], atol=1e-4)


# ----------------------------------------------------------------------------- Llama-style block


def _rope_ref(x, cos, sin):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return x * cos + torch.cat((-x2, x1), -1) * sin


class TorchBlock(torch.nn.Module):
    """A hand-written Llama decoder layer (HF names) as the reference."""

    def __init__(self, dim, n_heads, n_kv, hidden):
        super().__init__()
        hd = dim // n_heads
        self.n_heads, self.n_kv, self.hd = n_heads, n_kv, hd
        self.input_layernorm = torch.nn.RMSNorm(dim, eps=1e-5)
        self.post_attention_layernorm = torch.nn.RMSNorm(dim, eps=1e-5)
        self.self_attn = torch.nn.Module()
        for n, (i, o) in {
            "q_proj": (dim, n_heads * hd),
            "k_proj": (dim, n_kv * hd),
            "v_proj": (dim, n_kv * hd),
            "o_proj": (n_heads * hd, dim),
        }.items():
            setattr(self.self_attn, n, torch.nn.Linear(i, o, bias=False))
        self.mlp = torch.nn.Module()
        for n, (i, o) in {
            "gate_proj": (dim, hidden),
            "up_proj": (dim, hidden),
            "down_proj": (hidden, dim),
        }.items():
            setattr(self.mlp, n, torch.nn.Linear(i, o, bias=False))
        for p in self.parameters():
            torch.nn.init.normal_(p, std=0.3)

    def attn(self, x, cos, sin, past):
        b, n, _ = x.shape
        a = self.self_attn
        q = a.q_proj(x).view(b, n, self.n_heads, self.hd).transpose(1, 2)
        k = a.k_proj(x).view(b, n, self.n_kv, self.hd).transpose(1, 2)
        v = a.v_proj(x).view(b, n, self.n_kv, self.hd).transpose(1, 2)
        q, k = _rope_ref(q, cos, sin), _rope_ref(k, cos, sin)
        if past is not None:
            k, v = torch.cat((past[0], k), -2), torch.cat((past[1], v), -2)
        s = k.shape[-2]
        mask = torch.ones(n, s, dtype=torch.bool).tril(s - n)
        o = TF.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return a.o_proj(o.transpose(1, 2).reshape(b, n, -1)), (k, v)

    def forward(self, x, cos, sin, past=None):
        a, kv = self.attn(self.input_layernorm(x), cos, sin, past)
        h = x + a
        m = self.mlp
        return h + m.down_proj(
            TF.silu(m.gate_proj(self.post_attention_layernorm(h)))
            * m.up_proj(self.post_attention_layernorm(h))
        ), kv


def _tables(p0, n, hd):
    inv = 1.0 / (10000.0 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    f = torch.arange(p0, p0 + n, dtype=torch.float32)[:, None] * inv
    emb = torch.cat((f, f), -1)
    return emb.cos(), emb.sin()


def test_transformer_block_symbolic_seq():
    dim, nh, nkv, hidden, hd = 32, 4, 2, 48, 8
    tb = TorchBlock(dim, nh, nkv, hidden)
    blk = nn.TransformerBlock(dim, nh, nkv, hidden)
    blk.load_state_dict(tb.state_dict())
    assert set(blk.state_dict()) == set(tb.state_dict())
    g = lm.Graph("block")
    x = g.input("x", (2, seq, dim))
    cos, sin = A.rope_cos_sin(A.rope_positions(g, seq), hd)
    g.output("y", blk(x, cos, sin))
    g.verify()
    for n in (1, 7, 300):
        xs = rand(2, n, dim)
        c, s = _tables(0, n, hd)
        with torch.no_grad():
            want = tb(torch.from_numpy(xs), c, s)[0].numpy()
        for run in BACKENDS.values():
            np.testing.assert_allclose(run(g, {"x": xs}, {})["y"], want, atol=2e-4, rtol=1e-4)


def test_transformer_block_kv_cache():
    dim, nh, nkv, hidden, hd = 16, 4, 1, 24, 4
    tb = TorchBlock(dim, nh, nkv, hidden)
    blk = nn.TransformerBlock(dim, nh, nkv, hidden)
    blk.load_state_dict(tb.state_dict())
    g = lm.Graph("decode")
    x = g.input("x", (1, seq, dim))
    cache = nn.KVCache(g.input("k_past", (1, nkv, pos, hd)), g.input("v_past", (1, nkv, pos, hd)))
    cos, sin = A.rope_cos_sin(A.rope_positions(g, seq, offset=pos), hd)
    g.output("y", blk(x, cos, sin, cache=cache))
    assert cache.k is not None and cache.v is not None
    g.output("k", cache.k)
    g.output("v", cache.v)
    past_k, past_v = np.zeros((1, nkv, 0, hd), np.float32), np.zeros((1, nkv, 0, hd), np.float32)
    tpast = None
    p = 0
    for n in (5, 1, 3):  # prefill then decode steps through one graph
        xs = rand(1, n, dim)
        c, s = _tables(p, n, hd)
        with torch.no_grad():
            want, tpast = tb(torch.from_numpy(xs), c, s, tpast)
        for run in BACKENDS.values():
            got = run(g, {"x": xs, "k_past": past_k, "v_past": past_v}, {"pos": p})
            np.testing.assert_allclose(got["y"], want.numpy(), atol=2e-4, rtol=1e-4)
            np.testing.assert_allclose(got["k"], tpast[0].numpy(), atol=1e-5)
        past_k, past_v, p = got["k"], got["v"], p + n


def test_gelu_mlp_layernorm_block_names():
    blk = nn.TransformerBlock(8, 2, mlp="gelu", norm="layer", bias=True, hidden_dim=16)
    names = list(blk.state_dict())
    assert (
        "mlp.fc1.weight" in names
        and "input_layernorm.bias" in names
        and "self_attn.q_proj.bias" in names
    )
    g = lm.Graph()
    x = g.input("x", (1, seq, 8))
    g.output("y", blk(x))  # no RoPE tables: plain causal attention, default-initialized weights
    y = g.run({"x": rand(1, 5, 8)})["y"]
    assert y.shape == (1, 5, 8) and np.isfinite(y).all()
    # calling twice in one graph reuses the same weights
    g.output("y2", blk(x))
    assert sum(1 for k in g.inputs if k.endswith("fc1.weight")) == 1


def test_state_dict_errors():
    m = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4))
    sd = {k: np.asarray(v) for k, v in m.state_dict().items()}
    bad = dict(sd)
    bad["0.weight"] = np.zeros((3, 4), np.float32)
    with pytest.raises(
        ValueError, match=r"shape mismatch for '0.weight': expected \(4, 3\), got \(3, 4\)"
    ):
        m.load_state_dict(bad)
    with pytest.raises(ValueError, match=r"missing keys: \['1.bias'\]"):
        m.load_state_dict({k: v for k, v in sd.items() if k != "1.bias"})
    with pytest.raises(ValueError, match=r"unexpected keys: \['2.weight'\]"):
        m.load_state_dict({**sd, "2.weight": np.zeros(1)})
    res = m.load_state_dict({"0.weight": sd["0.weight"], "extra": np.zeros(1)}, strict=False)
    assert "1.weight" in res.missing_keys and res.unexpected_keys == ["extra"]
    # dtype conversion on load, and to()
    m.load_state_dict({k: v.astype(np.float64) for k, v in sd.items()})
    assert m[0].weight.data.dtype == np.float32
    m.to(lm.f16)
    assert m[0].weight.data.dtype == np.float16 and m[0].weight.dtype is lm.f16


def test_module_bad_inputs():
    g = lm.Graph()
    with pytest.raises(ValueError, match=r"linear: input \(2, 5\) and weight \(4, 3\)"):
        nn.Linear(3, 4)(g.input("x", (2, 5)))
    with pytest.raises(ValueError, match="conv2d: input .* with 4 channels"):
        g2 = lm.Graph()
        nn.Conv2d(3, 8, 3)(g2.input("img", (1, 4, 8, 8)))
    with pytest.raises(
        ValueError, match="Conv2d: in_channels 3 and out_channels 8 must be divisible by groups 2"
    ):
        nn.Conv2d(3, 8, 3, groups=2)
    with pytest.raises(ValueError, match="MultiheadAttention: embed_dim 10 is not divisible"):
        nn.MultiheadAttention(10, 3)
    with pytest.raises(ValueError, match="MultiheadAttention: query shape"):
        nn.MultiheadAttention(8, 2)(*(g.input(n, (3, 2, 6)) for n in "qkv"))
    with pytest.raises(ValueError, match="Attention: n_heads 4 is not divisible by n_kv_heads 3"):
        nn.Attention(16, 4, 3)
    # a parameter whose name is taken by a different graph input
    g.input("w_clash", (4, 3))
    p = nn.Parameter((5,))
    p.name = "w_clash"
    with pytest.raises(ValueError, match="already has a different input"):
        p.bind(g)


def test_repr():
    m = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
    r = repr(m)
    assert "(0): Linear(in_features=3, out_features=4, bias=True)" in r and "(1): ReLU()" in r
