"""BERT encoders (all-MiniLM-L6-v2 and friends) with mean pooling and L2 normalization:
sentence embeddings as sentence-transformers computes them.

One graph with symbolic ``batch`` and ``seq``: inputs ``input_ids`` and ``attention_mask``
(i32, 1 for tokens and 0 for padding, shape (batch, seq)); outputs ``embeddings`` (batch,
hidden) and ``last_hidden_state``.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..functional import embedding, gelu, layer_norm, linear, normalize
from ..functional import scaled_dot_product_attention as sdpa
from ..graph import dtypes as dt
from ..graph import symbolic as sym
from ..tensor import Graph, Tensor
from .base import DictWeights, Runner


@dataclass
class BertConfig:
    vocab_size: int = 30522
    hidden_size: int = 384
    n_layers: int = 6
    n_heads: int = 12
    intermediate_size: int = 1536
    max_position: int = 512
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"

    @staticmethod
    def from_hf(c: dict[str, Any]) -> BertConfig:
        if c.get("model_type", "bert") != "bert":
            raise NotImplementedError(f"model_type {c.get('model_type')!r} is not a BERT encoder")
        act = c.get("hidden_act", "gelu")
        if act not in ("gelu", "gelu_new", "gelu_pytorch_tanh"):
            raise NotImplementedError(f"BERT activation {act!r} is not supported")
        return BertConfig(
            c["vocab_size"],
            c["hidden_size"],
            c["num_hidden_layers"],
            c["num_attention_heads"],
            c["intermediate_size"],
            c.get("max_position_embeddings", 512),
            float(c.get("layer_norm_eps", 1e-12)),
            act,
        )


class Bert:
    def __init__(self, config: BertConfig, weights: DictWeights) -> None:
        self.config = config
        self.weights = weights

    @staticmethod
    def from_dir(path: str | os.PathLike[str]) -> Bert:
        """A sentence-transformers / transformers folder (``config.json``,
        ``model.safetensors``)."""
        from ..loaders.safetensors import SafetensorsFile

        path = os.fspath(path)
        with open(os.path.join(path, "config.json")) as fh:
            cfg = BertConfig.from_hf(json.load(fh))
        st = SafetensorsFile(os.path.join(path, "model.safetensors"))
        arrays = {k.removeprefix("bert."): st[k] for k in st.keys()}
        return Bert(cfg, DictWeights(arrays))

    def cache_key(self) -> dict[str, Any]:
        """What determines the plan of ``build()`` without building it (plan cache key)."""
        return {"model": "bert", "config": asdict(self.config), "weights": self.weights.identity()}

    def _w(self, g: Graph, name: str) -> Tensor:
        return self.weights.get(g, name)

    def _lin(self, g: Graph, x: Tensor, name: str) -> Tensor:
        return linear(x, self._w(g, name + ".weight"), self._w(g, name + ".bias"))

    def _ln(self, g: Graph, x: Tensor, name: str) -> Tensor:
        c = self.config
        return layer_norm(
            x,
            c.hidden_size,
            self._w(g, name + ".weight"),
            self._w(g, name + ".bias"),
            c.layer_norm_eps,
        )

    def build(self, name: str = "bert") -> Graph:
        c = self.config
        g = Graph(name)
        batch, seq = sym.dim("batch", 1, 4096), sym.dim("seq", 1, c.max_position)
        ids = g.input("input_ids", (batch, seq), dt.i32)
        am = g.input("attention_mask", (batch, seq), dt.i32)
        x = embedding(ids, self._w(g, "embeddings.word_embeddings.weight"))  # (batch, seq, hidden)
        x = x.add(self._w(g, "embeddings.position_embeddings.weight").slice(0, 0, seq))
        x = x.add(
            self._w(g, "embeddings.token_type_embeddings.weight")
            .slice(0, 0, 1)
            .reshape(c.hidden_size)
        )
        x = self._ln(g, x, "embeddings.LayerNorm")
        hd = c.hidden_size // c.n_heads
        mask = am.cast(dt.bool_).reshape(batch, 1, 1, seq)  # keys a query may attend

        def heads(t: Tensor) -> Tensor:
            return t.reshape(batch, seq, c.n_heads, hd).permute(0, 2, 1, 3)

        approx = "none" if c.hidden_act == "gelu" else "tanh"
        for i in range(c.n_layers):
            p = f"encoder.layer.{i}."
            q, k, v = (
                heads(self._lin(g, x, p + f"attention.self.{n}")) for n in ("query", "key", "value")
            )
            o = sdpa(q, k, v, attn_mask=mask).permute(0, 2, 1, 3).reshape(batch, seq, c.hidden_size)
            x = self._ln(
                g,
                x.add(self._lin(g, o, p + "attention.output.dense")),
                p + "attention.output.LayerNorm",
            )
            h = gelu(self._lin(g, x, p + "intermediate.dense"), approx)
            x = self._ln(g, x.add(self._lin(g, h, p + "output.dense")), p + "output.LayerNorm")
        g.output("last_hidden_state", x)
        m = am.cast(dt.f32).unsqueeze(-1)  # mean over real tokens only
        summed = x.mul(m.expand(x.shape)).sum_reduce(1)
        count = m.sum_reduce(1)
        g.output(
            "embeddings", normalize(summed.mul(count.reciprocal().expand(summed.shape)), 2.0, -1)
        )
        return g


class Embedder:
    """Text -> L2-normalized sentence embeddings with a BERT model and its tokenizer."""

    def __init__(
        self,
        model: Bert,
        tokenizer: Any,
        backend: str = "auto",
        quiet: bool = True,
        max_length: int = 256,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        # a cached plan needs no graph: it is built only to compile or interpret it
        self.runner = Runner(model.build, backend, quiet, key=model.cache_key(), name="bert")
        self.graph = self.runner.graph
        self.max_length = min(max_length, model.config.max_position)
        tokenizer.tk.enable_truncation(self.max_length)  # keeps [SEP], like sentence-transformers
        tokenizer.tk.no_padding()  # we pad a batch to its longest text ourselves

    @property
    def backend(self) -> str:
        return self.runner.backend

    def encode_ids(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        enc = [self.tokenizer.tk.encode(t).ids for t in texts]
        n = max(len(e) for e in enc)
        ids = np.zeros((len(texts), n), np.int32)
        mask = np.zeros((len(texts), n), np.int32)
        for r, e in enumerate(enc):
            ids[r, : len(e)] = e
            mask[r, : len(e)] = 1
        return ids, mask

    def __call__(self, texts: str | list[str]) -> np.ndarray:
        batch = [texts] if isinstance(texts, str) else list(texts)
        if not batch:
            raise ValueError("no texts to embed")
        ids, mask = self.encode_ids(batch)
        return self.runner({"input_ids": ids, "attention_mask": mask})["embeddings"]
