"""Image classifiers from transformers folders: ResNet (basic and bottleneck blocks) and ViT.

One graph with a symbolic ``batch``: input ``pixels`` f32 (batch, channels, height, width),
output ``logits`` (batch, labels). ResNet's batch norms are written as a per-channel scale
and shift of the convolution before them, both weight-only expressions; the graph's weight
expressions are folded before compiling (``compiler.fold``), so the plan convolves with the
folded weights and no normalization is left at run time. Weights keep transformers' names.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..functional import adaptive_avg_pool2d, conv2d, gelu, layer_norm, linear, max_pool2d, relu
from ..functional import scaled_dot_product_attention as sdpa
from ..graph import symbolic as sym
from ..tensor import Graph, Tensor
from .base import DictWeights, Runner
from .decoder import F32Weights


@dataclass
class ResNetConfig:
    num_channels: int = 3
    embedding_size: int = 64
    hidden_sizes: list[int] = field(default_factory=lambda: [256, 512, 1024, 2048])
    depths: list[int] = field(default_factory=lambda: [3, 4, 6, 3])
    layer_type: str = "bottleneck"
    downsample_in_first_stage: bool = False
    downsample_in_bottleneck: bool = False
    num_labels: int = 1000
    image_size: int = 224

    @staticmethod
    def from_hf(c: dict[str, Any]) -> ResNetConfig:
        if c.get("hidden_act", "relu") != "relu":
            raise NotImplementedError(f"ResNet activation {c['hidden_act']!r} (only relu)")
        if c.get("layer_type", "bottleneck") not in ("basic", "bottleneck"):
            raise NotImplementedError(f"ResNet layer_type {c['layer_type']!r}")
        return ResNetConfig(
            c.get("num_channels", 3), c["embedding_size"], list(c["hidden_sizes"]),
            list(c["depths"]), c.get("layer_type", "bottleneck"),
            bool(c.get("downsample_in_first_stage", False)),
            bool(c.get("downsample_in_bottleneck", False)),
            len(c.get("id2label") or {}) or int(c.get("num_labels", 1000)),
        )  # fmt: skip


class ResNet:
    """``ResNetForImageClassification`` (inference)."""

    eps = 1e-5  # nn.BatchNorm2d's default, which transformers' ResNet uses

    def __init__(self, config: ResNetConfig, weights: Any) -> None:
        self.config = config
        self.weights = weights

    def _conv_bn(self, g: Graph, x: Tensor, p: str, stride: int, act: bool) -> Tensor:
        """conv (no bias) + batch norm as one conv: w * s per output channel, plus b - m * s,
        with s = gamma / sqrt(var + eps): weight-only, folded before compiling."""
        w = self.weights
        k = w.get(g, p + "convolution.weight")
        n = p + "normalization."
        s = w.get(g, n + "weight").mul(
            w.get(g, n + "running_var").add(self.eps).sqrt().reciprocal()
        )
        shift = w.get(g, n + "bias").add(w.get(g, n + "running_mean").mul(s).mul(-1.0))
        ks = k.shape[-1]
        assert isinstance(ks, int)
        y = conv2d(x, k.mul(s.reshape(-1, 1, 1, 1)), shift, stride, ks // 2)
        return relu(y) if act else y

    def build(self, name: str = "resnet") -> Graph:
        c = self.config
        g = Graph(name)
        batch = sym.dim("batch", 1, 1024)
        h, wd = sym.dim("height", 1, 4096), sym.dim("width", 1, 4096)
        x = g.input("pixels", (batch, c.num_channels, h, wd))
        x = self._conv_bn(g, x, "resnet.embedder.embedder.", 2, True)
        x = max_pool2d(x, 3, 2, 1)
        cin = c.embedding_size
        for si, (cout, depth) in enumerate(zip(c.hidden_sizes, c.depths, strict=True)):
            for li in range(depth):
                stride = (2 if si > 0 or c.downsample_in_first_stage else 1) if li == 0 else 1
                x = self._layer(g, x, f"resnet.encoder.stages.{si}.layers.{li}.", cin, cout, stride)
                cin = cout
        x = adaptive_avg_pool2d(x, 1).reshape(batch, cin)
        g.output("logits", linear(x, self.weights.get(g, "classifier.1.weight"),
                                  self.weights.get(g, "classifier.1.bias")))  # fmt: skip
        return g

    def _layer(self, g: Graph, x: Tensor, p: str, cin: int, cout: int, stride: int) -> Tensor:
        c = self.config
        short = x
        if cin != cout or stride != 1:
            short = self._conv_bn(g, x, p + "shortcut.", stride, False)
        if c.layer_type == "basic":
            y = self._conv_bn(g, x, p + "layer.0.", stride, True)
            y = self._conv_bn(g, y, p + "layer.1.", 1, False)
        else:
            first = stride if c.downsample_in_bottleneck else 1
            y = self._conv_bn(g, x, p + "layer.0.", first, True)
            y = self._conv_bn(g, y, p + "layer.1.", 1 if c.downsample_in_bottleneck else stride,
                              True)  # fmt: skip
            y = self._conv_bn(g, y, p + "layer.2.", 1, False)
        return relu(y.add(short))


@dataclass
class ViTConfig:
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    image_size: int = 224
    patch_size: int = 16
    num_channels: int = 3
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"
    num_labels: int = 1000

    @staticmethod
    def from_hf(c: dict[str, Any]) -> ViTConfig:
        act = c.get("hidden_act", "gelu")
        if act not in ("gelu", "gelu_new", "gelu_pytorch_tanh"):
            raise NotImplementedError(f"ViT activation {act!r}")
        return ViTConfig(
            c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"],
            c["intermediate_size"], c["image_size"], c["patch_size"], c.get("num_channels", 3),
            float(c.get("layer_norm_eps", 1e-12)), act,
            len(c.get("id2label") or {}) or int(c.get("num_labels", 1000)),
        )  # fmt: skip


class ViT:
    """``ViTForImageClassification`` (inference, at the configured image size)."""

    def __init__(self, config: ViTConfig, weights: Any) -> None:
        self.config = config
        self.weights = weights

    def _lin(self, g: Graph, x: Tensor, name: str) -> Tensor:
        return linear(x, self.weights.get(g, name + ".weight"), self.weights.get(g, name + ".bias"))

    def _ln(self, g: Graph, x: Tensor, name: str) -> Tensor:
        c, w = self.config, self.weights
        return layer_norm(x, c.hidden_size, w.get(g, name + ".weight"), w.get(g, name + ".bias"),
                          c.layer_norm_eps)  # fmt: skip

    def build(self, name: str = "vit") -> Graph:
        c, w = self.config, self.weights
        g = Graph(name)
        batch = sym.dim("batch", 1, 1024)
        x = g.input("pixels", (batch, c.num_channels, c.image_size, c.image_size))
        p = "vit.embeddings."
        x = conv2d(x, w.get(g, p + "patch_embeddings.projection.weight"),
                   w.get(g, p + "patch_embeddings.projection.bias"), c.patch_size)  # fmt: skip
        n = (c.image_size // c.patch_size) ** 2
        d = c.hidden_size
        x = x.reshape(batch, d, n).permute(0, 2, 1)  # (batch, patches, hidden)
        cls = w.get(g, p + "cls_token").reshape(1, 1, d).expand(batch, 1, d)
        x = cls.pad_dim(1, 0, n).add(x.pad_dim(1, 1, 0))  # [CLS] then the patches
        x = x.add(w.get(g, p + "position_embeddings").reshape(1, n + 1, d))
        heads, hd = c.num_attention_heads, d // c.num_attention_heads

        def split(t: Tensor) -> Tensor:
            return t.reshape(batch, n + 1, heads, hd).permute(0, 2, 1, 3)

        approx = "none" if c.hidden_act == "gelu" else "tanh"
        for i in range(c.num_hidden_layers):
            q = f"vit.encoder.layer.{i}."
            h = self._ln(g, x, q + "layernorm_before")
            qh, kh, vh = (split(self._lin(g, h, q + f"attention.attention.{k}"))
                          for k in ("query", "key", "value"))  # fmt: skip
            o = sdpa(qh, kh, vh).permute(0, 2, 1, 3).reshape(batch, n + 1, d)
            x = x.add(self._lin(g, o, q + "attention.output.dense"))
            h = gelu(self._lin(g, self._ln(g, x, q + "layernorm_after"), q + "intermediate.dense"),
                     approx)  # fmt: skip
            x = x.add(self._lin(g, h, q + "output.dense"))
        x = self._ln(g, x, "vit.layernorm").slice(1, 0, 1).reshape(batch, d)
        g.output("logits", self._lin(g, x, "classifier"))
        return g


def vision_from_hf(config: dict[str, Any], arrays: dict[str, np.ndarray]) -> ResNet | ViT:
    mt = config.get("model_type")
    if mt == "resnet":
        return ResNet(ResNetConfig.from_hf(config), F32Weights(DictWeights(arrays)))
    if mt == "vit":
        return ViT(ViTConfig.from_hf(config), F32Weights(DictWeights(arrays)))
    raise NotImplementedError(f"model_type {mt!r} is not an image model luminal knows")


class ImageModel:
    """An image classifier ready to run: ``forward(pixels)`` -> logits (batch, labels).
    Weight-only expressions (ResNet's batch norms) are folded into the weights first; the
    compiled plan is kept in the plan cache. ``graph`` is the graph the interpreter runs
    (None when compiled)."""

    def __init__(self, model: ResNet | ViT, backend: str = "auto", quiet: bool = True) -> None:
        from ..compiler.fold import fold_weights

        self.model = model
        self.config = model.config
        ident = getattr(model.weights, "identity", None)
        key = None
        if ident is not None:
            key = {"model": type(model).__name__, "config": asdict(model.config),
                   "weights": ident()}  # fmt: skip
        # with a key the plan cache may hold the plan: the graph is built only when needed
        self.runner = Runner(lambda: fold_weights(model.build()), backend, quiet, key=key,
                             name=type(model).__name__.lower())  # fmt: skip
        self.graph = self.runner.graph

    @property
    def backend(self) -> str:
        return self.runner.backend

    def forward(self, pixels: np.ndarray) -> np.ndarray:
        x = np.asarray(pixels, np.float32)
        ch = self.config.num_channels
        if x.ndim != 4 or x.shape[1] != ch:
            raise ValueError(f"pixels must be (batch, {ch}, height, width), got {x.shape}")
        if isinstance(self.model, ViT):
            s = self.config.image_size
            if x.shape[2:] != (s, s):
                raise ValueError(f"this ViT takes {s}x{s} images, got {x.shape[2]}x{x.shape[3]}")
        return self.runner({"pixels": x})["logits"]

    __call__ = forward
