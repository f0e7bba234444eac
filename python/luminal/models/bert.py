"""BERT encoders (all-MiniLM-L6-v2 and friends) with mean pooling and L2 normalization:
sentence embeddings as sentence-transformers computes them.

One graph with symbolic ``batch`` and ``seq``: inputs ``input_ids`` and ``attention_mask``
(i32, 1 for tokens and 0 for padding, shape (batch, seq)); outputs ``embeddings`` (batch,
hidden) and ``last_hidden_state``. ``Embedder`` runs the packed form (``build(packed=True)``,
inputs from ``pack_texts``): a batch's texts end to end with no padding, so the projections,
MLPs and norms do no work for padded slots; attention reads the rows it needs by index.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..functional import embedding, gelu, index_select, layer_norm, linear, normalize
from ..functional.attention import attend_every_row
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

    def build(self, name: str = "bert", packed: bool = False) -> Graph:
        """The encoder graph. ``packed``: the texts of a batch laid end to end as ``tokens``
        rows (no padding), with ``positions`` (each token's place in its text), ``unpack``
        (batch, seq): the row of the token at each padded slot (any row where the slot is
        padding), and ``pack`` (tokens,): the padded slot ``b * seq + s`` of each row. Every
        per-token op (the projections, the MLP, the norms) then works on real tokens only;
        attention gathers its padded (batch, seq) operands through ``unpack``. Outputs as
        the padded graph's, ``last_hidden_state`` (tokens, hidden) in packed rows."""
        c = self.config
        g = Graph(name)
        batch, seq = sym.dim("batch", 1, 4096), sym.dim("seq", 1, c.max_position)
        am = g.input("attention_mask", (batch, seq), dt.i32)
        word = self._w(g, "embeddings.word_embeddings.weight")
        pos_w = self._w(g, "embeddings.position_embeddings.weight")
        if packed:
            tokens = sym.dim("tokens", 1, 4096 * c.max_position)
            ids = g.input("input_ids", (tokens,), dt.i32)
            positions = g.input("positions", (tokens,), dt.i32)
            unpack = g.input("unpack", (batch, seq), dt.i32).reshape(sym.mul(batch, seq))
            pack = g.input("pack", (tokens,), dt.i32)
            x = embedding(ids, word).add(embedding(positions, pos_w))  # (tokens, hidden)
        else:
            ids = g.input("input_ids", (batch, seq), dt.i32)
            x = embedding(ids, word).add(pos_w.slice(0, 0, seq))  # (batch, seq, hidden)
        x = x.add(
            self._w(g, "embeddings.token_type_embeddings.weight")
            .slice(0, 0, 1)
            .reshape(c.hidden_size)
        )
        x = self._ln(g, x, "embeddings.LayerNorm")
        hd = c.hidden_size // c.n_heads
        mask = am.cast(dt.bool_).reshape(batch, 1, 1, seq)  # keys a query may attend

        def heads(t: Tensor) -> Tensor:
            if packed:
                t = index_select(t, 0, unpack)
            return t.reshape(batch, seq, c.n_heads, hd).permute(0, 2, 1, 3)

        approx = "none" if c.hidden_act == "gelu" else "tanh"
        for i in range(c.n_layers):
            p = f"encoder.layer.{i}."
            q, k, v = (
                heads(self._lin(g, x, p + f"attention.self.{n}")) for n in ("query", "key", "value")
            )
            # a key-padding mask: every text has a token, so no query row is masked whole
            o = attend_every_row(q, k, v, attn_mask=mask).permute(0, 2, 1, 3)
            if packed:
                o = index_select(o.reshape(sym.mul(batch, seq), c.hidden_size), 0, pack)
            else:
                o = o.reshape(batch, seq, c.hidden_size)
            x = self._ln(
                g,
                x.add(self._lin(g, o, p + "attention.output.dense")),
                p + "attention.output.LayerNorm",
            )
            h = gelu(self._lin(g, x, p + "intermediate.dense"), approx)
            x = self._ln(g, x.add(self._lin(g, h, p + "output.dense")), p + "output.LayerNorm")
        g.output("last_hidden_state", x)
        if packed:
            x = index_select(x, 0, unpack).reshape(batch, seq, c.hidden_size)
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
        # a cached plan needs no graph: it is built only to compile or interpret it. The
        # packed graph: a batch's texts run end to end, no work on padding
        self.runner = Runner(
            lambda: model.build(packed=True),
            backend,
            quiet,
            key={**model.cache_key(), "packed": True},
            name="bert",
        )
        self.graph = self.runner.graph
        self.max_length = min(max_length, model.config.max_position)
        tokenizer.tk.enable_truncation(self.max_length)  # keeps [SEP], like sentence-transformers
        tokenizer.tk.no_padding()  # we pad a batch to its longest text ourselves

    @property
    def backend(self) -> str:
        return self.runner.backend

    def encode_ids(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """The padded graph's ``input_ids`` and ``attention_mask`` for ``texts``."""
        p = self.packed_inputs(texts)
        mask = p["attention_mask"]
        return np.where(mask != 0, p["input_ids"][p["unpack"]], 0).astype(np.int32), mask

    def packed_inputs(self, texts: list[str]) -> dict[str, np.ndarray]:
        """The packed graph's inputs for ``texts`` (see ``Bert.build``)."""
        enc = [self.tokenizer.tk.encode(t).ids for t in texts]
        return pack_texts(enc)

    def __call__(self, texts: str | list[str]) -> np.ndarray:
        batch = [texts] if isinstance(texts, str) else list(texts)
        if not batch:
            raise ValueError("no texts to embed")
        return self.runner(self.packed_inputs(batch))["embeddings"]


def pack_texts(token_ids: list[list[int]]) -> dict[str, np.ndarray]:
    """Inputs of ``Bert.build(packed=True)`` for texts given as token id lists: the ids end
    to end, each token's position in its text, and the maps between packed rows and the
    padded (batch, longest text) slots that attention and pooling use."""
    lens = np.array([len(e) for e in token_ids], np.int64)
    if len(lens) == 0 or lens.min() < 1:
        raise ValueError("pack_texts: every text needs at least one token")
    seq, starts = int(lens.max()), np.concatenate([[0], np.cumsum(lens)[:-1]])
    slot = np.arange(seq)
    live = slot[None, :] < lens[:, None]
    unpack = np.where(live, starts[:, None] + slot[None, :], 0).astype(np.int32)
    rows_b = np.repeat(np.arange(len(lens)), lens)
    positions = (np.arange(int(lens.sum())) - starts[rows_b]).astype(np.int32)
    return {
        "input_ids": np.concatenate([np.asarray(e, np.int32) for e in token_ids]),
        "positions": positions,
        "attention_mask": live.astype(np.int32),
        "unpack": unpack,
        "pack": (rows_b * seq + positions).astype(np.int32),
    }
