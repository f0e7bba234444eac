"""More transformers families under torch.compile(backend="luminal"), default arguments, and
StaticCache generation (its cache writes are in-place plan updates).

Each family: tiny random config (one or two layers), outputs equal eager, the profiler sees no
matmul / softmax / normalization / embedding op in ATen, and a new batch size (and sequence
length, where the model takes one) compiles nothing. Slow tier: about 10-40 s each; Gemma,
Phi-3, GPT-NeoX and RoBERTa with LUMINAL_TEST_FAMILIES=all (all pass: about 3 min more).
"""

import os

import pytest

torch = pytest.importorskip("torch")
tf = pytest.importorskip("transformers")

import luminal.torch_backend as lt  # noqa: E402
from test_torch_backend_models import _heavy_aten, _model  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _fresh(fresh_dynamo):
    yield


_DEC = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128, vocab_size=100,
            attn_implementation="sdpa")  # fmt: skip
_ENC = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
            attn_implementation="sdpa")  # fmt: skip


def _family(kind: str):
    """(model, input kind) for a tiny random config of ``kind``."""
    if kind == "gemma":
        return tf.GemmaForCausalLM(tf.GemmaConfig(head_dim=8, **_DEC)), "ids"
    if kind == "phi3":
        return tf.Phi3ForCausalLM(tf.Phi3Config(pad_token_id=0, **_DEC)), "ids"
    if kind == "gpt_neox":
        cfg = {k: v for k, v in _DEC.items() if k != "num_key_value_heads"}
        return tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(**cfg)), "ids"
    if kind == "roberta":
        cfg = tf.RobertaConfig(pad_token_id=1, vocab_size=100, max_position_embeddings=130, **_ENC)
        return tf.RobertaModel(cfg), "ids"
    if kind == "distilbert":
        cfg = tf.DistilBertConfig(dim=32, hidden_dim=64, n_layers=1, n_heads=4,
                                  vocab_size=100, max_position_embeddings=128,
                                  attn_implementation="sdpa")  # fmt: skip
        return tf.DistilBertModel(cfg), "ids"
    if kind == "vit":
        return tf.ViTModel(tf.ViTConfig(image_size=32, patch_size=8, **_ENC)), "image"
    if kind == "resnet":
        cfg = tf.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
                              layer_type="basic")  # fmt: skip
        return tf.ResNetModel(cfg), "image"
    if kind == "whisper_encoder":
        cfg = tf.WhisperConfig(d_model=32, encoder_layers=1, encoder_attention_heads=4,
                               decoder_layers=1, decoder_attention_heads=4, encoder_ffn_dim=64,
                               decoder_ffn_dim=64, num_mel_bins=16, max_source_positions=25,
                               vocab_size=100, pad_token_id=0, bos_token_id=0, eos_token_id=0,
                               decoder_start_token_id=0, attn_implementation="sdpa")  # fmt: skip
        return tf.WhisperForConditionalGeneration(cfg).get_encoder(), "mel"
    if kind == "deberta":  # relative-position attention, a 0-d scale folded at compile time
        enc = {k: v for k, v in _ENC.items() if k != "attn_implementation"}  # eager only
        cfg = tf.DebertaV2Config(vocab_size=100, max_position_embeddings=128, **enc)
        return tf.DebertaV2Model(cfg), "ids"
    if kind == "xlnet":  # relative positions from a float arange over symbolic bounds
        cfg = tf.XLNetConfig(d_model=32, n_layer=1, n_head=4, d_inner=64, vocab_size=100)
        return tf.XLNetModel(cfg), "ids"
    if kind == "segformer":  # overlapping strided patch merges: nested window sizes
        cfg = tf.SegformerConfig(hidden_sizes=[8, 16, 16, 32], num_attention_heads=[1, 2, 2, 4],
                                 depths=[1, 1, 1, 1], decoder_hidden_size=16)  # fmt: skip
        return tf.SegformerModel(cfg), "image"
    raise ValueError(kind)


def _inputs(how: str, b: int, s: int) -> dict:
    if how == "ids":
        return dict(input_ids=torch.randint(2, 100, (b, s)))
    if how == "image":
        return dict(pixel_values=torch.randn(b, 3, 32, 32))
    return dict(input_features=torch.randn(b, 16, 50))  # Whisper: 2 x max_source_positions


def _main(out):
    if isinstance(out, tuple):
        return out[0]
    logits = getattr(out, "logits", None)
    return logits if logits is not None else out.last_hidden_state


# the slow tier runs these; LUMINAL_TEST_FAMILIES=all adds the decoder LMs and RoBERTa (whose
# architectures differ from the tested Llama / BERT in norms, rotary layout and MLP only) and
# families an op converter once failed on
FAMILIES = ["distilbert", "vit", "resnet", "whisper_encoder"]
MORE = ["gemma", "phi3", "gpt_neox", "roberta", "deberta", "xlnet", "segformer"]


@pytest.mark.parametrize("kind", FAMILIES + [
    pytest.param(k, marks=pytest.mark.skipif(os.environ.get("LUMINAL_TEST_FAMILIES") != "all",
                                             reason="LUMINAL_TEST_FAMILIES=all runs it"))
    for k in MORE])  # fmt: skip
def test_family_runs_in_luminal(kind):
    m, how = _family(kind)
    m.eval()
    f = torch.compile(m, backend="luminal", dynamic=True)
    with torch.no_grad():
        x = _inputs(how, 2, 5)  # compiles (outside the profiler: tracing runs ATen on fakes)
        torch.testing.assert_close(_main(f(**x)), _main(m(**x)), atol=1e-4, rtol=1e-4)
        for b, s in ((3, 7), (4, 9)):
            x = _inputs(how, b, s)
            got, heavy = _heavy_aten(lambda x=x: f(**x))
            torch.testing.assert_close(_main(got), _main(m(**x)), atol=1e-4, rtol=1e-4)
            assert heavy == [], f"ran in ATen: {heavy}"
    assert lt.stats.compiles == 1, "a new batch size or length must not recompile"
    assert lt.stats.eager_ops == {} and lt.stats.fallbacks == [] and lt.stats.failed_plans == 0


def test_static_cache_generate():
    """generate(cache_implementation="static"): eager's greedy tokens, the key/value writes are
    in-place plan updates, and later prompts and decode positions compile nothing."""
    m = _model("llama", attn="eager")
    c = _model("llama", attn="eager")
    c.load_state_dict(m.state_dict())
    c.forward = torch.compile(c.forward, backend="luminal", dynamic=True)
    with torch.no_grad():
        for n, s in enumerate((5, 8, 6)):
            ids = torch.randint(1, 100, (1, s))
            kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=5, do_sample=False,
                      cache_implementation="static")  # fmt: skip
            if n == 0:
                got, heavy = c.generate(ids, **kw), []
                warm = lt.stats.compiles
            else:
                got, heavy = _heavy_aten(lambda ids=ids, kw=kw: c.generate(ids, **kw))
            assert torch.equal(got, m.generate(ids, **kw))
            assert heavy == [], f"ran in ATen: {heavy}"
    assert lt.stats.compiles == warm, "no compile after the first prompt"
    # the prefill graph creates the cache (transformers initializes it lazily); the decode graph
    # writes 2 layers' keys and values into it in place
    assert lt.stats.in_place >= 4
    assert lt.stats.eager_ops == {} and lt.stats.fallbacks == [] and lt.stats.failed_plans == 0


def test_mamba_scan_matches_eager():
    """Mamba's reference selective scan (transformers' path without its CUDA kernels): under
    torch.compile a generic associative scan whose slices count from the end at symbolic
    positions and whose recursion pins the length; every length compiles again (dynamo's guards
    on the recursion depth), each graph whole in luminal and equal to eager."""
    cfg = tf.MambaConfig(hidden_size=32, num_hidden_layers=1, vocab_size=100, state_size=8)
    m = tf.MambaModel(cfg).eval()
    f = torch.compile(m, backend="luminal")
    with torch.no_grad():
        for b, s in ((2, 16), (4, 32), (3, 7), (2, 16)):
            x = _inputs("ids", b, s)
            torch.testing.assert_close(_main(f(**x)), _main(m(**x)), atol=1e-4, rtol=1e-4)
    assert lt.stats.eager_ops == {} and lt.stats.fallbacks == [] and lt.stats.failed_plans == 0
