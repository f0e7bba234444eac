"""Text around the models: the GGUF-embedded tokenizer and chat template against
transformers, streaming decode, and the sampler."""

from __future__ import annotations

import os

import numpy as np
import pytest

from luminal.sampling import Sampler

TEXTS = [
    "The capital of France is",
    "Numbers 12345 and 3.14159, dates 2024-11-29.",
    "  leading spaces,\ttabs\n\nand newlines  ",
    "héllo wörld, 世界! 🚀 emoji",
    "def f(x):\n    return x ** 2  # code",
    "<|im_start|>user\nhi there<|im_end|>\n",
]


@pytest.fixture(scope="module")
def smol_tok():
    pytest.importorskip("gguf")
    pytest.importorskip("tokenizers")
    from luminal.loaders.gguf import GGUFFile
    from luminal.models import smollm2_path
    from luminal.tokenizer import Tokenizer

    try:
        path = smollm2_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    return path, Tokenizer.from_gguf(GGUFFile(path))


@pytest.fixture(scope="module")
def hf_tok(smol_tok):
    transformers = pytest.importorskip("transformers")
    path, _ = smol_tok
    return transformers.AutoTokenizer.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path)
    )


def test_gguf_tokenizer_matches_transformers(smol_tok, hf_tok) -> None:
    _, tok = smol_tok
    assert tok.bos_id == 1 and tok.eos_ids == [2] and tok.vocab_size == 49152
    for t in TEXTS:
        ids = tok.encode(t)
        assert ids == hf_tok(t, add_special_tokens=False)["input_ids"], t
        assert tok.decode(ids, skip_special=False) == t


def test_chat_template_matches_transformers(smol_tok, hf_tok) -> None:
    _, tok = smol_tok
    msgs = [{"role": "user", "content": "What is 2+2?"}]
    ours = tok.apply_chat_template(msgs)
    assert ours == hf_tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert ours.endswith("<|im_start|>assistant\n") and "<|im_start|>system" in ours
    assert tok.encode(ours)[:1] == [1]  # <|im_start|> is one special token


def test_stream_decoder_reassembles_text(smol_tok) -> None:
    _, tok = smol_tok
    text = "Streaming 🚀 héllo, 世界 works."
    s = tok.streamer()
    pieces = [s.push(i) for i in tok.encode(text)]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)


def test_chatml_fallback_without_template() -> None:
    pytest.importorskip("tokenizers")
    pytest.importorskip("jinja2")
    from tokenizers import Tokenizer as TK
    from tokenizers import models

    from luminal.tokenizer import Tokenizer

    tok = Tokenizer(TK(models.BPE()))
    out = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert out == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


# ----------------------------------------------------------------------------- sampling
def test_greedy_and_degenerate_settings_pick_argmax() -> None:
    logits = np.array([0.1, 3.0, 2.9, -1.0], np.float32)
    assert Sampler()(logits) == 1
    assert Sampler(temperature=0.8, top_k=1, seed=0)(logits) == 1
    assert Sampler(temperature=0.8, top_p=1e-6, seed=0)(logits) == 1


def test_seeded_sampling_is_reproducible_and_follows_the_distribution() -> None:
    rng = np.random.default_rng(1)
    logits = rng.normal(size=50).astype(np.float32)
    a = [Sampler(temperature=1.0, seed=7)(logits) for _ in range(3)]
    s1, s2 = Sampler(temperature=1.0, seed=7), Sampler(temperature=1.0, seed=7)
    assert [s1(logits) for _ in range(20)] == [s2(logits) for _ in range(20)]
    assert len(set(a)) == 1
    s = Sampler(temperature=1.0, seed=0)
    counts = np.bincount([s(logits) for _ in range(4000)], minlength=50) / 4000
    p = np.exp(logits - logits.max())
    p /= p.sum()
    assert np.abs(counts - p).max() < 0.03


def test_top_k_and_top_p_restrict_support() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    pk = Sampler(temperature=1.0, top_k=2).probs(logits)
    np.testing.assert_allclose(pk, [0.625, 0.375, 0, 0])
    pp = Sampler(temperature=1.0, top_p=0.7).probs(logits)  # 0.5 + 0.3 reaches 0.7
    np.testing.assert_allclose(pp, [0.625, 0.375, 0, 0])
    hot = Sampler(temperature=100.0).probs(logits)
    assert hot.max() - hot.min() < 0.02  # high temperature flattens
    with pytest.raises(ValueError):
        Sampler(top_p=0.0)
    with pytest.raises(ValueError):
        Sampler(top_k=-1)
