"""Whisper through ``luminal.models.load``: a tiny random transformers Whisper saved with
``save_pretrained`` (1 s clips); the log-mel front end (graph ops) against the feature
extractor, and the greedy transcription tokens against transformers' model, through the
interpreter and compiled."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from luminal.models import load  # noqa: E402
from luminal.models.whisper import WhisperSession  # noqa: E402
from test_zoo_decoders import _rel, fast_compile, needs_compiled  # noqa: E402, F401


def _whisper(tmp_path):
    torch.manual_seed(0)
    cfg = transformers.WhisperConfig(
        vocab_size=120, d_model=48, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=80,
        decoder_ffn_dim=80, num_mel_bins=40, max_source_positions=50, max_target_positions=40,
        decoder_start_token_id=3, eos_token_id=2, pad_token_id=0, bos_token_id=1,
        begin_suppress_tokens=None, suppress_tokens=None,
    )  # fmt: skip
    hf = transformers.WhisperForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for n, p in hf.named_parameters():
            if "layer_norm" in n:
                p.normal_(1.0 if n.endswith("weight") else 0.0, 0.3)
            elif p.ndim >= 2:
                p.normal_(0, 0.15)
    hf.save_pretrained(tmp_path)
    fe = transformers.WhisperFeatureExtractor(feature_size=40, chunk_length=1)
    fe.save_pretrained(tmp_path)
    return hf, fe


def _audio(n: int) -> np.ndarray:
    t = np.arange(n) / 16000
    rng = np.random.default_rng(0)
    return (0.3 * np.sin(2 * np.pi * 440 * t) * np.exp(-2 * t)
            + 0.05 * rng.normal(size=n)).astype(np.float32)  # fmt: skip


def _hf_greedy(hf, feats: np.ndarray, n: int) -> list[int]:
    ids = [hf.config.decoder_start_token_id]
    x = torch.from_numpy(feats)
    with torch.no_grad():
        for _ in range(n):
            lg = hf(input_features=x, decoder_input_ids=torch.tensor([ids])).logits[0, -1]
            ids.append(int(lg.argmax()))
    return ids[1:]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["interp", pytest.param("compiled", marks=needs_compiled)])
@pytest.mark.usefixtures("fast_compile")
def test_whisper_matches_transformers(backend: str, tmp_path) -> None:
    hf, fe = _whisper(tmp_path)
    s = load(tmp_path, backend=backend)
    assert isinstance(s, WhisperSession) and s.backend == backend
    audio = _audio(12345)  # shorter than the clip: zero padded as the extractor does
    feats = fe(audio, sampling_rate=16000, return_tensors="np")["input_features"]
    ours = s.encode(audio)["features"]
    assert ours.shape == feats.shape[1:] and np.abs(ours - feats[0]).max() <= 1e-4
    want = _hf_greedy(hf, feats, 16)
    assert s.transcribe(audio, 16, stop=[]) == want
    if backend == "compiled":  # both plans from the plan cache
        again = load(tmp_path, backend=backend)
        assert again.encoder.cached and again.decoder.cached
        assert again.transcribe(audio, 16, stop=[]) == want
    with pytest.raises(ValueError, match="samples"):
        s.encode(np.zeros(20000, np.float32))
