"""A batched decode graph for Llama-family models: one plan step advances many sequences by
one token each (continuous batching) and takes prompt tokens of new ones (chunked prefill).

Inputs: ``tokens``, ``positions`` and ``slots`` (i32, shape (batch,)): row i feeds token
``tokens[i]`` at position ``positions[i]`` of the sequence in KV-cache slot ``slots[i]``.
Several rows may belong to one slot (consecutive prompt tokens): every row's key and value
is written before any row attends, and the mask keeps each row causal. Each layer's
caches ``k_cache_<l>`` / ``v_cache_<l>`` hold every slot: shape (slots * ctx, kv_width), slot
s in rows ``s * ctx .. s * ctx + ctx - 1`` (``BatchedDecoder.slot_view`` gives one slot as
the (ctx, kv_width) cache a ``LlamaSession`` uses, so prefills write into it directly). The
new keys/values are written by SCATTER at rows ``slots * ctx + positions``; attention
gathers rows ``slots * ctx + j`` for ``j < kv`` and masks ``j > positions[i]``, so each
sequence sees its own history only. ``picks`` (i32, shape (picked,)): the rows whose logits
are wanted (a prompt's inner tokens need none, and the vocabulary projection is the widest
one); a non-finite row's NaN reaches every picked row (the engine fails those requests).
``batch`` (1..rows), ``picked`` (1..rows) and ``kv`` (1..ctx: the longest sequence's length
after this step) are symbolic dims of one plan. Output ``logits`` (picked, vocab) and
the updated caches (written in place).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..functional import apply_rotary_emb, linear, rms_norm, rope_cos_sin, silu
from ..functional import scaled_dot_product_attention as sdpa
from ..graph import dtypes as dt
from ..graph import symbolic as sym
from ..graph.ops import Op
from ..models.base import Runner
from ..models.llama import Llama
from ..tensor import Graph, Tensor


class BatchedDecoder:
    """The batched decode graph of ``model`` for up to ``slots`` sequences, and its runner."""

    def __init__(
        self,
        model: Llama,
        slots: int,
        fold: bool = False,
        rows: int | None = None,
        picks: bool = True,
    ) -> None:
        """``rows``: tokens one step takes at most (default ``slots``: one per sequence;
        more leave room for prompt tokens). ``picks``: the plan computes logits for the
        picked rows only (False: for every row; ``step`` then selects). ``fold``: the
        plan's weights are folded to f32 at build time (``compiler.fold``, as
        ``Llama.build_prefill`` does), so its projections are GEMMs over the batch rows
        instead of kernels that dequantize every weight again for each sequence; right for
        larger batches, at 4 bytes per weight."""
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise ValueError(f"slots must be a positive int, got {slots!r}")
        if rows is None:
            rows = slots
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
            raise ValueError(f"rows must be a positive int, got {rows!r}")
        self.model = model
        self.slots = slots
        self.rows = rows
        self.picks = picks
        self.fold = fold
        self.ctx = model.ctx

    def cache_names(self) -> list[str]:
        return self.model.cache_names()

    def new_cache(self) -> dict[str, np.ndarray]:
        rows, width = self.slots * self.ctx, self.model.kv_width
        return {n: np.zeros((rows, width), np.float32) for n in self.cache_names()}

    def slot_view(self, cache: dict[str, np.ndarray], slot: int) -> dict[str, np.ndarray]:
        """Slot ``slot`` of ``cache`` as (ctx, kv_width) views (no copy)."""
        lo = slot * self.ctx
        return {n: a[lo : lo + self.ctx] for n, a in cache.items()}

    def cache_key(self) -> dict[str, Any] | None:
        opts: dict[str, Any] = {"slots": self.slots, "rows": self.rows, "picks": self.picks}
        if self.picks:
            opts["pick"] = "onehot"
        if self.fold:
            opts["fold"] = True
        return self.model.cache_key("batched_decode", **opts)

    def runner(self, backend: str = "auto", quiet: bool = True) -> Runner:
        build = self.build_folded if self.fold else self.build
        return Runner(build, backend, quiet, key=self.cache_key(), name="llama_batched")

    def build_folded(self) -> Graph:
        from ..compiler.fold import fold_weights

        return fold_weights(self.build("llama_batched_f32"))

    def build(self, name: str = "llama_batched") -> Graph:
        m, c, w = self.model, self.model.config, self.model.weights
        ctx = self.ctx
        g = Graph(name)
        b = sym.dim("batch", 1, self.rows)
        kv = sym.dim("kv", 1, ctx)
        tokens = g.input("tokens", (b,), dt.i32)
        positions = g.input("positions", (b,), dt.i32)
        slots = g.input("slots", (b,), dt.i32)
        x = w.rows(g, "token_embd.weight", tokens)  # (b, hidden)
        if w.has("rope_freqs.weight"):
            cos, sin = m._freq_factors(g, positions)
        else:
            cos, sin = rope_cos_sin(
                positions, c.head_dim, c.rope_theta, c.rope_interleaved, c.rope_scaling
            )
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # (b, 1, hd): broadcast over heads
        base = slots.mul(ctx)
        write_rows = base.add(positions)  # (b,)
        j = Tensor(g.add_op(Op.IOTA, [], arg=sym.index_var(1, kv), shape=(b, kv), dtype=dt.i32))
        read_rows = base.unsqueeze(1).expand(b, kv).add(j)  # (b, kv)
        # key j is visible to sequence i when j <= positions[i]
        mask = j.lt(positions.add(1).unsqueeze(1).expand(b, kv)).reshape(b, 1, 1, kv)
        hd, nh, nkv = c.head_dim, c.n_heads, c.n_kv_heads
        for i in range(c.n_layers):
            p = f"blk.{i}."
            h = rms_norm(x, c.hidden_size, w.get(g, p + "attn_norm.weight"), c.rms_eps)
            q = m._proj(g, h, p + "attn_q").reshape(b, nh, hd)
            k = m._proj(g, h, p + "attn_k").reshape(b, nkv, hd)
            v = m._proj(g, h, p + "attn_v")
            q = apply_rotary_emb(q, cos, sin, c.rope_interleaved)
            k = apply_rotary_emb(k, cos, sin, c.rope_interleaved)
            ks = self._cache(g, f"k_cache_{i}", k.reshape(b, nkv * hd), write_rows, read_rows)
            vs = self._cache(g, f"v_cache_{i}", v, write_rows, read_rows)
            kh = ks.reshape(b, kv, nkv, hd).permute(0, 2, 1, 3)  # (b, kv_heads, kv, hd)
            vh = vs.reshape(b, kv, nkv, hd).permute(0, 2, 1, 3)
            o = sdpa(q.unsqueeze(2), kh, vh, attn_mask=mask, enable_gqa=True)  # (b, nh, 1, hd)
            x = x.add(m._proj(g, o.reshape(b, nh * hd), p + "attn_output"))
            h = rms_norm(x, c.hidden_size, w.get(g, p + "ffn_norm.weight"), c.rms_eps)
            gate = m._proj(g, h, p + "ffn_gate")
            up = m._proj(g, h, p + "ffn_up")
            x = x.add(m._proj(g, silu(gate).mul(up), p + "ffn_down"))
        if self.picks:
            pk = sym.dim("picked", 1, self.rows)
            picks = g.input("picks", (pk,), dt.i32)
            # the picked rows as a one-hot (picked, batch) matmul, not a GATHER: the compiler
            # sinks a gather into the last projection, as a generated kernel over the picked
            # rows that cost 30 ms of a 16-row step where the whole-row GEMM costs 3 (and a
            # where-sum it turns back into that gather); exact for finite rows
            iota = g.add_op(Op.IOTA, [], arg=sym.index_var(1, b), shape=(pk, b), dtype=dt.i32)
            onehot = (Tensor(iota) == picks.unsqueeze(1).expand(pk, b)).cast(dt.f32)
            x = onehot @ x  # (picked, hidden)
        x = rms_norm(x, c.hidden_size, w.get(g, "output_norm.weight"), c.rms_eps)
        head = w.get(g, "token_embd.weight" if m.tied else "output.weight")
        g.output("logits", linear(x, head))
        return g

    def _cache(
        self, g: Graph, name: str, new: Tensor, write_rows: Tensor, read_rows: Tensor
    ) -> Tensor:
        """Write ``new`` (b, width) at ``write_rows`` of the all-slot cache; return the rows
        ``read_rows`` (b, kv) of the updated cache as (b, kv, width)."""
        cache = g.input(name, (self.slots * self.ctx, self.model.kv_width), dt.f32)
        updated = Tensor(g.add_op(Op.SCATTER, [cache.edge, write_rows.edge, new.edge]))
        g.output(name + "_new", updated, updates=name)
        return Tensor(g.add_op(Op.GATHER, [updated.edge, read_rows.edge]))

    def prefill(
        self,
        session: Any,
        cache: dict[str, np.ndarray],
        slot: int,
        tokens: list[int],
        start: int = 0,
    ) -> np.ndarray:
        """Run ``tokens[start:]`` from position ``start`` into slot ``slot`` with ``session``
        (a ``LlamaSession`` of the same model: its decode and prefill plans); the slot holds
        the first ``start`` tokens' keys and values already. The last position's logits."""
        if not 0 <= start < len(tokens):
            raise ValueError(f"start must be in [0, {len(tokens)}), got {start}")
        view = self.slot_view(cache, slot)
        session.cache = dict(view)
        session.reset()
        session.pos = start
        logits = session.forward(tokens[start:])
        for n, v in view.items():
            got = session.cache[n]
            if not np.shares_memory(got, v):  # the interpreter returns new arrays
                v[...] = got
        session.cache = {}
        return np.asarray(logits)

    def step(
        self,
        runner: Runner,
        cache: dict[str, np.ndarray],
        tokens: Any,
        positions: Any,
        slots: Any,
        picks: Any = None,
    ) -> np.ndarray:
        """One step over the listed rows (token, position, slot); the logits (len(picks),
        vocab) of the rows ``picks`` (default: every row)."""
        toks = np.ascontiguousarray(tokens, np.int32).reshape(-1)
        pos = np.ascontiguousarray(positions, np.int32).reshape(-1)
        ids = np.ascontiguousarray(slots, np.int32).reshape(-1)
        rows = toks.size
        if not 1 <= rows <= self.rows or pos.size != rows or ids.size != rows:
            raise ValueError(
                f"a step takes 1..{self.rows} rows of equal length tokens, positions and "
                f"slots (got {toks.size}, {pos.size}, {ids.size})"
            )
        sel = np.arange(rows, dtype=np.int32) if picks is None else np.asarray(picks, np.int32)
        sel = np.ascontiguousarray(sel.reshape(-1))
        if sel.size < 1 or sel.min() < 0 or sel.max() >= rows:
            raise ValueError(f"picks must be 1+ row indices in [0, {rows}), got {sel.tolist()}")
        if ids.min() < 0 or ids.max() >= self.slots:
            raise ValueError(f"slots must be in [0, {self.slots}), got {ids.tolist()}")
        if pos.min() < 0:
            raise ValueError(f"positions must be >= 0, got {pos.tolist()}")
        kv = int(pos.max()) + 1
        if kv > self.ctx:
            raise ValueError(f"context full: a sequence reached the context limit of {self.ctx}")
        feeds = {"tokens": toks, "positions": pos, "slots": ids, **cache}
        if self.picks:
            out = runner({**feeds, "picks": sel}, kv=kv, picked=int(sel.size))
        else:
            out = runner(feeds, kv=kv)
        for n, a in cache.items():
            got = out[n + "_new"]
            if got is not a:
                a[...] = got
        logits = np.asarray(out["logits"])
        return logits if self.picks else logits[sel]
