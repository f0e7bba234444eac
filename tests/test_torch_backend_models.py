"""transformers models under torch.compile(backend="luminal"), called the way users call them.

Default arguments (``use_cache=True``: a DynamicCache is built and returned). Each test checks
the results against eager PyTorch, that no matmul / softmax / normalization / embedding ran in
ATen (the profiler sees every ATen op, including those of eager fallbacks), and that changing
batch size or sequence length compiles nothing new.

The measured search is switched off (its budget set to 0): these tests are about what runs
where, not about kernel speed.
"""

import pytest

torch = pytest.importorskip("torch")
tf = pytest.importorskip("transformers")

import luminal.torch_backend as lt  # noqa: E402

# ATen ops that must not run when a model runs in luminal
HEAVY = {
    "aten::mm", "aten::bmm", "aten::addmm", "aten::matmul", "aten::linear", "aten::baddbmm",
    "aten::_softmax", "aten::softmax", "aten::embedding", "aten::layer_norm",
    "aten::native_layer_norm", "aten::rms_norm", "aten::_fused_rms_norm",
    "aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention_for_cpu",
}  # fmt: skip


@pytest.fixture(autouse=True)
def _fresh(fresh_dynamo):
    yield


def _model(kind: str, attn: str = "sdpa"):
    common = dict(vocab_size=100, attn_implementation=attn)
    dec = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=128, **common)  # fmt: skip
    if kind == "llama":
        m = tf.LlamaForCausalLM(tf.LlamaConfig(**dec))
    elif kind == "qwen2":
        m = tf.Qwen2ForCausalLM(tf.Qwen2Config(**dec))
    elif kind == "mistral":
        m = tf.MistralForCausalLM(tf.MistralConfig(**dec))
    elif kind == "gpt2":
        cfg = tf.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=128, bos_token_id=0,
                            eos_token_id=0, **common)  # fmt: skip
        m = tf.GPT2LMHeadModel(cfg)
    else:
        raise ValueError(kind)
    m.generation_config.pad_token_id = 0
    return m.eval()


def _heavy_aten(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out = fn()
    return out, sorted({e.name for e in prof.events()} & HEAVY)


def _cache_tensors(cache):
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return [t for layer in layers for t in (layer.keys, layer.values)]
    return [t for kv in cache for t in kv]


def _assert_same(got, want):
    torch.testing.assert_close(got.logits, want.logits, atol=1e-4, rtol=1e-4)
    for a, b in zip(_cache_tensors(got.past_key_values), _cache_tensors(want.past_key_values),
                    strict=True):  # fmt: skip
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


FAMILIES = [
    "llama",
    pytest.param("gpt2", marks=pytest.mark.slow),
    pytest.param("qwen2", marks=pytest.mark.slow),
    pytest.param("mistral", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("kind", FAMILIES)
def test_default_arguments_run_in_luminal(kind):
    """m(input_ids=ids) with its default use_cache=True: the DynamicCache it builds and returns
    (an FX get_attr constant, cache tensors as outputs) is converted, logits and cache match
    eager, nothing heavy runs in ATen, and a new batch size and length do not recompile."""
    m = _model(kind)
    f = torch.compile(m, backend="luminal", dynamic=True)
    with torch.no_grad():
        # compile outside the profiler (tracing runs ATen ops on fake tensors)
        ids = torch.randint(0, 100, (2, 4))
        _assert_same(f(input_ids=ids), m(input_ids=ids))
        assert lt.stats.compiles == 1
        for b, s in ((2, 5), (3, 9)):
            ids = torch.randint(0, 100, (b, s))
            got, heavy = _heavy_aten(lambda ids=ids: f(input_ids=ids))
            _assert_same(got, m(input_ids=ids))
            assert heavy == [], f"ran in ATen: {heavy}"
    assert lt.stats.compiles == 1, "a new batch size or length must not recompile"
    assert lt.stats.eager_ops == {} and lt.stats.fallbacks == [] and lt.stats.failed_plans == 0


@pytest.mark.slow  # ~45 s: three compiles (prefill, decode twice)
@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_generate_greedy_matches_eager(kind):
    """generate() with the forward compiled (transformers' documented way) gives eager's
    greedy tokens. Compiles: prefill; the first decode step (sequence 1), which dynamo traces
    with the batch size fixed for Llama; and that decode graph again with the batch dynamic once
    a second batch size is seen (GPT-2's decode stays dynamic: 2 compiles). After that, new
    batch sizes, prompt lengths and every decode position reuse the plans. Eager attention:
    the SDPA decode graph converts too, but its plan takes many minutes to build today (see
    docs/torch-backend.md)."""
    m = _model(kind, attn="eager")
    c = _model(kind, attn="eager")
    c.load_state_dict(m.state_dict())
    c.forward = torch.compile(c.forward, backend="luminal", dynamic=True)
    with torch.no_grad():
        for b, s in ((2, 5), (3, 8), (4, 3), (5, 6)):
            ids = torch.randint(1, 100, (b, s))
            kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=5, do_sample=False)
            if b < 4:  # these compile (tracing runs ATen ops on fake tensors: no profiler)
                got, heavy = c.generate(ids, **kw), []
            else:
                got, heavy = _heavy_aten(lambda ids=ids, kw=kw: c.generate(ids, **kw))
            assert torch.equal(got, m.generate(ids, **kw))
            assert heavy == [], f"ran in ATen: {heavy}"
            if b == 3:
                warm = lt.stats.compiles
    assert warm <= 3 and lt.stats.compiles == warm, "no compile after the warm-up prompts"
    assert lt.stats.eager_ops == {} and lt.stats.fallbacks == [] and lt.stats.failed_plans == 0


@pytest.mark.parametrize(
    "dtype", [torch.bfloat16, pytest.param(torch.float16, marks=pytest.mark.slow)]
)
def test_half_precision_model_runs_in_luminal(dtype):
    """A Llama whose weights and activations are bf16 (f16): called with default arguments it
    runs in luminal, as close to the float32 model as eager PyTorch in that dtype is."""
    m32 = _model("llama")
    m = _model("llama")
    m.load_state_dict(m32.state_dict())
    m.to(dtype)
    f = torch.compile(m, backend="luminal", dynamic=True)
    with torch.no_grad():
        f(input_ids=torch.randint(0, 100, (2, 4)))
        for b, s in ((2, 5), (3, 9)):
            ids = torch.randint(0, 100, (b, s))
            got, heavy = _heavy_aten(lambda ids=ids: f(input_ids=ids))
            assert heavy == [], f"ran in ATen: {heavy}"
            assert got.logits.dtype == dtype and got.past_key_values.layers[0].keys.dtype == dtype
            ref, want = m32(input_ids=ids).logits, m(input_ids=ids).logits
            err = (got.logits.float() - ref).abs().max().item()
            eager_err = (want.float() - ref).abs().max().item()
            assert err <= 2 * eager_err + 1e-3, (err, eager_err)
    assert lt.stats.compiles == 1 and lt.stats.plans == 1
    assert lt.stats.eager_ops == {} and lt.stats.fallbacks == [] and lt.stats.failed_plans == 0


def test_mixture_of_experts_routes_in_luminal():
    """A mixture of experts' routing (an unstable sort of expert ids full of ties, histc over
    the token-expert pairs, transformers' grouped product by offsets) converts: one partition,
    static and then dynamic sizes, logits as eager's (the order of ties does not reach them)."""
    cfg = tf.MixtralConfig(vocab_size=100, hidden_size=32, intermediate_size=64,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           num_local_experts=4, num_experts_per_tok=2)  # fmt: skip
    m = tf.MixtralForCausalLM(cfg).eval()
    f = torch.compile(m, backend="luminal")
    with torch.no_grad():
        for b, s in ((2, 16), (3, 9), (2, 21)):  # static first, then dynamic
            ids = torch.randint(0, 100, (b, s))
            torch.testing.assert_close(
                f(input_ids=ids, use_cache=False).logits,
                m(input_ids=ids, use_cache=False).logits,
                atol=1e-4, rtol=1e-4,
            )  # fmt: skip
    assert lt.stats.eager_ops == {} and lt.stats.fallbacks == [] and lt.stats.failed_plans == 0


def test_grouped_product_rows_past_the_last_group_are_zero():
    from luminal.torch_backend.convert import NAMED

    pytest.importorskip("transformers.integrations.moe")  # registers the op
    assert "transformers.grouped_mm_fallback.default" in NAMED
    fallback = torch.ops.transformers.grouped_mm_fallback
    x, w = torch.randn(7, 5), torch.randn(3, 5, 4)
    offs = torch.tensor([2, 2, 5], dtype=torch.int32)  # group 1 empty; rows 5, 6 in none
    with torch.no_grad():
        got = torch.compile(lambda a, b, o: fallback(a, b, o), backend="luminal")(x, w, offs)
    torch.testing.assert_close(got, fallback(x, w, offs))
    assert got[5:].abs().max() == 0
    assert lt.stats.eager_ops == {}
