"""Converters of network layers beyond convolution: layer, batch (inference and training) and
group normalization with their saved statistics, scaled dot-product attention, the chunked
linear cross-entropy loss and embedding bags. Same contract as ``convert.py``: arguments arrive
as luminal values, ``Unsupported`` sends a node to eager.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from .. import functional as F
from ..graph import dtypes as dt
from ..tensor import Tensor
from .convert import Ctx, empty_output, op, output_used
from .symbols import Unsupported

aten = torch.ops.aten


# ----------------------------------------------------------------------------- normalizations
def _mean_rstd(x: Tensor, dims: list[int], eps: float) -> tuple[Tensor, Tensor]:
    """The saved statistics of a normalization (kept dims, f32 for low precision)."""
    xf = x.cast(dt.f32) if x.dtype in (dt.f16, dt.bf16) else x
    mean = F.mean(xf, dims, keepdim=True)
    cen = F.sub(xf, mean)
    return mean, F.rsqrt(F.add(F.mean(F.mul(cen, cen), dims, keepdim=True), eps))


@op(aten.native_layer_norm.default)
def _layer_norm(cx: Ctx, x: Tensor, shape: Sequence[Any], w: Any, b: Any, eps: float) -> tuple:
    # mean / rstd (outputs 1 and 2): computed only where a graph output reads them
    mean, rstd = _mean_rstd(x, list(range(x.ndim - len(shape), x.ndim)), eps)
    return F.layer_norm(x, list(shape), w, b, eps), mean, rstd


@op(aten._native_batch_norm_legit_no_training.default)
def _batch_norm(cx: Ctx, x: Tensor, w: Any, b: Any, rm: Tensor, rv: Tensor, momentum: float,
                eps: float) -> tuple:  # fmt: skip
    out = F.batch_norm(x, rm, rv, w, b, False, momentum, eps)
    # the saved statistics are empty in inference (read back as such); else backward's only
    extra = [empty_output(cx, k) if cx.val[k].numel() == 0 else None for k in (1, 2)]
    return out, *extra


@op(aten.native_group_norm.default)
def _group_norm(cx: Ctx, x: Tensor, w: Any, b: Any, n: Any, c: Any, hw: Any, groups: int,
                eps: float) -> tuple:  # fmt: skip
    if x.numel() == 0 or not isinstance(x.shape[1], int):
        return F.group_norm(x, groups, w, b, eps), None, None
    g = x.reshape([x.shape[0], groups, -1])
    mean, rstd = _mean_rstd(g, [2], eps)
    return F.group_norm(x, groups, w, b, eps), mean.squeeze(2), rstd.squeeze(2)


def _bn_batch(x: Tensor, w: Any, b: Any, eps: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Training-mode batch norm: (out, mean, 1/sqrt(var + eps), unbiased var) per channel."""
    dims = [0, *range(2, x.ndim)]
    xf = x.cast(dt.f32) if x.dtype in (dt.f16, dt.bf16) else x
    mean = F.mean(xf, dims, keepdim=True)
    cen = F.sub(xf, mean)
    var = F.mean(F.mul(cen, cen), dims, keepdim=True)
    rstd = F.rsqrt(F.add(var, eps))
    out = F.mul(cen, rstd)
    bshape = [1, x.shape[1]] + [1] * (x.ndim - 2)
    if w is not None:
        out = F.mul(out, w.reshape(bshape))
    if b is not None:
        out = F.add(out, b.reshape(bshape))
    n = F._base.prod([x.shape[k] for k in dims])
    if not isinstance(n, int):
        raise Unsupported("batch statistics over symbolic sizes")
    unbiased = F.mul(var, n / (n - 1)) if n > 1 else F.mul(var, math.nan)
    flat = [x.shape[1]]
    return out.cast(x.dtype), mean.reshape(flat), rstd.reshape(flat), unbiased.reshape(flat)


def _running(r: Any, new: Tensor, momentum: float) -> Any:
    if r is None:
        return None
    return F.add(F.mul(r, 1.0 - momentum), F.mul(new.cast(r.dtype), momentum))


@op(aten._native_batch_norm_legit_functional.default)
def _bn_functional(cx: Ctx, x: Tensor, w: Any, b: Any, rm: Any, rv: Any, training: bool,
                   momentum: float, eps: float) -> tuple:  # fmt: skip
    if not training:
        out = F.batch_norm(x, rm, rv, w, b, False, momentum, eps)
        return out, empty_output(cx, 1), empty_output(cx, 2), rm, rv
    out, mean, rstd, var = _bn_batch(x, w, b, eps)
    return out, mean, rstd, _running(rm, mean, momentum), _running(rv, var, momentum)


@op(aten._native_batch_norm_legit.no_stats)
def _bn_no_stats(cx: Ctx, x: Tensor, w: Any, b: Any, training: bool, momentum: float,
                 eps: float) -> tuple:  # fmt: skip
    out, mean, rstd, _ = _bn_batch(x, w, b, eps)
    return out, mean, rstd


@op(aten._batch_norm_with_update_functional.default)
def _bn_update_functional(cx: Ctx, x: Tensor, w: Any, b: Any, rm: Tensor, rv: Tensor,
                          momentum: float, eps: float) -> tuple:  # fmt: skip
    out, mean, rstd, var = _bn_batch(x, w, b, eps)
    return (out, mean, rstd, empty_output(cx, 3), _running(rm, mean, momentum),
            _running(rv, var, momentum))  # fmt: skip


# ----------------------------------------------------------------------------- attention
@op(aten.scaled_dot_product_attention.default)
def _sdpa(
    cx: Ctx,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    scale: Any = None,
    enable_gqa: bool = False,
) -> Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, scale,
                                          enable_gqa)  # fmt: skip


@op(aten._scaled_dot_product_flash_attention_for_cpu.default)
def _sdpa_cpu(
    cx: Ctx,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    attn_mask: Any = None,
    scale: Any = None,
) -> tuple:
    # the CPU kernel takes grouped key/value heads as they are (what enable_gqa=True reaches)
    return F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, scale,
                                          True), None  # fmt: skip


# ----------------------------------------------------------------------------- losses
def _lce_terms(cx: Ctx, x: Tensor, w: Tensor, target: Tensor, bias: Any, weight: Any,
               ignore_index: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """(log-probabilities (N, C), -log p of each target times its class weight (N,), the
    class weight of each kept target (N,), the class weights (C,), ones when not given)."""
    if x.ndim != 2 or target.ndim != 1:
        raise Unsupported("linear_cross_entropy of other than (N, D) input and (N,) target")
    logits = F.linear(x, w, bias if isinstance(bias, Tensor) else None)
    logp = F.log_softmax(logits.cast(dt.f32) if logits.dtype is not dt.f64 else logits, -1)
    c = logits.shape[-1]
    keep = F.ne(target, ignore_index)
    tgt = F.where(keep, target, 0).cast(dt.i64)
    picked = F.gather(logp, 1, tgt.unsqueeze(-1)).squeeze(-1)
    cw = (
        weight.cast(logp.dtype)
        if isinstance(weight, Tensor)
        else F.full(cx.g, (c,), 1.0, dtype=logp.dtype)
    )
    wt = F.where(keep, F.index_select(cw, 0, tgt), 0.0)
    return logp, F.mul(F.neg(picked), wt), wt, cw


def _lce(cx: Ctx, x: Tensor, w: Tensor, target: Tensor, bias: Any, weight: Any, reduction: str,
         ignore_index: int, label_smoothing: float, *rest: Any) -> tuple:  # fmt: skip
    """``F.linear_cross_entropy``'s chunked op: the loss only (the gradients it can
    precompute are for training)."""
    if any(output_used(cx, k) for k in (1, 2, 3)) or reduction not in ("mean", "sum"):
        raise Unsupported("linear_cross_entropy's precomputed gradients")
    if label_smoothing:  # PyTorch's chunked path does not take it (it falls back itself)
        raise Unsupported("linear_cross_entropy with label smoothing")
    _, nll, wt, _ = _lce_terms(cx, x, w, target, bias, weight, ignore_index)
    total = nll.sum_reduce(0)
    if reduction == "mean":
        total = F.div(total, wt.sum_reduce(0))
    return total.cast(x.dtype), None, None, None


def _lce_none(cx: Ctx, x: Tensor, w: Tensor, target: Tensor, bias: Any, weight: Any,
              ignore_index: int, *rest: Any) -> Tensor:  # fmt: skip
    _, nll, _, _ = _lce_terms(cx, x, w, target, bias, weight, ignore_index)
    return nll.cast(x.dtype)


def _register_lce() -> None:
    try:
        import torch.nn.modules.linear_cross_entropy  # noqa: F401 - registers the custom ops

        ns = torch.ops.torch_nn
        op(ns._linear_cross_entropy_batch_chunked.default)(_lce)
        op(ns._linear_cross_entropy_batch_chunked_no_reduction.default)(_lce_none)
    except (ImportError, AttributeError):  # a PyTorch without them
        pass


_register_lce()


# ----------------------------------------------------------------------------- embedding bags
@op(aten._embedding_bag_forward_only.default, aten._embedding_bag.default)
def _embedding_bag(cx: Ctx, weight: Tensor, indices: Tensor, offsets: Tensor,
                   scale_grad_by_freq: bool = False, mode: int = 0, sparse: bool = False,
                   per_sample_weights: Any = None, include_last_offset: bool = False,
                   padding_idx: int = -1) -> tuple:  # fmt: skip
    """Sums, means or maxima of embedding rows over bags that start at ``offsets``; rows of
    ``padding_idx`` are left out (an empty bag gives zeros). Only the result converts: the
    bookkeeping outputs (offset2bag, bag sizes, argmax) are for the backward."""
    if any(output_used(cx, k) for k in (1, 2, 3)):
        raise Unsupported("embedding_bag's bookkeeping outputs")
    if indices.ndim != 1 or offsets.ndim != 1 or mode not in (0, 1, 2):
        raise Unsupported("embedding_bag of other than 1-D indices and offsets")
    n, nb = indices.shape[0], offsets.shape[0]
    if not isinstance(n, int) or not isinstance(nb, int):
        raise Unsupported("embedding_bag with a symbolic number of indices or bags")
    bags = nb - 1 if include_last_offset else nb
    pos = cx.g.arange(n, dtype=dt.i64)
    off = offsets.cast(dt.i64)
    bag = F.sub(F.le(off.unsqueeze(-1), pos).cast(dt.i64).sum_reduce(0), 1)  # (n,)
    valid = F.ne(indices.cast(dt.i64), padding_idx) if padding_idx >= 0 else None
    member = F.eq(bag, cx.g.arange(bags, dtype=dt.i64).unsqueeze(-1))  # (bags, n)
    if include_last_offset:
        member = F.logical_and(member, F.lt(pos, off.slice(0, nb - 1, 1)))
    if valid is not None:
        member = F.logical_and(member, valid)
    rows = F.embedding(indices, weight)  # (n, d)
    if per_sample_weights is not None:
        if mode != 0:
            raise Unsupported("per_sample_weights outside sum mode")
        rows = F.mul(rows, per_sample_weights.cast(rows.dtype).unsqueeze(-1))
    m = member.unsqueeze(-1)
    if mode == 2:
        got = F.amax(F.where(m, rows.unsqueeze(0), -math.inf), 1)
        out = F.where(F.any(member, -1, True), got, 0.0)
    else:
        out = F.where(m, rows.unsqueeze(0), 0.0).sum_reduce(1)
        if mode == 1:
            c = member.cast(rows.dtype).sum_reduce(-1, keepdim=True)
            out = F.div(out, F.where(F.eq(c, 0.0), 1.0, c))
    return out.cast(weight.dtype), None, None, None
