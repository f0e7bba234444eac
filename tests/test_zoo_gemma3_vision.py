"""Gemma 3 with images (``models/gemma3_vision.py``): a tiny random
``Gemma3ForConditionalGeneration`` (SigLIP tower, pooled projector, language model) saved
with ``save_pretrained`` and loaded with ``luminal.models.load``; image features, logits of a
prompt holding two images (bidirectional attention inside each image's tokens) and greedy
tokens against transformers, interpreter and compiled."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from luminal.models import load  # noqa: E402
from test_zoo_decoders import ARCHS, COMMON, _rel, needs_compiled  # noqa: E402

IMG = 96  # the image token
IDS = [1, 5, 17, 94, IMG, IMG, IMG, IMG, 95, 3, 42, 94, IMG, IMG, IMG, IMG, 95, 8, 60]


def _make(tmp_path):
    torch.manual_seed(0)
    text = {**COMMON, **ARCHS["gemma3"][2]}
    vision = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=2, image_size=56, patch_size=14)  # fmt: skip
    cfg = transformers.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                                    image_token_index=IMG, boi_token_index=94,
                                    eoi_token_index=95)  # fmt: skip
    hf = transformers.Gemma3ForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for n, p in hf.named_parameters():
            if "vision" not in n and "norm" in n:
                p.uniform_(-0.5, 0.5)  # Gemma's (1 + w) norms
            elif "norm" in n:
                p.normal_(1.0 if n.endswith("weight") else 0.0, 0.3)
            elif n.endswith("bias"):
                p.normal_(0, 0.3)
            else:
                p.normal_(0, 0.08 if "embed" not in n else 0.5)
    hf.save_pretrained(tmp_path)
    return hf


def _pixels() -> np.ndarray:
    return np.random.default_rng(0).uniform(-1, 1, (2, 3, 56, 56)).astype(np.float32)


def _hf(hf, ids: list[int], px: np.ndarray):
    tt = torch.tensor([[int(t == IMG) for t in ids]])
    with torch.no_grad():
        return hf(input_ids=torch.tensor([ids]), pixel_values=torch.from_numpy(px),
                  token_type_ids=tt).logits[0].numpy()  # fmt: skip


def _hf_greedy(hf, ids: list[int], px: np.ndarray, n: int) -> list[int]:
    tt = torch.tensor([[int(t == IMG) for t in ids]])
    with torch.no_grad():
        out = hf.generate(input_ids=torch.tensor([ids]), pixel_values=torch.from_numpy(px),
                          token_type_ids=tt, max_new_tokens=n, do_sample=False,
                          eos_token_id=None, pad_token_id=0)  # fmt: skip
    return out[0, len(ids) :].tolist()


def test_gemma3_images_match_transformers(tmp_path) -> None:
    hf = _make(tmp_path)
    px = _pixels()
    s = load(tmp_path, backend="interp")
    with torch.no_grad():
        feats = hf.model.get_image_features(torch.from_numpy(px)).pooler_output.numpy()
    assert _rel(s.image_features(px), feats) <= 1e-4
    ref = _hf(hf, IDS, px)
    g = s.model.build(logits="all", images=True)
    ids = np.asarray(IDS)
    index = np.where(ids == IMG, np.cumsum(ids == IMG) - 1, -1).astype(np.int32)
    blocks = np.where(ids == IMG, (np.arange(len(IDS)) >= 11).astype(np.int32), -1)
    out = g.run({"tokens": np.where(ids == IMG, 0, ids).astype(np.int32),
                 "image_features": feats.reshape(8, -1), "image_index": index,
                 "blocks": blocks.astype(np.int32), **s.model.new_cache()}, pos=0)  # fmt: skip
    assert _rel(out["logits"], ref) <= 1e-4
    # text first, then the images at later positions (the cached keys see no image block)
    s.forward(IDS[:3])
    assert _rel(s.forward_images(IDS[3:], px), ref[-1]) <= 1e-4
    s.reset()
    assert s.generate(IDS, 8, stop=[], images=px) == _hf_greedy(hf, IDS, px, 8)
    with pytest.raises(ValueError, match="8 image tokens in the prompt for 1 images of 4"):
        s.forward_images(IDS, px[:1])
    with pytest.raises(ValueError, match=r"pixels must be \(images, 3, 56, 56\)"):
        s.image_features(px[:, :, :28])


@needs_compiled
@pytest.mark.slow
def test_gemma3_images_compiled(tmp_path, monkeypatch) -> None:
    for flag in ("LUMINAL_SEARCH_SCHEDULES", "LUMINAL_SEARCH_LIBRARY", "LUMINAL_EGRAPH",
                 "LUMINAL_SEARCH_BUDGET_S"):  # fmt: skip
        monkeypatch.setenv(flag, "0")
    hf = _make(tmp_path)
    px = _pixels()
    s = load(tmp_path, backend="compiled", max_context=40)
    assert _rel(s.forward_images(IDS, px), _hf(hf, IDS, px)[-1]) <= 1e-4
    s.reset()
    assert s.generate(IDS, 8, stop=[], images=px) == _hf_greedy(hf, IDS, px, 8)
