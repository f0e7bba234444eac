"""Scaled dot-product attention and rotary position embeddings.

Attention is written naively (scores, mask, softmax, weighted sum) from matmul and the
primitives; the search's online-softmax rewrites turn it into a fused flash-style kernel.
Grouped-query attention never copies K/V: queries are viewed as (.., kv_heads, group, L, E)
against K/V with a broadcast group dim. Masks add the most negative finite value rather than
-inf, so a fully masked row gives a uniform average instead of NaN.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..graph import dtypes as dt
from ..graph import symbolic as sym
from ..graph.ops import Leaf
from ..graph.symbolic import sint
from ..tensor import Graph, Tensor
from ._base import iota, same, shape_str
from ._nnbase import acc, bool_to_bias, fmax
from .elementwise import neg, where
from .linalg import matmul
from .reduce import softmax

__all__ = [
    "apply_rotary_emb",
    "causal_mask",
    "rope_cos_sin",
    "rope_positions",
    "rotary_embedding",
    "rotate_half",
    "scaled_dot_product_attention",
]


def causal_mask(graph: Graph, q_len: sint, kv_len: sint, offset: sint = 0) -> Tensor:
    """Bool (q_len, kv_len): query i may attend key j when j <= i + offset. ``offset=0`` is
    PyTorch's ``is_causal`` (top-left); ``offset = kv_len - q_len`` suits a KV cache."""
    i, j = sym.index_var(0, q_len), sym.index_var(1, kv_len)
    return iota(graph, (q_len, kv_len), sym.lt(j, sym.add(sym.add(i, offset), 1))).cast(dt.bool_)


def _t(x: Tensor) -> Tensor:
    order = list(range(x.ndim))
    order[-2], order[-1] = order[-1], order[-2]
    return x.permute(order)


def attention_weights(
    query: Tensor,
    key: Tensor,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    name: str = "scaled_dot_product_attention",
) -> tuple[Tensor, int]:
    """softmax(q k^T * scale + mask) and the GQA group size G. With G > 1 the weights are laid
    out (..., Hk, G, L, S): the query heads are split, never K/V copied, and nothing of
    symbolic size (S) is reshaped (merging dims of size ``pos + seq`` costs the compiler)."""
    for what, t in (("query", query), ("key", key)):
        if not isinstance(t, Tensor) or t.ndim < 2 or not t.dtype.is_float:
            raise ValueError(f"{name}: {what} must be a float tensor (..., seq, dim), got {t!r}")
    lq, e = query.shape[-2:]
    s, ek = key.shape[-2:]
    if not same(e, ek):
        raise ValueError(
            f"{name}: query {shape_str(query.shape)} and key {shape_str(key.shape)} "
            f"head dims {e} and {ek} differ"
        )
    group = 1
    if query.ndim >= 3 and key.ndim >= 3 and not same(query.shape[-3], key.shape[-3]):
        hq, hk = query.shape[-3], key.shape[-3]
        if enable_gqa and isinstance(hq, int) and isinstance(hk, int) and hq % hk == 0:
            group = hq // hk
        elif not same(hk, 1):
            raise ValueError(
                f"{name}: query heads {hq} and key/value heads {hk} differ "
                f"(query {shape_str(query.shape)}, key {shape_str(key.shape)}); "
                "GQA needs enable_gqa=True and query heads divisible by kv heads"
            )
    d = dt.promote(query.dtype, key.dtype)
    q, k = query.cast(d), key.cast(d)
    sc = 1.0 / math.sqrt(e) if scale is None and isinstance(e, int) else scale
    if group > 1:  # (.., Hk*G, L, E) -> (.., Hk, G, L, E) against K (.., Hk, 1, S, E)
        q = q.reshape([*q.shape[:-3], q.shape[-3] // group, group, lq, e])
        k = k.unsqueeze(-3)
    scores = acc(matmul(q, _t(k)))
    if sc is None:  # symbolic head dim: scale by 1/sqrt(E) computed in the graph
        scores = scores.mul(scores.graph.constant(e, scores.dtype).sqrt().reciprocal())
    elif sc != 1.0:
        scores = scores.mul(sc)
    if is_causal:
        if attn_mask is not None:
            raise ValueError(f"{name}: give either attn_mask or is_causal, not both")
        attn_mask = causal_mask(scores.graph, lq, s)
    if attn_mask is not None:
        bias = (
            bool_to_bias(attn_mask, scores.dtype)
            if attn_mask.dtype is dt.bool_
            else attn_mask.cast(scores.dtype)
        )
        if group > 1 and bias.ndim >= 3:  # a per-head mask splits like the query heads
            h = bias.shape[-3]
            split = [*bias.shape[:-3], query.shape[-3] // group, group, *bias.shape[-2:]]
            bias = bias.reshape(split) if same(h, query.shape[-3]) else bias.unsqueeze(-3)
        try:
            scores = scores.add(bias)
        except ValueError:
            raise ValueError(
                f"{name}: attn_mask {shape_str(attn_mask.shape)} does not broadcast to the "
                f"attention scores {shape_str(scores.shape)}"
            ) from None
    return softmax(scores, -1), group


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Tensor:
    """``F.scaled_dot_product_attention``: q (.., Hq, L, E), k (.., Hk, S, E), v (.., Hk, S, Ev)
    -> (.., Hq, L, Ev). A bool mask is True where attention is allowed; a float mask is added.
    A query row whose mask allows no key is 0 (see ``_masked_rows``)."""
    name = "scaled_dot_product_attention"
    if dropout_p:
        raise ValueError(f"{name}: dropout_p must be 0 (luminal compiles inference graphs)")
    if not isinstance(value, Tensor) or value.ndim < 2 or not same(value.shape[-2], key.shape[-2]):
        raise ValueError(
            f"{name}: value {shape_str(getattr(value, 'shape', ()))} must have the key's "
            f"sequence length (key {shape_str(key.shape)})"
        )
    if key.ndim >= 3 and value.ndim >= 3 and not same(key.shape[-3], value.shape[-3]):
        raise ValueError(
            f"{name}: key {shape_str(key.shape)} and value {shape_str(value.shape)} heads differ"
        )
    out = attend_every_row(query, key, value, attn_mask, is_causal, scale, enable_gqa, name)
    return _masked_rows(out, attn_mask)


def attend_every_row(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    name: str = "scaled_dot_product_attention",
) -> Tensor:
    """``scaled_dot_product_attention`` for a mask that leaves every query row a key (a
    key-padding mask over texts of at least one token): no test for rows it masks whole."""
    p, group = attention_weights(query, key, attn_mask, is_causal, scale, enable_gqa, name)
    d = dt.promote(dt.promote(query.dtype, key.dtype), value.dtype)
    p, v = p.cast(d), value.cast(d)
    if group == 1:
        return matmul(p, v)
    out = matmul(p, v.unsqueeze(-3))  # (.., Hk, G, L, Ev) -> (.., Hq, L, Ev)
    return out.reshape([*out.shape[:-4], out.shape[-4] * group, *out.shape[-2:]])


def _masked_rows(out: Tensor, attn_mask: Tensor | None) -> Tensor:
    """A query row whose mask allows no key is 0, as PyTorch's safe softmax and its CPU
    kernel give for a bool mask or a -inf bias (a left-padded batch's pad rows). A float bias
    of about -3.4e38 (``finfo.min``) on every key counts as masked too: PyTorch averages the
    values there, but softmax's log2 scale takes such a bias past f32's range in the one-pass
    kernel, and a NaN row would reach the next layer's keys."""
    if attn_mask is None or not _reads_inputs(attn_mask):
        return out  # a mask of positions alone (causal, a window) is not data to pad with
    if attn_mask.dtype is dt.bool_:
        allowed = attn_mask
    else:
        allowed = attn_mask.cast(dt.f32).gt(-0.5 * fmax(dt.f32))
    live = allowed.cast(dt.i32).max_reduce(-1).cast(dt.bool_).unsqueeze(-1)  # (.., L, 1)
    return where(live, out, 0.0)


def _reads_inputs(t: Tensor) -> bool:
    """Whether ``t`` depends on a graph input or weight (not on positions and constants only)."""
    seen: set[int] = set()
    stack = [t.node]
    while stack:
        n = stack.pop()
        if n.id in seen:
            continue
        seen.add(n.id)
        if n.op is Leaf.INPUT:
            return True
        stack += [src for src, _ in n.srcs]
    return False


# ----------------------------------------------------------------------------- rotary embeddings


def rope_positions(graph: Graph, seq: sint, offset: sint = 0) -> Tensor:
    """Positions ``offset, offset + 1, ..., offset + seq - 1`` as an i32 (seq,) tensor;
    ``offset`` may be a dim such as the KV-cache length ``pos``."""
    return iota(graph, (seq,), sym.add(offset, sym.index_var(0, seq)))


def _inv_freq(head_dim: int, base: float, scaling: Mapping[str, Any] | None) -> np.ndarray:
    inv = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    if not scaling:
        return inv
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "linear":
        return inv / float(scaling["factor"])
    if kind == "llama3":  # Llama 3.1: long wavelengths slowed by factor, smooth in between
        factor, lo, hi = (
            float(scaling["factor"]),
            float(scaling["low_freq_factor"]),
            float(scaling["high_freq_factor"]),
        )
        old = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        smooth = (old / wavelen - lo) / (hi - lo)
        mid = (1 - smooth) * inv / factor + smooth * inv
        return np.where(wavelen > old / lo, inv / factor, np.where(wavelen < old / hi, inv, mid))
    raise ValueError(f"rope_cos_sin: unsupported rope scaling {dict(scaling)!r} (linear, llama3)")


def rope_cos_sin(
    positions: Tensor,
    head_dim: int,
    base: float = 10000.0,
    interleaved: bool = False,
    scaling: Mapping[str, Any] | None = None,
    dtype: Any = dt.f32,
) -> tuple[Tensor, Tensor]:
    """cos and sin tables of shape ``positions.shape + (head_dim,)`` for ``apply_rotary_emb``.

    Frequencies are ``base ** (-2i / head_dim)``, laid out ``[f0..f_{d/2-1}, f0..f_{d/2-1}]``
    (Llama / HF "rotate_half") or ``[f0, f0, f1, f1, ..]`` with ``interleaved=True``."""
    if head_dim % 2:
        raise ValueError(f"rope_cos_sin: head_dim must be even, got {head_dim}")
    inv = positions.graph.tensor(_inv_freq(head_dim, base, scaling).astype(np.float32))
    ang = positions.cast(dt.f32).unsqueeze(-1).mul(inv)  # (..., d/2)
    half = head_dim // 2
    if interleaved:
        ang = ang.unsqueeze(-1).expand([*ang.shape, 2]).reshape([*ang.shape[:-1], head_dim])
    else:
        ang = (
            ang.unsqueeze(-2)
            .expand([*ang.shape[:-1], 2, half])
            .reshape([*ang.shape[:-1], head_dim])
        )
    sin = ang.sin()
    s2 = ang.mul(0.5).sin()
    cos = (
        s2.mul(s2).mul(-2.0).add(1.0)
    )  # cos x = 1 - 2 sin^2(x/2): exact at large x, unlike sin(x + pi/2)
    return cos.cast(dtype), sin.cast(dtype)


def rotate_half(x: Tensor) -> Tensor:
    """[-x2, x1] for x = [x1, x2] split in halves along the last dim (a pad + add, no copy)."""
    dm = x.shape[-1]
    if not isinstance(dm, int) or dm % 2:
        raise ValueError(f"rotate_half: last dim must be even, got shape {shape_str(x.shape)}")
    h = dm // 2
    x1, x2 = x.slice(-1, 0, h), x.slice(-1, h, h)
    return neg(x2).pad_dim(-1, 0, h).add(x1.pad_dim(-1, h, 0))


def _rotate_pairs(x: Tensor) -> Tensor:
    """[-x1, x0, -x3, x2, ...]: the interleaved (GPT-J / Meta) pairing."""
    dm = x.shape[-1]
    if not isinstance(dm, int) or dm % 2:
        raise ValueError(f"apply_rotary_emb: last dim must be even, got shape {shape_str(x.shape)}")
    p = x.reshape([*x.shape[:-1], dm // 2, 2])
    ev, od = p.slice(-1, 0, 1), p.slice(-1, 1, 1)
    return neg(od).pad_dim(-1, 0, 1).add(ev.pad_dim(-1, 1, 0)).reshape(x.shape)


def apply_rotary_emb(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool = False) -> Tensor:
    """x * cos + rotate_half(x) * sin, with cos/sin broadcast against x (e.g. (seq, head_dim)
    for x (batch, heads, seq, head_dim)); ``interleaved`` rotates adjacent pairs instead."""
    if not same(cos.shape[-1], x.shape[-1]) or not same(sin.shape[-1], x.shape[-1]):
        raise ValueError(
            f"apply_rotary_emb: cos {shape_str(cos.shape)} / sin {shape_str(sin.shape)} do not "
            f"match the head dim of x {shape_str(x.shape)}"
        )
    rot = _rotate_pairs(x) if interleaved else rotate_half(x)
    return x.mul(cos).add(rot.mul(sin)).cast(x.dtype)


rotary_embedding = apply_rotary_emb
