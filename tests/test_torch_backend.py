"""torch.compile(model, backend="luminal") against eager PyTorch.

Each test compiles once and then changes batch size and sequence length; the backend's compile
counter must not move (dynamic torch sizes map to luminal dims). Kernel builds are cached on
disk, so a second run of this file is much faster than the first.
"""

import importlib.metadata
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import luminal.torch_backend as lt  # noqa: E402
from luminal.torch_backend import luminal_backend  # noqa: E402
from torch_models import Block, SmallCNN  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    lt.reset_stats()
    torch.manual_seed(0)
    yield
    torch._dynamo.reset()


def _check(model, calls, *, dynamic=True, key=None, atol=1e-4, rtol=1e-4, grad=False,
           strides=False, **kw):  # fmt: skip
    """Run ``model`` compiled and eager on each call's kwargs; return the compiled outputs."""
    f = torch.compile(model, backend=luminal_backend, dynamic=dynamic, **kw)
    outs = []
    ctx = torch.enable_grad() if grad else torch.no_grad()
    with ctx:
        for args in calls:
            got, want = f(**args), model(**args)
            if key is not None:
                got, want = got[key], want[key]
            torch.testing.assert_close(got, want, atol=atol, rtol=rtol)
            if strides:  # views of outputs are replayed with as_strided: layouts must match
                pairs = zip(got, want, strict=True)
                assert all(a.stride() == b.stride() for a, b in pairs if a.numel() > 1)
            outs.append(got)
    return outs


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(12, 50), nn.GELU(), nn.Linear(50, 50), nn.SiLU(),
                                 nn.LayerNorm(50), nn.Linear(50, 3))  # fmt: skip

    def forward(self, x):
        return self.net(x).softmax(-1)


def test_mlp_dynamic_batch_one_compile():
    m = MLP().eval()
    _check(m, [dict(x=torch.randn(b, 12)) for b in (3, 7, 50)])
    assert lt.stats.compiles == 1
    assert lt.stats.plans == 1
    assert lt.stats.eager_ops == {}


def test_mlp_automatic_dynamic_recompiles_once():
    # dynamo compiles static first, then once more with the changed size dynamic
    m = MLP().eval()
    _check(m, [dict(x=torch.randn(b, 12)) for b in (3, 7, 50, 9)], dynamic=None)
    assert lt.stats.compiles == 2


def test_outputs_share_memory_and_keep_dtype():
    m = nn.Linear(4, 3).eval()
    (y,) = _check(m, [dict(input=torch.randn(5, 4))])
    assert y.dtype == torch.float32 and y.shape == (5, 3) and y.is_contiguous()


def test_output_layouts_and_aliases():
    # AOTAutograd rebuilds views of outputs with as_strided: layouts must be torch's
    class Views(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(4, 5), requires_grad=False)

        def forward(self, x):
            y = x * 2
            z = torch.ones(3).expand(x.shape[0], 3)
            return (y, y[:, ::2], y.unsqueeze(0).expand(2, -1, -1), self.w.t(), z,
                    x.permute(1, 0)[1:], (x + 1).t()[::2])  # fmt: skip

    _check(Views(), [dict(x=torch.randn(b, 4)) for b in (3, 6)], strides=True)
    assert lt.stats.compiles == 1 and lt.stats.eager_ops == {}


def test_cnn_dynamic_batch():
    m = SmallCNN().eval()
    with torch.no_grad():  # non-trivial running stats
        for bn in (m.features[1], m.features[5]):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
    calls = [dict(x=torch.randn(b, 3, 16, 16)) for b in (2, 5, 3)]
    torch._dynamo.mark_dynamic(calls[0]["x"], 0)
    _check(m, calls, dynamic=None)
    assert lt.stats.compiles == 1
    assert lt.stats.eager_ops == {}


def test_transformer_block_dynamic_batch_and_seq():
    m = Block().eval()
    _check(m, [dict(x=torch.randn(b, s, 32)) for b, s in ((2, 5), (3, 11), (4, 2))])
    assert lt.stats.compiles == 1
    assert lt.stats.eager_ops == {}


def test_sdpa_block():
    class Attn(nn.Module):
        def forward(self, q, k, v):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    _check(Attn(), [dict(q=torch.randn(2, 4, s, 8), k=torch.randn(2, 4, s, 8),
                         v=torch.randn(2, 4, s, 8)) for s in (3, 9)])  # fmt: skip
    assert lt.stats.compiles == 1
    assert lt.stats.eager_ops == {}


# ----------------------------------------------------------------------------- transformers
def _tiny(kind: str, attn: str):
    tf = pytest.importorskip("transformers")
    common = dict(vocab_size=100, attn_implementation=attn)
    if kind == "llama":
        cfg = tf.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=128, **common)  # fmt: skip
        return tf.LlamaForCausalLM(cfg).eval(), "logits", {"use_cache": False}
    if kind == "gpt2":
        cfg = tf.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=128, bos_token_id=0,
                            eos_token_id=0, **common)  # fmt: skip
        return tf.GPT2LMHeadModel(cfg).eval(), "logits", {"use_cache": False}
    cfg = tf.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=128, **common)  # fmt: skip
    return tf.BertModel(cfg).eval(), "last_hidden_state", {}


@pytest.mark.parametrize(
    "kind,attn",
    [("llama", "eager"), ("gpt2", "sdpa"), ("bert", "eager"),
     pytest.param("llama", "sdpa", marks=pytest.mark.slow),
     pytest.param("gpt2", "eager", marks=pytest.mark.slow),
     pytest.param("bert", "sdpa", marks=pytest.mark.slow)],
)  # fmt: skip
def test_transformers_models(kind, attn):
    m, key, extra = _tiny(kind, attn)
    calls = []
    for b, s in ((2, 5), (3, 9), (4, 16)):
        ids = torch.randint(0, 100, (b, s))
        mask = torch.ones(b, s, dtype=torch.long)
        mask[0, : s // 2] = 0 if kind == "bert" else 1  # padding in BERT's mask
        calls.append(dict(input_ids=ids, attention_mask=mask, **extra))
    _check(m, calls, key=key, atol=1e-4, rtol=1e-4)
    assert lt.stats.compiles == 1, "changing batch and sequence length must not recompile"
    assert lt.stats.eager_ops == {}


# ----------------------------------------------------------------------------- fallbacks
class WithHermite(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 2)

    def forward(self, x):
        h = self.a(x).relu()
        return self.b(torch.special.hermite_polynomial_h(h, h)) + h.sum(-1, keepdim=True)


def test_unsupported_op_runs_eager_with_one_warning():
    m = WithHermite().eval()
    with pytest.warns(RuntimeWarning, match=r"aten\.special_hermite_polynomial_h\.default") as rec:
        _check(m, [dict(x=torch.randn(b, 8)) for b in (3, 6, 4)])
    assert sum("aten.special_hermite_polynomial_h" in str(w.message) for w in rec) == 1
    assert lt.stats.eager_ops == {"aten.special_hermite_polynomial_h.default": 1}
    assert lt.stats.partitions == 2  # the linear before the polynomial and the one after it
    assert lt.stats.compiles == 1


def test_builtin_transformer_layer_fast_path_falls_back():
    # nn.TransformerEncoderLayer under no_grad calls one fused kernel luminal does not convert
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True).eval()
    with pytest.warns(RuntimeWarning, match="_transformer_encoder_layer_fwd"):
        _check(layer, [dict(src=torch.randn(2, s, 16)) for s in (3, 7)])
    assert lt.stats.compiles == 1


def test_training_graph_compiles_forward_and_backward():
    import copy

    m = MLP()  # requires_grad parameters, grad mode on
    ref = copy.deepcopy(m)
    x = torch.randn(4, 12)
    f = torch.compile(m, backend=luminal_backend)
    f(x).sum().backward()
    ref(x).sum().backward()
    for p, q in zip(m.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4)
    assert lt.stats.compiles >= 1 and not lt.stats.eager_ops


def test_inference_mode_and_changed_weights():
    m = MLP().eval()
    f = torch.compile(m, backend=luminal_backend, dynamic=True)
    x = torch.randn(5, 12)
    with torch.inference_mode():
        torch.testing.assert_close(f(x), m(x), atol=1e-5, rtol=1e-4)
    with torch.no_grad():
        m.net[0].weight.mul_(-2.0)  # in place: the plan's copy of the weights is now stale
        torch.testing.assert_close(f(x), m(x), atol=1e-5, rtol=1e-4)
    assert lt.stats.plans == 2


def test_symint_outputs_and_buffer_mutation():
    class Counter(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("calls", torch.zeros(()))

        def forward(self, x):
            self.calls += 1
            return x * 2 + self.calls, x.shape[0] * 3

    m = Counter()
    f = torch.compile(Counter(), backend=luminal_backend, dynamic=True)
    with torch.no_grad():
        for b in (2, 5):
            x = torch.randn(b, 3)
            (y, n), (ey, en) = f(x), m(x)
            torch.testing.assert_close(y, ey)
            assert n == en


def test_dtypes_bf16_and_int():
    class Mixed(nn.Module):
        def forward(self, x, ids):
            return (x * 2).to(torch.float32).sum(-1) + ids.float(), ids * 3 + 1

    calls = [dict(x=torch.randn(b, 4).to(torch.bfloat16), ids=torch.arange(b)) for b in (2, 6)]
    _check(Mixed(), calls, atol=1e-2, rtol=1e-2)


# ----------------------------------------------------------------------------- packaging
def test_import_luminal_does_not_import_torch():
    code = "import sys, luminal; assert 'torch' not in sys.modules, 'luminal imported torch'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_entry_point_registers_backend():
    eps = importlib.metadata.entry_points(group="torch_dynamo_backends")
    if "luminal" not in eps.names:
        pytest.skip("package metadata predates the entry point; reinstall luminal")
    assert "luminal" in torch._dynamo.list_backends(exclude_tags=())
    m = nn.Linear(3, 2).eval()
    f = torch.compile(m, backend="luminal", dynamic=True)
    with torch.no_grad():
        x = torch.randn(4, 3)
        torch.testing.assert_close(f(x), m(x))


# ----------------------------------------------------------------------------- op coverage
# Many ops per compiled function, so the converter table is exercised with few compiles.
def _zoo_elementwise(x, y, i):
    F = torch.nn.functional
    return (
        x + y * 2 - 1, x / (y.abs() + 1), torch.div(i, 3, rounding_mode="floor"), i % 5,
        torch.fmod(x, 0.7), x.pow(3), (x.abs() + 0.1).pow(y), 2.0**x, torch.maximum(x, y),
        torch.minimum(x, y), (x > y) & (x < 1), (x <= y) | (x >= 0.5), x == y, x != 0,
        ~(x > 0), x.exp(), x.exp2(), (x.abs() + 1).log(), (x.abs() + 1).log2(),
        (x.abs() + 1).log10(), x.log1p().nan_to_num(0.0), x.expm1(), x.abs().sqrt(),
        (x.abs() + 1).rsqrt(), (x.abs() + 1).reciprocal(), x.sin(), x.cos(), x.tanh(),
        x.sigmoid(), torch.erf(x), F.relu(x), F.silu(x), F.gelu(x), F.gelu(x, approximate="tanh"),
        F.hardtanh(x), F.leaky_relu(x, 0.1), F.elu(x), F.softplus(x), F.mish(x),
        F.hardswish(x), F.hardsigmoid(x), x.floor(), x.ceil(), x.round(), x.trunc(), x.sign(),
        x.clamp(-0.5, 0.5), x.clamp(min=0.0), torch.where(x > 0, x, y), x.masked_fill(x > 1, 0.0),
        torch.lerp(x, y, 0.3), 1 - x, x.isnan(), (i * 2 + 1).to(torch.float32), x.to(torch.int32),
    )  # fmt: skip


def _zoo_reduce(x, y, i):
    return (
        x.sum(), x.sum(-1), x.mean(0, keepdim=True), x.var(-1), x.var(0, unbiased=False),
        x.amax(-1), x.amin(0), x.max(-1).values, x.max(-1).indices, x.min(0).values, x.max(),
        x.argmax(-1), x.argmin(0), (x > 0).any(-1), (x > -3).all(), x.cumsum(-1),
        x.softmax(0), x.log_softmax(-1), x.logsumexp(-1), (x.abs() + 0.5).prod(-1),
        i.sum(-1), x @ y.t(), torch.addmm(y[0, :1], x, y.t()[:, :1]),
    )  # fmt: skip


def _zoo_movement(x, y, i):
    n = x.shape[0]
    return (
        x.view(-1), x.reshape(n, 5, 2).permute(2, 0, 1), x.t().contiguous(), x.unsqueeze(1),
        x[:, None, :].squeeze(1), x[1:, 2:7:2], x[-2:], x[:, -3], x.narrow(1, 2, 4),
        torch.cat([x, y], 1), torch.stack([x, y], 0), x.split(3, 1)[1], x.split([4, 6], 1)[1],
        x.chunk(2, 1)[0], x.unbind(1)[2], torch.nn.functional.pad(x, (1, 2)),
        torch.nn.functional.pad(x, (0, 0, 1, 0), value=2.0), x.flip(1), x.roll(2, 1),
        x.repeat(2, 1), x.tril(), x.triu(1), x.expand(2, n, 10), x.flatten(),
        x.unflatten(1, (2, 5)), x[i[:, 0] % n], x.gather(1, i % 10),
        x.index_select(1, i[0] % 10), torch.nn.functional.embedding(i % n, x),
        x.transpose(0, 1), torch.zeros_like(x), torch.ones(n, 3), torch.full((2, n), 7.0),
        torch.arange(n), torch.arange(1, 2 * n, 2), x.new_zeros(n), x.scatter(1, i % 10, 1.0),
        x.scatter_add(1, i % 10, y), x.t() * 2, (x * 2).t(),
    )  # fmt: skip


@pytest.mark.parametrize("fn", [_zoo_elementwise, _zoo_reduce, _zoo_movement])
def test_op_coverage(fn):
    class Zoo(nn.Module):
        def forward(self, x, y, i):
            return fn(x, y, i)

    def args(n):
        return dict(x=torch.randn(n, 10), y=torch.randn(n, 10), i=torch.randint(0, 50, (n, 10)))

    _check(Zoo(), [args(n) for n in (3, 7)], atol=1e-4, rtol=1e-4, strides=True)
    assert lt.stats.eager_ops == {}
    assert lt.stats.compiles == 1 and lt.stats.failed_plans == 0


@pytest.mark.parametrize("precision", ["highest", "medium"])
def test_float32_matmul_precision_medium_gives_bf16_products(precision, monkeypatch):
    """``torch.set_float32_matmul_precision("medium")`` allows bf16 inside float32 matmuls:
    luminal's plan then takes bf16 products (both operands rounded, f32 sums)."""
    monkeypatch.delenv("LUMINAL_MATMUL_PRECISION", raising=False)
    lin = nn.Linear(96, 40, bias=False)
    x = torch.randn(7, 96) * 3
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        with torch.no_grad():
            got = torch.compile(lin, backend=luminal_backend)(x)
    finally:
        torch.set_float32_matmul_precision(before)
    bf = x.bfloat16().double() @ lin.weight.detach().bfloat16().double().T
    f32 = x.double() @ lin.weight.detach().double().T
    want = bf if precision == "medium" else f32
    torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-5)
    assert (bf - f32).abs().max() > 1e-2  # the two are told apart
    assert "LUMINAL_MATMUL_PRECISION" not in os.environ


class SymbolicBounds(nn.Module):
    """Slices, narrows, selects and scatters at positions that are symbolic sizes, negative
    ones counted from the end (Mamba's causal convolution keeps conv(x)[..., :s][..., -s:])."""

    def forward(self, x):
        s = x.shape[-1]
        tail = (x * 2)[:, :, -s:] + x[:, :, -(s // 2) :].sum(-1, keepdim=True)
        picked = x.select(2, -(s // 2)) + x.narrow(2, -(s // 3), 1).squeeze(2)
        placed = torch.zeros_like(x).slice_scatter(x[:, :, : s // 2], 2, -(s // 2))
        return tail, picked, placed


def test_symbolic_negative_positions_count_from_the_end():
    _check(SymbolicBounds(), [dict(x=torch.randn(b, 3, s)) for b, s in ((2, 16), (4, 33), (3, 7))])
    assert lt.stats.compiles == 1 and lt.stats.eager_ops == {}


def test_a_symbolic_position_takes_the_sign_it_was_traced_with():
    """s - 9 is negative for s < 9: dynamo guards the sign torch saw and compiles again when it
    flips, and each graph counts the bound from the end it was traced with."""

    def f(x):
        return x[:, x.shape[1] - 9 : x.shape[1] - 2] * 3

    _check(f, [dict(x=torch.randn(2, n)) for n in (12, 20, 5, 6)])
    assert lt.stats.compiles >= 2 and lt.stats.eager_ops == {}


def test_a_size_equal_only_by_a_guard_broadcasts():
    """MPT's ALiBi: a table of 64 positions sliced from max(0, 64 - s) and added to scores of
    length s. Dynamo guards 64 - max(0, 64 - s) == s, that is s <= 64, without narrowing the
    symbol's range; the guard narrows the dim, so the sizes are equal and the add converts."""
    bias = torch.randn(3, 1, 64)

    class Alibi(nn.Module):
        def forward(self, x):
            s = x.shape[-1]
            pb = bias[:, max(0, bias.size(1) - s) :, max(0, bias.size(2) - s) :]
            return torch.softmax(x + pb, -1)

    _check(Alibi(), [dict(x=torch.randn(2, 3, s, s)) for s in (7, 9, 40)], dynamic=None)
    assert lt.stats.eager_ops == {}


def test_attention_rows_masked_whole_stay_finite():
    """A left-padded batch: pad queries see no key. PyTorch's CPU kernel gives those rows 0;
    a NaN there would reach the next layer's keys and, times a zero weight, every row."""

    def f(q, k, v, mask):
        sdpa = torch.nn.functional.scaled_dot_product_attention
        o = sdpa(q, k, v, attn_mask=mask)
        return sdpa(o, o, o, attn_mask=mask)  # o as the next layer's keys

    mask = torch.ones(2, 1, 6, 6, dtype=torch.bool).tril()
    mask[0, :, :, :2] = False  # batch 0: two pad positions on the left
    args = {n: torch.randn(2, 3, 6, 8) for n in "qkv"}
    _check(f, [dict(args, mask=mask)], dynamic=False)
    assert lt.stats.eager_ops == {}


def test_an_associative_scan_compiles_whole():
    """torch's generic associative scan (Mamba's state recurrence under torch.compile) recurses
    on halves of the sequence: its guards pin the length to one multiple of a power of two
    (32 within [32, 47]), so sizes such as s // 32 are the constant torch wrote."""
    from torch._higher_order_ops.associative_scan import associative_scan

    def combine(left, right):
        return left[0] * right[0], right[0] * left[1] + right[1]

    def f(a):
        return associative_scan(combine, (a.sigmoid(), a), dim=1, combine_mode="generic")[1]

    _check(f, [dict(a=torch.randn(b, s, 4)) for b, s in ((2, 16), (4, 32), (3, 7))], dynamic=None)
    assert lt.stats.eager_ops == {}


class _BrokenLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        y = self.a(x).relu()
        torch._dynamo.graph_break()  # the rest is one graph every layer resumes into
        return self.b(y) + x


def test_layers_sharing_a_graph_keep_a_plan_each():
    """After a graph break, each layer calls the same graph with its own parameters: every
    weight set keeps its plan, so steady calls build none."""
    m = nn.Sequential(*[_BrokenLayer() for _ in range(3)]).eval()
    _check(m, [dict(input=torch.randn(2, 8))], dynamic=False)
    built = lt.stats.plans
    _check(m, [dict(input=torch.randn(2, 8)) for _ in range(3)], dynamic=False)
    assert lt.stats.plans == built and lt.stats.eager_ops == {}


def test_string_padded_convolutions_convert():
    """padding="valid" reaches ATen as a one-element list, which ATen repeats per spatial dim."""
    m = nn.Sequential(nn.Conv2d(3, 4, 3, padding="valid"), nn.Conv2d(4, 4, (3, 2), padding="same"))
    _check(m.eval(), [dict(input=torch.randn(b, 3, 9, 7)) for b in (2, 3)])
    assert lt.stats.eager_ops == {}


def test_a_view_splitting_a_batch_off_rows_converts_and_checks_its_sizes():
    """Rows of batch x heads viewed as (batch, rows // batch, d), the batch from another
    argument: the sizes agree only where batch divides rows. Eager's view refuses the other
    sizes; each call checks them (Env.bind) and leaves those to eager."""
    from luminal.graph import symbolic as sym
    from luminal.torch_backend.partition import Env

    def f(x, y):
        return (x.view(y.shape[0], -1, x.shape[-1]) * 2).sum(1) + y

    _check(f, [dict(x=torch.randn(b * h, 5), y=torch.randn(b, 5)) for b, h in ((2, 3), (3, 4))])
    assert lt.stats.eager_ops == {}
    env = Env({"r": (0, 0), "b": (1, 0)})
    env.require([(sym.dim("r"), sym.dim("b"), "view")])
    env.bind([torch.zeros(6, 5), torch.zeros(2, 5)])
    assert env.dims == {"r": 6, "b": 2}
    with pytest.raises(ValueError, match="view: size r = 7 is not a multiple of b = 2"):
        env.bind([torch.zeros(7, 5), torch.zeros(2, 5)])


def test_a_floor_division_of_sizes_converts():
    # torch.div of a SymInt by an int stays an ATen call on two sizes
    def f(x):
        return x * torch.div(x.shape[0], 2, rounding_mode="floor")

    _check(f, [dict(x=torch.randn(s, 3)) for s in (4, 7)])
    assert lt.stats.eager_ops == {}


def test_as_strided_of_a_view_addresses_the_storage():
    """Longformer's overlapping chunks: as_strided called on a transposed, reshaped view
    addresses the storage of the tensor before the transpose."""

    def chunks(q):  # q: (seq, batch x heads, d), seq a multiple of 2w
        x = q.transpose(0, 1)  # a view, not contiguous
        x = x.view(x.shape[0], x.shape[1] // 8, 8, x.shape[2])
        size, stride = list(x.size()), list(x.stride())
        size[1], stride[1] = size[1] * 2 - 1, stride[1] // 2
        return x.as_strided(size=size, stride=stride) * 2

    _check(chunks, [dict(q=torch.randn(16, 4, 4))], dynamic=False)
    assert lt.stats.eager_ops == {}


def test_as_strided_past_its_tensor_stays_in_eager():
    # the input is a prefix of a larger storage: as_strided reads elements it does not hold
    # (a view of a value luminal holds reads that value's storage: x[:4] of a whole input)
    def f(x):
        return x[:4].as_strided((3, 3), (3, 1)) + 1

    _check(f, [dict(x=torch.randn(16)[:6])], dynamic=False)
    assert "aten.as_strided.default" in lt.stats.eager_ops
