"""GPT-2 as one luminal graph: learned positions, pre-LayerNorm blocks, tanh-GELU MLP, tied
output embedding. The KV cache works as in ``llama.py`` (SCATTER at ``pos``, symbolic
``seq`` and ``pos``), so ``LlamaSession`` drives it as well.

Weights use transformers' names (``transformer.h.0.attn.c_attn.weight`` ...); its Conv1D
weights are (in, out), read transposed through a view.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..functional import causal_mask, embedding, gelu, layer_norm, linear
from ..functional import scaled_dot_product_attention as sdpa
from ..graph import dtypes as dt
from ..graph import symbolic as sym
from ..graph.ops import Op
from ..graph.view import idx_vars
from ..tensor import Graph, Tensor
from .base import DictWeights


@dataclass
class GPT2Config:
    vocab_size: int = 50257
    n_positions: int = 1024
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    layer_norm_epsilon: float = 1e-5

    @staticmethod
    def from_hf(c: dict[str, Any]) -> GPT2Config:
        return GPT2Config(c["vocab_size"], c["n_positions"], c["n_embd"], c["n_layer"], c["n_head"],
                          float(c.get("layer_norm_epsilon", 1e-5)))  # fmt: skip

    @property
    def context_length(self) -> int:
        return self.n_positions


class GPT2:
    def __init__(
        self, config: GPT2Config, weights: DictWeights, max_context: int | None = None
    ) -> None:
        self.config = config
        self.weights = weights
        self.ctx = min(max_context or config.n_positions, config.n_positions)

    def cache_names(self) -> list[str]:
        return [f"{kv}_cache_{i}" for i in range(self.config.n_layer) for kv in ("k", "v")]

    @property
    def state(self) -> dict[str, str]:
        return {n + "_new": n for n in self.cache_names()}

    def new_cache(self) -> dict[str, np.ndarray]:
        return {n: np.zeros((self.ctx, self.config.n_embd), np.float32) for n in self.cache_names()}

    def _w(self, g: Graph, name: str) -> Tensor:
        return self.weights.get(g, name)

    def _ln(self, g: Graph, x: Tensor, name: str) -> Tensor:
        c = self.config
        w, b = self._w(g, name + ".weight"), self._w(g, name + ".bias")
        return layer_norm(x, c.n_embd, w, b, c.layer_norm_epsilon)

    def _conv1d(self, g: Graph, x: Tensor, name: str) -> Tensor:
        return linear(x, self._w(g, name + ".weight").permute(1, 0), self._w(g, name + ".bias"))

    def build(self, logits: str = "last", name: str = "gpt2") -> Graph:
        """Inputs ``tokens`` i32 (seq,) and the caches; dims ``seq`` and ``pos``; outputs
        ``logits`` ((1 or seq), vocab) and ``<cache>_new``."""
        c = self.config
        g = Graph(name)
        seq, pos = sym.dim("seq", 1, self.ctx), sym.dim("pos", 0, self.ctx - 1)
        tokens = g.input("tokens", (seq,), dt.i32)
        wte = self._w(g, "transformer.wte.weight")
        x = embedding(tokens, wte).add(self._w(g, "transformer.wpe.weight").slice(0, pos, seq))
        hd, total = c.n_embd // c.n_head, sym.add(pos, seq)
        mask = causal_mask(g, seq, total, pos)
        for i in range(c.n_layer):
            p = f"transformer.h.{i}."
            qkv = self._conv1d(g, self._ln(g, x, p + "ln_1"), p + "attn.c_attn")
            q, k, v = (qkv.slice(1, j * c.n_embd, c.n_embd) for j in range(3))
            ks = self._cache(g, f"k_cache_{i}", k, seq, pos, total)
            vs = self._cache(g, f"v_cache_{i}", v, seq, pos, total)

            def heads(t: Tensor, n: Any) -> Tensor:
                return t.reshape(n, c.n_head, hd).permute(1, 0, 2)

            o = sdpa(heads(q, seq), heads(ks, total), heads(vs, total), attn_mask=mask)
            o = o.permute(1, 0, 2).reshape(seq, c.n_embd)
            x = x.add(self._conv1d(g, o, p + "attn.c_proj"))
            h = gelu(self._conv1d(g, self._ln(g, x, p + "ln_2"), p + "mlp.c_fc"), "tanh")
            x = x.add(self._conv1d(g, h, p + "mlp.c_proj"))
        x = self._ln(g, x, "transformer.ln_f")
        if logits == "last":
            x = x.slice(0, sym.add(seq, -1), 1)
        g.output("logits", linear(x, wte))
        return g

    def _cache(self, g: Graph, name: str, new: Tensor, seq: Any, pos: Any, total: Any) -> Tensor:
        cache = g.input(name, (self.ctx, self.config.n_embd), dt.f32)
        rows = Tensor(
            g.add_op(Op.IOTA, [], arg=sym.add(pos, idx_vars((seq,))[0]), shape=(seq,), dtype=dt.i32)
        )
        srcs = [cache.edge, rows.edge, new.edge]
        updated = Tensor(g.add_op(Op.SCATTER, srcs))
        g.output(name + "_new", updated, updates=name)
        return updated.slice(0, 0, total)


def from_hf(
    config: dict[str, Any], arrays: dict[str, np.ndarray], max_context: int | None = None
) -> GPT2:
    ws = {
        ("transformer." + k if not k.startswith(("transformer.", "lm_head")) else k): v
        for k, v in arrays.items()
    }
    return GPT2(GPT2Config.from_hf(config), DictWeights(ws), max_context)


# transformers name -> GGUF name (llama.cpp's converter); Conv1D weights are stored (out, in)
_GGUF_TOP = {"transformer.wte.weight": "token_embd.weight",
             "transformer.wpe.weight": "position_embd.weight",
             "transformer.ln_f.weight": "output_norm.weight",
             "transformer.ln_f.bias": "output_norm.bias"}  # fmt: skip
_GGUF_LAYER = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output",
               "ln_2": "ffn_norm", "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}  # fmt: skip


class GgufGpt2Weights:
    """A GPT-2 GGUF source under transformers' names, Conv1D weights seen as (in, out)
    through a transposed view (no copy; block formats stay packed in the graph)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @staticmethod
    def _name(name: str) -> tuple[str, bool]:
        if name in _GGUF_TOP:
            return _GGUF_TOP[name], False
        parts = name.split(".")
        if parts[:2] != ["transformer", "h"] or len(parts) < 5:
            raise KeyError(f"gpt2: no GGUF tensor for {name!r}")
        mod, leaf = ".".join(parts[3:-1]), parts[-1]
        if mod not in _GGUF_LAYER:
            raise KeyError(f"gpt2: no GGUF tensor for {name!r}")
        return f"blk.{parts[2]}.{_GGUF_LAYER[mod]}.{leaf}", leaf == "weight" and "ln_" not in mod

    def has(self, name: str) -> bool:
        try:
            return bool(self.inner.has(self._name(name)[0]))
        except KeyError:
            return False

    def get(self, g: Graph, name: str) -> Tensor:
        gname, conv = self._name(name)
        t = self.inner.get(g, gname)
        t = t.cast(dt.f32) if t.dtype is not dt.f32 else t
        return t.permute(1, 0) if conv else t


def gpt2_from_gguf(f: Any, weights: Any, max_context: int | None = None) -> GPT2:
    """GPT-2 from a GGUF file (``general.architecture = gpt2``)."""

    need = f.need_arch_key

    cfg = GPT2Config(int(f.shape("token_embd.weight")[0]), int(need("context_length")),
                     int(need("embedding_length")), int(need("block_count")),
                     int(need("attention.head_count")),
                     float(f.arch_key("attention.layer_norm_epsilon", 1e-5)))  # fmt: skip
    return GPT2(cfg, GgufGpt2Weights(weights), max_context)  # type: ignore[arg-type]
