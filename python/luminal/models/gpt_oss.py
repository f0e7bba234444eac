"""GPT-OSS: the zoo's decoder with three differences.

- Attention sinks: each head has a learned logit that joins every query's softmax as one
  more "key" with no value, so a head can put weight nowhere: p = exp(s - m) / (sum exp(s -
  m) + exp(sink - m)) with m the row's maximum over the scores and the sink.
- Experts: the router picks the top k by logit (with a bias) and softmaxes those k; experts
  have biases, (in, out) weights, interleaved gate/up columns and a clamped GLU:
  (clamp(up, -l, l) + 1) * g * sigmoid(alpha * g), g = min(gate, l). Routed experts'
  weights are GATHERed by id, as in ``decoder.py``.
YaRN RoPE (frequencies blended between interpolated and extrapolated by a ramp over the
dims, cos/sin scaled by the attention factor) is ``rope.py``'s, as for every decoder.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..functional import clamp, embedding, linear, matmul, sigmoid
from ..functional._nnbase import bool_to_bias, fmax
from ..graph import dtypes as dt
from ..tensor import Graph, Tensor
from .base import DictWeights
from .decoder import Decoder, DecoderConfig, _topk
from .decoder_configs import hf_config, hf_weights


class GptOss(Decoder):
    def __init__(self, config: DecoderConfig, weights: Any, max_context: int | None = None,
                 alpha: float = 1.702, limit: float = 7.0) -> None:  # fmt: skip
        super().__init__(config, weights, max_context)
        self.alpha, self.limit = alpha, limit

    def _key_extra(self) -> dict[str, Any]:
        return {"swiglu_alpha": self.alpha, "swiglu_limit": self.limit}

    def _attention(
        self, g: Graph, i: int, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float
    ) -> Tensor:
        hq, lq, e = q.shape
        hk = k.shape[0]
        assert isinstance(hq, int) and isinstance(hk, int)
        grp = hq // hk
        scores = matmul(q.reshape(hk, grp, lq, e), k.unsqueeze(1).permute(0, 1, 3, 2)).mul(scale)
        scores = scores.add(bool_to_bias(mask, scores.dtype))
        sink = self.weights.get(g, f"blk.{i}.attn_sinks.weight").reshape(hk, grp, 1, 1)
        m = scores.max_reduce(-1, keepdim=True)
        m = m.add(sink.expand(m.shape).add(m.mul(-1.0)).relu())  # max(m, sink)
        ex = scores.add(m.expand(scores.shape).mul(-1.0)).exp()
        denom = ex.sum_reduce(-1, keepdim=True).add(sink.expand(m.shape).add(m.mul(-1.0)).exp())
        out = matmul(ex.mul(denom.reciprocal().expand(ex.shape)), v.unsqueeze(1))
        return out.reshape(hq, lq, v.shape[-1])

    def _moe(self, g: Graph, p: str, h: Tensor) -> Tensor:
        c, w = self.config, self.weights
        seq = h.shape[0]
        logits = linear(h, w.get(g, p + "ffn_gate_inp.weight"), w.get(g, p + "ffn_gate_inp.bias"))
        vals, experts = _topk(logits, c.top_k, -fmax(dt.f32))
        exps = [t.add(vals[0].mul(-1.0)).exp() for t in vals]  # softmax over the k picked
        tot = exps[0]
        for t in exps[1:]:
            tot = tot.add(t)
        out: Tensor | None = None
        hr, hc = h.unsqueeze(1), h.unsqueeze(-1)  # (seq, 1, hidden), (seq, hidden, 1)
        fused = w.has(p + "oss_gate_up.weight")  # transformers: (in, out), gate/up interleaved
        packed = w.has(p + "ffn_gate_up_exps.weight")  # transformers MXFP4: (out, in) blocks
        for ex, e in zip(exps, experts, strict=True):
            if packed:
                gu = matmul(self._expert(g, p + "ffn_gate_up_exps.weight", e), hc)
                gu = gu.reshape(seq, -1).add(self._rows(g, p + "oss_gate_up.bias", e))
                n = gu.shape[1] // 2
                gate, up = gu.slice(1, 0, n, 2), gu.slice(1, 1, n, 2)
            elif fused:
                gu = matmul(hr, self._rows(g, p + "oss_gate_up.weight", e)).reshape(seq, -1)
                gu = gu.add(self._rows(g, p + "oss_gate_up.bias", e))
                n = gu.shape[1] // 2
                gate, up = gu.slice(1, 0, n, 2), gu.slice(1, 1, n, 2)
            else:  # GGUF: separate (out, in) matrices, packed blocks gathered by expert id
                gate, up = (
                    matmul(self._expert(g, f"{p}ffn_{k}_exps.weight", e), hc)
                    .reshape(seq, -1)
                    .add(self._rows(g, f"{p}ffn_{k}_exps.bias", e))
                    for k in ("gate", "up")
                )
            gate = clamp(gate, max=self.limit)
            up = clamp(up, -self.limit, self.limit)
            act = up.add(1.0).mul(gate.mul(sigmoid(gate.mul(self.alpha))))
            if packed:
                y = matmul(self._expert(g, p + "ffn_down_exps.weight", e), act.unsqueeze(-1))
                y = y.reshape(seq, -1).add(self._rows(g, p + "oss_down.bias", e))
            elif fused:
                y = matmul(act.unsqueeze(1), self._rows(g, p + "oss_down.weight", e))
                y = y.reshape(seq, -1).add(self._rows(g, p + "oss_down.bias", e))
            else:
                y = matmul(self._expert(g, p + "ffn_down_exps.weight", e), act.unsqueeze(-1))
                y = y.reshape(seq, -1).add(self._rows(g, p + "ffn_down_exps.bias", e))
            y = y.mul(ex.mul(tot.reciprocal()).unsqueeze(-1))
            out = y if out is None else out.add(y)
        assert out is not None
        return out

    def _rows(self, g: Graph, name: str, e: Tensor) -> Tensor:
        """Expert ``e[t]``'s slice of a (experts, ...) weight, for each token t (a GATHER)."""
        shape = self.weights.shape(name)
        flat = self.weights.get(g, name).reshape(shape[0], int(np.prod(shape[1:])))
        return embedding(e, flat).reshape(e.shape[0], *shape[1:])


_OSS_NAMES = {
    "mlp.router.weight": "ffn_gate_inp.weight",
    "mlp.router.bias": "ffn_gate_inp.bias",
    "mlp.experts.gate_up_proj": "oss_gate_up.weight",
    "mlp.experts.gate_up_proj_bias": "oss_gate_up.bias",
    "mlp.experts.down_proj": "oss_down.weight",
    "mlp.experts.down_proj_bias": "oss_down.bias",
    "self_attn.sinks": "attn_sinks.weight",
}


def gpt_oss_from_hf(
    config: dict[str, Any], arrays: dict[str, np.ndarray], max_context: int | None = None
) -> GptOss:
    """GPT-OSS from a transformers folder: bf16 / f32 experts, or an MXFP4 checkpoint
    (``quantization_config.quant_method: mxfp4``, experts as ``*_blocks`` / ``*_scales``),
    whose blocks enter the graph packed and are gathered by expert id."""
    cfg = hf_config(config)
    quant = (config.get("quantization_config") or {}).get("quant_method")
    if quant not in (None, "mxfp4"):
        raise NotImplementedError(f"gpt_oss: {quant!r}-quantized checkpoints (mxfp4 only)")
    rest, own = {}, {}
    packed: dict[str, tuple[str, np.ndarray]] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for k, a in arrays.items():
        parts = k.split(".")
        body = ".".join(parts[3:])
        if k.startswith("model.layers.") and body in _OSS_NAMES:
            own[f"blk.{parts[2]}.{_OSS_NAMES[body]}"] = a
        elif k.startswith("model.layers.") and body in _MXFP4_NAMES:
            name = f"blk.{parts[2]}.{_MXFP4_NAMES[body]}"
            scales = arrays.get(k.removesuffix("_blocks") + "_scales")
            if scales is None:
                raise KeyError(f"gpt_oss: {k} has no scales ({k.removesuffix('_blocks')}_scales)")
            packed[name] = ("MXFP4", mxfp4_blocks(a, scales))
            shapes[name] = (a.shape[0], a.shape[1], a.shape[2] * a.shape[3] * 2)
            own["packed_source." + k] = a  # named for the plan cache's weight identity
        elif not k.endswith("_scales"):
            rest[k] = a
    ws = hf_weights(cfg, rest, bool(config.get("tie_word_embeddings", False)))
    ws.update(own)
    src = PackedWeights(ws, packed, shapes) if packed else DictWeights(ws)
    return GptOss(cfg, src, max_context, float(config.get("swiglu_alpha", 1.702)),
                  float(config.get("swiglu_limit", 7.0)))  # fmt: skip


_MXFP4_NAMES = {
    "mlp.experts.gate_up_proj_blocks": "ffn_gate_up_exps.weight",
    "mlp.experts.down_proj_blocks": "ffn_down_exps.weight",
}


def mxfp4_blocks(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """transformers' MXFP4 experts (``blocks`` (..., groups, 16) u8 holding elements 2j / 2j+1
    in byte j's low / high nibble, ``scales`` (..., groups) e8m0) as ggml's block_mxfp4
    bytes (scale, then byte j holding elements j / j + 16), which ``loaders.quants`` reads."""
    b = np.asarray(blocks, np.uint8)
    s = np.asarray(scales, np.uint8)
    if b.shape[-1] != 16 or b.shape[:-1] != s.shape:
        raise ValueError(f"mxfp4: blocks {b.shape} do not match scales {s.shape}")
    codes = np.empty((*b.shape[:-1], 32), np.uint8)
    codes[..., 0::2], codes[..., 1::2] = b & 15, b >> 4
    out = np.empty((*b.shape[:-1], 17), np.uint8)
    out[..., 0] = s
    out[..., 1:] = codes[..., :16] | (codes[..., 16:] << 4)
    return out.reshape(-1)


class PackedWeights(DictWeights):
    """Arrays plus block-quantized tensors that enter the graph packed (``Decoder._packed``):
    name -> (format, bytes), with their logical shapes."""

    def __init__(self, arrays: dict[str, np.ndarray], packed: dict[str, tuple[str, np.ndarray]],
                 shapes: dict[str, tuple[int, ...]]) -> None:  # fmt: skip
        super().__init__(arrays)
        self.packed = packed
        self.shapes = shapes

    def has(self, name: str) -> bool:
        return name in self.packed or super().has(name)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.shapes[name] if name in self.packed else super().shape(name)


class GgufNames:
    """A GPT-OSS GGUF source under the names ``Decoder`` reads: llama.cpp calls the norm
    before the MLP ``post_attention_norm`` (the decoder's ``ffn_norm``)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @staticmethod
    def _name(name: str) -> str:
        return name.replace(".ffn_norm.", ".post_attention_norm.")

    def has(self, name: str) -> bool:
        return bool(self.inner.has(self._name(name)))

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.inner.shape(self._name(name)))

    def get(self, g: Graph, name: str) -> Tensor:
        return self.inner.get(g, self._name(name))

    def rows(self, g: Graph, name: str, idx: Tensor) -> Tensor:
        return self.inner.rows(g, self._name(name), idx)
