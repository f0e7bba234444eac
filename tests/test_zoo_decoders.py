"""``luminal.models.load`` on tiny random transformers decoders saved with ``save_pretrained``:
Qwen2, Qwen3, Mistral (sliding window), Gemma 2 / Gemma 3, Phi-3, GPT-NeoX and the
mixture-of-experts models (Mixtral, Qwen2-MoE, Qwen3-MoE). Each: all-position logits against
transformers (rel err <= 1e-4, f32) and 16 greedy tokens equal, through the interpreter, and
the greedy tokens through the compiled plan."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import luminal  # noqa: E402
from luminal.models import LMSession, load  # noqa: E402

VOCAB = 97
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
MOE = dict(num_experts_per_tok=2, moe_intermediate_size=40)

# name -> (config class, model class, extra config)
ARCHS: dict[str, tuple[str, str, dict]] = {
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=24)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=5)),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(head_dim=16)),
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        dict(
            head_dim=16,
            sliding_window=5,
            query_pre_attn_scalar=20,
            attn_logit_softcapping=7.0,
            final_logit_softcapping=3.0,
        ),
    ),  # fmt: skip
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        dict(
            head_dim=16,
            sliding_window=5,
            query_pre_attn_scalar=24,
            layer_types=["sliding_attention", "full_attention"],
        ),
    ),  # fmt: skip
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(partial_rotary_factor=0.5)),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(rotary_pct=0.5)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(num_local_experts=4, **MOE)),
    "qwen2_moe": (
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        dict(num_experts=4, shared_expert_intermediate_size=48, **MOE),
    ),
    "gpt_oss": (
        "GptOssConfig",
        "GptOssForCausalLM",
        dict(
            head_dim=16,
            num_local_experts=4,
            sliding_window=5,
            intermediate_size=48,
            layer_types=["sliding_attention", "full_attention"],
            rope_parameters=dict(
                rope_type="yarn",
                factor=4.0,
                beta_fast=32.0,
                beta_slow=1.0,
                truncate=False,
                original_max_position_embeddings=16,
                rope_theta=1000.0,
            ),
            num_experts_per_tok=2,
        ),
    ),  # fmt: skip
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        dict(num_experts=5, norm_topk_prob=True, head_dim=16, **MOE),
    ),
}


def make_hf(arch: str, tmp_path, tied: bool = False, **overrides):
    """A random tiny transformers model saved to ``tmp_path`` (norms and biases randomized
    too, so a wrong mapping shows)."""
    cfg_cls, model_cls, extra = ARCHS[arch]
    torch.manual_seed(0)
    kw = {**COMMON, **extra, **overrides}
    if arch == "gpt_neox":
        kw["rope_theta"] = 1000.0
    cfg = getattr(transformers, cfg_cls)(**kw, tie_word_embeddings=tied)
    hf = getattr(transformers, model_cls)(cfg).eval()
    with torch.no_grad():
        for n, p in hf.named_parameters():
            if "norm" in n or "layernorm" in n:
                p.uniform_(0.5, 1.5) if not arch.startswith("gemma") else p.uniform_(-0.5, 0.5)
            elif n.endswith("bias") or n.endswith("sinks"):
                p.normal_(0, 0.3 if "sinks" not in n else 1.0)
            elif p.ndim >= 2:
                p.normal_(0, 0.08 if "embed" not in n else 0.5)
    hf.save_pretrained(tmp_path)
    return hf


def hf_logits(hf, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].float().numpy()


def hf_greedy(hf, ids: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False,
                          eos_token_id=None, pad_token_id=0)  # fmt: skip
    return out[0, len(ids) :].tolist()


PROMPT = [5, 17, 3, 42, 8, 60, 1, 9, 33, 71, 12]


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


# the default tier runs one of each kind (plain attention + q/k norm, soft-capped sliding
# attention, mixture of experts); the rest run in the slow tier
FAST = ("qwen3", "gemma2", "mixtral")
PARAMS = [a if a in FAST else pytest.param(a, marks=pytest.mark.slow) for a in ARCHS]


@pytest.fixture
def fast_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    """Compile without the measured search (tested elsewhere): the plans here check the
    models' graphs through codegen and the runtime, in seconds rather than a minute."""
    for flag in ("LUMINAL_SEARCH_SCHEDULES", "LUMINAL_SEARCH_LIBRARY", "LUMINAL_EGRAPH",
                 "LUMINAL_SEARCH_BUDGET_S"):  # fmt: skip
        monkeypatch.setenv(flag, "0")


def _compiled_available() -> bool:
    try:
        from luminal import runtime  # noqa: F401
    except Exception:
        return False
    return callable(getattr(luminal, "compile", None))


needs_compiled = pytest.mark.skipif(
    not _compiled_available(), reason="luminal.compile / the C++ runtime is not built"
)


# Qwen2 (Llama with biases, as qwen2_moe's attention) is checked through its compiled plan only
@pytest.mark.parametrize("arch", [a for a in PARAMS if getattr(a, "values", [a])[0] != "qwen2"])
def test_matches_transformers(arch: str, tmp_path) -> None:
    hf = make_hf(arch, tmp_path)
    s = load(tmp_path, backend="interp")
    assert isinstance(s, LMSession) and s.backend == "interp"
    ref = hf_logits(hf, PROMPT)
    g = s.model.build(logits="all")
    out = g.run({"tokens": np.asarray(PROMPT, np.int32), **s.model.new_cache()}, pos=0)
    assert _rel(out["logits"], ref) <= 1e-4
    if arch in FAST:  # prefill part of the prompt, then step by step: the cache path
        got = [s.forward(PROMPT[:4])] + [s.forward([t]) for t in PROMPT[4:]]
        assert _rel(np.stack(got), ref[3:]) <= 1e-4
        s.reset()
    want = hf_greedy(hf, PROMPT, 16)
    assert s.generate(PROMPT, 16, stop=[]) == want
    if arch in FAST:  # a text prompt through the folder's tokenizer.json; EOS stops
        _word_tokenizer(tmp_path, eos=want[3])
        s = load(tmp_path, backend="interp")
        assert s.tokenizer.eos_ids == [want[3]]
        text = " ".join(f"w{t}" for t in PROMPT)
        assert s.generate(text, 16) == want[: want.index(want[3])]


def _word_tokenizer(path, eos: int) -> None:
    """A word-level tokenizer.json whose word ``w<i>`` is token i, EOS ``w<eos>``."""
    import json

    from tokenizers import Tokenizer as TK
    from tokenizers import models, pre_tokenizers

    tk = TK(models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": f"w{eos}"}))


@needs_compiled
@pytest.mark.parametrize(  # Mixtral's plan is checked by the routed-experts test
    "arch", [a for a in PARAMS if a != "mixtral" and getattr(a, "values", [a])[0] != "gemma"]
)
def test_compiled_matches_transformers(arch: str, tmp_path, fast_compile, monkeypatch) -> None:
    hf = make_hf(arch, tmp_path)
    s = load(tmp_path, backend="compiled", max_context=48)
    assert s.backend == "compiled"
    ref = hf_logits(hf, PROMPT)
    assert _rel(s.forward(PROMPT), ref[-1]) <= 1e-4
    s.reset()
    assert s.generate(PROMPT, 16, stop=[]) == hf_greedy(hf, PROMPT, 16)
    compiles: list[str] = []  # a second load finds the plan in the plan cache
    real = luminal.compile

    def counting(g, *a, **k):
        compiles.append(g.name)
        return real(g, *a, **k)

    monkeypatch.setattr(luminal, "compile", counting)
    again = load(tmp_path, backend="compiled", max_context=48)
    assert _rel(again.forward(PROMPT), ref[-1]) <= 1e-4 and compiles == []


@needs_compiled
@pytest.mark.usefixtures("fast_compile")
def test_long_prompt_runs_on_the_prefill_plan(tmp_path) -> None:
    """A prompt of PREFILL_MIN+ tokens compiles the prefill plan (weights folded), which
    fills the cache the decode plan continues from."""
    from luminal.models.llama import PREFILL_MIN

    hf = make_hf("gemma2", tmp_path)
    s = load(tmp_path, backend="compiled", max_context=PREFILL_MIN + 16)
    ids = [int(t) for t in np.random.default_rng(0).integers(3, VOCAB, PREFILL_MIN + 4)]
    assert _rel(s.forward(ids), hf_logits(hf, ids)[-1]) <= 1e-4
    assert s.prefill_runner is not None and s.prefill_runner.backend == "compiled"
    s.reset()
    assert s.generate(ids, 8, stop=[]) == hf_greedy(hf, ids, 8)


@pytest.mark.parametrize("backend", ["interp", pytest.param("compiled", marks=needs_compiled)])
def test_moe_step_reads_only_routed_experts(backend: str, tmp_path, fast_compile) -> None:
    """The weights of every expert a one-token step does not route to are NaN: the logits
    still match transformers, so the step read none of them (a dense mixture would be NaN)."""
    from luminal.models.zoo import decoder_from_hf, read_hf_dir

    hf = make_hf("mixtral", tmp_path)
    routed: dict[int, set[int]] = {}
    for i, layer in enumerate(hf.model.layers):
        layer.mlp.gate.register_forward_hook(
            lambda m, a, out, i=i: routed.__setitem__(i, set(out[2].flatten().tolist()))
        )
    ref = hf_logits(hf, [7])[-1]
    config, arrays = read_hf_dir(str(tmp_path))
    model = decoder_from_hf(config, arrays, max_context=16)
    ws = model.weights.arrays  # type: ignore[attr-defined]
    for i, used in routed.items():
        unused = sorted(set(range(4)) - used)
        assert unused  # top-2 of 4 experts
        for kind in ("gate", "up", "down"):
            ws[f"blk.{i}.ffn_{kind}_exps.weight"][unused] = np.nan
    s = LMSession(model, backend=backend)
    got = s.forward([7])
    assert np.isfinite(got).all() and _rel(got, ref) <= 1e-4


def test_bf16_and_f16_safetensors(tmp_path) -> None:
    """Weights saved in bf16 / f16 stay in their dtype on disk (mapped) and are cast in the
    graph: logits equal transformers computing in f32 from the same rounded weights."""
    hf = make_hf("qwen3", tmp_path / "f32")
    for dtype in (torch.bfloat16, torch.float16):
        d = tmp_path / str(dtype)
        hf.to(dtype).save_pretrained(d)
        hf.to(torch.float32)
        ref_model = getattr(transformers, ARCHS["qwen3"][1]).from_pretrained(d, dtype=torch.float32)
        s = load(d, backend="interp")
        kinds = {a.dtype.name for a in s.model.weights.arrays.values()}  # type: ignore[attr-defined]
        assert kinds == {str(dtype).removeprefix("torch.")}
        assert _rel(s.forward(PROMPT), hf_logits(ref_model.eval(), PROMPT)[-1]) <= 1e-4


def test_unknown_architectures_are_named(tmp_path) -> None:
    import json

    import gguf

    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps({"model_type": "mamba2"}))
    from luminal.loaders.safetensors import save_safetensors

    save_safetensors(tmp_path / "hf" / "model.safetensors", {"x": np.zeros(2, np.float32)})
    with pytest.raises(NotImplementedError, match="'mamba2'.*supported: .*qwen3"):
        load(tmp_path / "hf")
    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "rwkv7")
    w.add_block_count(1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(NotImplementedError, match="'rwkv7'.*supported: .*gemma2"):
        load(tmp_path / "m.gguf")
    with pytest.raises(FileNotFoundError, match="no such file"):
        load(tmp_path / "missing.gguf")
    from luminal.models.zoo import decoder_from_hf, read_hf_dir

    make_hf("qwen3", tmp_path / "q")
    config, arrays = read_hf_dir(str(tmp_path / "q"))
    arrays.pop("model.layers.1.self_attn.k_norm.weight")
    with pytest.raises(KeyError, match="'blk.1.attn_k_norm.weight' is missing"):
        decoder_from_hf(config, arrays).build()
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        load(tmp_path / "empty")


def test_load_gives_an_encoder_for_bert() -> None:
    """all-MiniLM-L6-v2's folder loads as an ``Encoder`` computing what ``Embedder`` does."""
    from luminal.models import Bert, Embedder, Encoder, minilm_dir
    from luminal.tokenizer import Tokenizer

    try:
        path = minilm_dir()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    e = load(path, backend="interp")
    assert isinstance(e, Encoder)
    texts = ["hello world", "luminal compiles models ahead of time"]
    ref = Embedder(Bert.from_dir(path), Tokenizer.from_file(f"{path}/tokenizer.json"), "interp")
    np.testing.assert_allclose(e.embed(texts), ref(texts), atol=1e-6)


@pytest.mark.slow
def test_gemma3_multimodal_folder_runs_its_language_model(tmp_path) -> None:
    """A ``Gemma3ForConditionalGeneration`` folder (``model_type: gemma3`` with a text and a
    vision config, weights under ``language_model.``): ``load`` gives its language model,
    whose text-only logits and greedy tokens equal the multimodal model's."""
    torch.manual_seed(0)
    text = {**COMMON, **ARCHS["gemma3"][2]}
    vision = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                  num_attention_heads=2, image_size=28, patch_size=14)  # fmt: skip
    cfg = transformers.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                                    image_token_index=96, boi_token_index=94,
                                    eoi_token_index=95)  # fmt: skip
    hf = transformers.Gemma3ForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for n, p in hf.named_parameters():
            if "norm" in n:
                p.uniform_(-0.5, 0.5)
            elif p.ndim >= 2:
                p.normal_(0, 0.08 if "embed" not in n else 0.5)
    hf.save_pretrained(tmp_path)
    s = load(tmp_path, backend="interp")
    assert s.config.arch == "gemma3_text" and s.config.layer_types == ["sliding", "full"]
    g = s.model.build(logits="all")
    out = g.run({"tokens": np.asarray(PROMPT, np.int32), **s.model.new_cache()}, pos=0)
    assert _rel(out["logits"], hf_logits(hf, PROMPT)) <= 1e-4
    assert s.generate(PROMPT, 16, stop=[]) == hf_greedy(hf, PROMPT, 16)


def write_gpt_oss_mxfp4(hf, path) -> None:
    """``hf`` saved as an MXFP4 checkpoint the way OpenAI's release stores its experts:
    ``*_blocks`` (experts, out, in / 32, 16) u8 and ``*_scales`` (experts, out, in / 32) e8m0,
    quantized by ``gguf.quants``; ``hf``'s experts are set to the quantized values."""
    import json

    import gguf

    from luminal.loaders.safetensors import save_safetensors

    mx = gguf.GGMLQuantizationType.MXFP4
    sd = {}
    for k, v in hf.state_dict().items():
        a = v.float().numpy()
        if not k.endswith(("experts.gate_up_proj", "experts.down_proj")):
            sd[k] = a
            continue
        t = np.ascontiguousarray(a.swapaxes(1, 2))  # (experts, out, in)
        q = gguf.quants.quantize(t, mx)
        deq = gguf.quants.dequantize(q, mx).reshape(t.shape)
        q = q.reshape(*t.shape[:2], -1, 17)  # ggml blocks: scale, byte j = elements j, j + 16
        codes = np.concatenate([q[..., 1:] & 15, q[..., 1:] >> 4], -1)
        sd[k + "_blocks"] = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
        sd[k + "_scales"] = np.ascontiguousarray(q[..., 0])
        v.copy_(torch.from_numpy(deq.swapaxes(1, 2)))
    path.mkdir(parents=True)
    save_safetensors(path / "model.safetensors", sd)
    cfg = hf.config.to_dict()
    cfg["quantization_config"] = {"quant_method": "mxfp4"}
    (path / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize(
    "backend", ["interp", pytest.param("compiled", marks=[needs_compiled, pytest.mark.slow])]
)
@pytest.mark.usefixtures("fast_compile")
def test_gpt_oss_mxfp4_checkpoint(backend: str, tmp_path) -> None:
    """A transformers MXFP4 GPT-OSS folder: the expert blocks enter the graph packed (gathered
    by expert id); logits and greedy tokens equal transformers loading the same folder (which
    dequantizes it on a CPU)."""
    from luminal.models.gpt_oss import mxfp4_blocks

    with pytest.raises(ValueError, match="do not match scales"):
        mxfp4_blocks(np.zeros((2, 3, 16), np.uint8), np.zeros((2, 4), np.uint8))
    hf = make_hf("gpt_oss", tmp_path / "bf16", intermediate_size=64)
    write_gpt_oss_mxfp4(hf, tmp_path / "mx")
    ref = transformers.GptOssForCausalLM.from_pretrained(tmp_path / "mx", dtype=torch.float32)
    s = load(tmp_path / "mx", backend=backend, max_context=32)
    assert s.model.weights.packed["blk.0.ffn_down_exps.weight"][0] == "MXFP4"
    assert _rel(s.forward(PROMPT), hf_logits(ref.eval(), PROMPT)[-1]) <= 1e-4
    s.reset()
    assert s.generate(PROMPT, 16, stop=[]) == hf_greedy(hf, PROMPT, 16)
