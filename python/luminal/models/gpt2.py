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
