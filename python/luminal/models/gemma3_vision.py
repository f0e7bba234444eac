"""Gemma 3's image input: the SigLIP vision tower, the pooled projector and a session whose
prompts may hold images.

- Tower (graph ``pixels`` f32 (batch, 3, S, S) -> ``features`` (batch, mm_tokens, text
  hidden)): patch conv, learned positions, pre-norm encoder layers (LayerNorm, attention with
  biases, GELU-tanh MLP), final LayerNorm; then the projector: average pooling of the patch
  grid down to ``mm_tokens_per_image`` tokens, Gemma's (1 + w) RMSNorm, a matmul into the
  text model's width.
- Prompt: each image is a run of ``mm_tokens_per_image`` image tokens in the ids (the
  processor's ``<start_of_image>`` and ``<end_of_image>`` around it are ordinary tokens).
  Those positions take the image's features instead of token embeddings (unscaled), and the
  positions of one image attend to each other both ways (transformers' ``token_type_ids``
  blocks); everything else is the language model's ``Decoder`` graph with ``images=True``.
  Its KV cache is the session's, so decode steps continue on the text plans.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..functional import avg_pool2d, conv2d, gelu, layer_norm, linear, rms_norm
from ..functional import scaled_dot_product_attention as sdpa
from ..graph import symbolic as sym
from ..tensor import Graph, Tensor
from .base import DictWeights, Runner
from .decoder import F32Weights
from .session import LMSession


@dataclass
class VisionConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    image_size: int
    patch_size: int
    num_channels: int = 3
    layer_norm_eps: float = 1e-6
    hidden_act: str = "gelu_pytorch_tanh"
    mm_tokens_per_image: int = 256
    text_hidden_size: int = 0

    @staticmethod
    def from_hf(c: dict[str, Any]) -> VisionConfig:
        v = c["vision_config"]
        act = v.get("hidden_act", "gelu_pytorch_tanh")
        if act not in ("gelu_pytorch_tanh", "gelu"):
            raise NotImplementedError(f"gemma3 vision: activation {act!r}")
        cfg = VisionConfig(
            v["hidden_size"], v["intermediate_size"], v["num_hidden_layers"],
            v["num_attention_heads"], v["image_size"], v["patch_size"], v.get("num_channels", 3),
            float(v.get("layer_norm_eps", 1e-6)), act, int(c.get("mm_tokens_per_image", 256)),
            int(c["text_config"]["hidden_size"]),
        )  # fmt: skip
        side, per = cfg.patches, int(round(cfg.mm_tokens_per_image**0.5))
        if per * per != cfg.mm_tokens_per_image or side % per:
            raise ValueError(
                f"gemma3 vision: {cfg.mm_tokens_per_image} tokens per image do not pool a "
                f"{side}x{side} patch grid"
            )
        return cfg

    @property
    def patches(self) -> int:
        return self.image_size // self.patch_size


class SiglipTower:
    """The vision tower and projector over transformers' names (``vision_prefix`` ...
    ``embeddings.patch_embedding.weight``, ``proj_prefix`` ... ``mm_input_projection_weight``)."""

    def __init__(self, config: VisionConfig, weights: Any, vision_prefix: str,
                 proj_prefix: str) -> None:  # fmt: skip
        self.config = config
        self.weights = weights
        self.vp, self.pp = vision_prefix, proj_prefix

    def _lin(self, g: Graph, x: Tensor, name: str) -> Tensor:
        w = self.weights
        return linear(x, w.get(g, self.vp + name + ".weight"), w.get(g, self.vp + name + ".bias"))

    def _ln(self, g: Graph, x: Tensor, name: str) -> Tensor:
        c, w = self.config, self.weights
        return layer_norm(x, c.hidden_size, w.get(g, self.vp + name + ".weight"),
                          w.get(g, self.vp + name + ".bias"), c.layer_norm_eps)  # fmt: skip

    def build(self, name: str = "gemma3_vision") -> Graph:
        c, w = self.config, self.weights
        g = Graph(name)
        batch = sym.dim("batch", 1, 64)
        s, p, d = c.image_size, c.patches, c.hidden_size
        x = g.input("pixels", (batch, c.num_channels, s, s))
        x = conv2d(x, w.get(g, self.vp + "embeddings.patch_embedding.weight"),
                   w.get(g, self.vp + "embeddings.patch_embedding.bias"), c.patch_size)  # fmt: skip
        x = x.reshape(batch, d, p * p).permute(0, 2, 1)  # (batch, patches, hidden)
        x = x.add(w.get(g, self.vp + "embeddings.position_embedding.weight").unsqueeze(0))
        heads = c.num_attention_heads
        hd = d // heads
        approx = "tanh" if c.hidden_act == "gelu_pytorch_tanh" else "none"

        def split(t: Tensor) -> Tensor:
            return t.reshape(batch, p * p, heads, hd).permute(0, 2, 1, 3)

        for i in range(c.num_hidden_layers):
            q = f"encoder.layers.{i}."
            h = self._ln(g, x, q + "layer_norm1")
            qh, kh, vh = (split(self._lin(g, h, q + f"self_attn.{k}_proj")) for k in "qkv")
            o = sdpa(qh, kh, vh).permute(0, 2, 1, 3).reshape(batch, p * p, d)
            x = x.add(self._lin(g, o, q + "self_attn.out_proj"))
            h = gelu(self._lin(g, self._ln(g, x, q + "layer_norm2"), q + "mlp.fc1"), approx)
            x = x.add(self._lin(g, h, q + "mlp.fc2"))
        x = self._ln(g, x, "post_layernorm")
        # the projector: pool the patch grid to mm_tokens_per_image tokens, norm, project
        per = int(round(c.mm_tokens_per_image**0.5))
        grid = x.permute(0, 2, 1).reshape(batch, d, p, p)
        pooled = avg_pool2d(grid, p // per, p // per).reshape(batch, d, per * per).permute(0, 2, 1)
        norm_w = w.get(g, self.pp + "mm_soft_emb_norm.weight").add(1.0)
        normed = rms_norm(pooled, d, norm_w, c.layer_norm_eps)
        proj = w.get(g, self.pp + "mm_input_projection_weight")  # (vision hidden, text hidden)
        g.output("features", normed.reshape(batch * per * per, d).matmul(proj)
                 .reshape(batch, per * per, c.text_hidden_size))  # fmt: skip
        return g


def tower_from_hf(config: dict[str, Any], arrays: dict[str, np.ndarray]) -> SiglipTower:
    def prefix(suffix: str) -> str:
        hits = [k[: -len(suffix)] for k in arrays if k.endswith(suffix)]
        if len(hits) != 1:
            raise KeyError(f"gemma3: no single {suffix!r} in the checkpoint (found {hits})")
        return hits[0]

    vp = prefix("embeddings.patch_embedding.weight")
    pp = prefix("mm_input_projection_weight")
    return SiglipTower(VisionConfig.from_hf(config), F32Weights(DictWeights(arrays)), vp, pp)


class Gemma3Session(LMSession):
    """A Gemma 3 language model session whose prompts may hold images: ``generate(prompt,
    ..., images=pixels)`` / ``forward_images(ids, pixels)``; text steps are
    ``LMSession``'s."""

    def __init__(self, model: Any, tower: SiglipTower, image_token_id: int, tokenizer: Any = None,
                 backend: str = "auto", quiet: bool = True) -> None:  # fmt: skip
        super().__init__(model, tokenizer, backend, quiet)
        self.tower = tower
        self.image_token_id = int(image_token_id)
        self._backend_choice, self._quiet = backend, quiet
        self._vision: Runner | None = None
        self._mm: Runner | None = None

    def _runners(self) -> tuple[Runner, Runner]:
        if self._vision is None or self._mm is None:
            t, m = self.tower, self.model
            ident = getattr(t.weights, "identity", None)
            key = None
            if ident is not None:
                key = {"model": "Gemma3Vision", "config": asdict(t.config), "weights": ident()}
            self._vision = Runner(t.build, self._backend_choice, self._quiet, key=key,
                                  name="gemma3_vision")  # fmt: skip
            self._mm = Runner(lambda: m.build(name="gemma3_images", images=True),
                              self._backend_choice, self._quiet,
                              key=m.cache_key("images"), name="gemma3_images")  # fmt: skip
        return self._vision, self._mm

    def image_features(self, pixels: np.ndarray) -> np.ndarray:
        """(images, mm_tokens_per_image, text hidden) for pixels (images, 3, S, S)."""
        c = self.tower.config
        x = np.asarray(pixels, np.float32)
        want = (c.num_channels, c.image_size, c.image_size)
        if x.ndim != 4 or x.shape[1:] != want:
            raise ValueError(f"pixels must be (images, {', '.join(map(str, want))}), got {x.shape}")
        return self._runners()[0]({"pixels": x})["features"]

    def forward_images(self, tokens: list[int] | np.ndarray, pixels: np.ndarray) -> np.ndarray:
        """Run ``tokens`` (with one run of image tokens per image, in order) at the next
        positions; the last position's logits."""
        ids = np.asarray(tokens, np.int64).reshape(-1)
        mm = self.tower.config.mm_tokens_per_image
        is_img = ids == self.image_token_id
        feats = self.image_features(pixels)
        if int(is_img.sum()) != feats.shape[0] * mm:
            raise ValueError(
                f"{int(is_img.sum())} image tokens in the prompt for {feats.shape[0]} images of "
                f"{mm} tokens each"
            )
        if self.pos + ids.size > self.model.ctx:
            raise ValueError(
                f"context full: {self.pos} cached + {ids.size} new tokens exceed the context "
                f"limit of {self.model.ctx} tokens"
            )
        index = np.full(ids.size, -1, np.int32)
        index[is_img] = np.arange(int(is_img.sum()), dtype=np.int32)
        starts = is_img & ~np.concatenate([[False], is_img[:-1]])
        blocks = np.where(is_img, np.cumsum(starts) - 1, -1).astype(np.int32)
        vocab = self.model.config.vocab_size
        text = np.where(is_img, 0, ids)  # the image token may lie past the vocabulary
        if text.min() < 0 or text.max() >= vocab:
            raise ValueError(f"token ids must be in [0, {vocab}), got {text.min()}..{text.max()}")
        text = text.astype(np.int32)
        inputs = {"tokens": text, "image_features": feats.reshape(-1, feats.shape[-1]),
                  "image_index": index, "blocks": blocks, **self.cache}  # fmt: skip
        out = self._runners()[1](inputs, pos=self.pos)
        for n in self.cache:
            self.cache[n] = out[n + "_new"]
        self.pos += ids.size
        return out["logits"][-1]

    def _prefill(self, ids: list[int], images: np.ndarray | None) -> np.ndarray:
        return self.forward(ids) if images is None else self.forward_images(ids, images)
