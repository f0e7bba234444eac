"""Image models through ``luminal.models.load``: tiny random transformers ResNets (basic and
bottleneck blocks, random batch-norm statistics) and a ViT, saved with ``save_pretrained``,
against transformers on random images of odd sizes (interpreter and compiled)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from luminal.graph.ops import Op  # noqa: E402
from luminal.models import load  # noqa: E402
from luminal.models.vision import ImageModel  # noqa: E402
from test_zoo_decoders import _rel, fast_compile, needs_compiled  # noqa: E402, F401


def _resnet(tmp_path, layer_type: str):
    torch.manual_seed(0)
    cfg = transformers.ResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16], depths=[1, 2], layer_type=layer_type,
        num_labels=5, downsample_in_bottleneck=layer_type == "bottleneck",
    )  # fmt: skip
    hf = transformers.ResNetForImageClassification(cfg).eval()
    with torch.no_grad():  # batch norms with real statistics, so folding them shows
        for n, b in hf.named_buffers():
            if n.endswith("running_mean"):
                b.normal_(0, 0.5)
            elif n.endswith("running_var"):
                b.uniform_(0.5, 2.0)
        for n, p in hf.named_parameters():
            if "normalization" in n:
                p.normal_(1.0 if n.endswith("weight") else 0.0, 0.3)
    hf.save_pretrained(tmp_path)
    return hf


def _vit(tmp_path):
    torch.manual_seed(0)
    cfg = transformers.ViTConfig(
        image_size=20, patch_size=4, hidden_size=48, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=80, num_labels=7,
    )  # fmt: skip
    hf = transformers.ViTForImageClassification(cfg).eval()
    with torch.no_grad():
        for n, p in hf.named_parameters():
            if "layernorm" in n:
                p.normal_(1.0 if n.endswith("weight") else 0.0, 0.3)
    hf.save_pretrained(tmp_path)
    return hf


def _ref(hf, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return hf(pixel_values=torch.from_numpy(x)).logits.numpy()


CASES = ["resnet-basic", "resnet-bottleneck", "vit"]


def _make(case: str, tmp_path):
    return _vit(tmp_path) if case == "vit" else _resnet(tmp_path, case.split("-")[1])


def _images(case: str, batch: int) -> np.ndarray:
    rng = np.random.default_rng(1)
    hw = (20, 20) if case == "vit" else (27, 33)
    return rng.normal(size=(batch, 3, *hw)).astype(np.float32)


@pytest.mark.parametrize("case", CASES)
def test_image_models_match_transformers(case: str, tmp_path) -> None:
    hf = _make(case, tmp_path)
    m = load(tmp_path, backend="interp")
    assert isinstance(m, ImageModel)
    for batch in (1, 3):
        x = _images(case, batch)
        assert _rel(m.forward(x), _ref(hf, x)) <= 1e-4
    if case != "vit":  # batch norm folded into the convolutions: no statistics left
        assert not any(n.startswith("resnet") and "running" in n for n in m.graph.inputs)
        assert sum(n.op is Op.SQRT for n in m.graph.nodes) == 0
    with pytest.raises(ValueError, match="pixels"):
        m.forward(np.zeros((3, 20, 20), np.float32))


@needs_compiled
@pytest.mark.parametrize("case", ["resnet-bottleneck", pytest.param("vit", marks=pytest.mark.slow)])
@pytest.mark.usefixtures("fast_compile")
def test_image_models_compiled(case: str, tmp_path) -> None:
    hf = _make(case, tmp_path)
    m = load(tmp_path, backend="compiled")
    assert m.backend == "compiled" and not m.runner.cached
    x = _images(case, 2)
    assert _rel(m.forward(x), _ref(hf, x)) <= 1e-4
    again = load(tmp_path, backend="compiled")  # from the plan cache
    assert again.runner.cached and _rel(again.forward(x), _ref(hf, x)) <= 1e-4
