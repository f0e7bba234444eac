"""Converters of reductions: sums, means, variances and norms, extrema and their indices,
``any`` / ``all``, softmax and logsumexp; scans (cumulative sums, products and extrema); sorting
and order statistics (sort, topk, kthvalue, median, mode); searching sorted sequences;
segment reductions and histograms. Same contract as ``convert.py``: arguments arrive as luminal
values, ``Unsupported`` sends a node to eager.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from .. import functional as F
from ..graph import dtypes as dt
from ..tensor import Tensor, broadcast_shapes
from .convert import Ctx, op, output_used, static_shape
from .symbols import Unsupported

aten = torch.ops.aten


# ----------------------------------------------------------------------------- reductions
def _ld(d: Any) -> dt.DType | None:
    return None if d is None else dt.to_dtype(d)


def _dims_arg(dim: Any) -> Any:
    return None if dim is None or (isinstance(dim, (list, tuple)) and not dim) else dim


@op(aten.sum.dim_IntList, aten.sum.default)
def _sum(cx: Ctx, x: Tensor, dim: Any = None, keepdim: bool = False, *, dtype: Any = None
         ) -> Tensor:  # fmt: skip
    if x.ndim == 0:
        return x if dtype is None else x.cast(_ld(dtype))
    return F.sum(x, _dims_arg(dim), keepdim, dtype=_ld(dtype))


@op(aten.mean.dim, aten.mean.default)
def _mean(cx: Ctx, x: Tensor, dim: Any = None, keepdim: bool = False, *, dtype: Any = None
          ) -> Tensor:  # fmt: skip
    return F.mean(x, _dims_arg(dim), keepdim, dtype=_ld(dtype))


@op(aten.prod.dim_int, aten.prod.default)
def _prod(cx: Ctx, x: Tensor, dim: Any = None, keepdim: bool = False, *, dtype: Any = None
          ) -> Tensor:  # fmt: skip
    return F.prod(x, dim, keepdim, dtype=_ld(dtype))


@op(aten.var.correction, aten.var.dim)
def _var(cx: Ctx, x: Tensor, dim: Any = None, *args: Any, correction: Any = None,
         keepdim: bool = False) -> Tensor:  # fmt: skip
    if args:  # var.dim(self, dim, unbiased, keepdim)
        return F.var(x, _dims_arg(dim), args[0], *args[1:])
    return F.var(x, _dims_arg(dim), keepdim=keepdim, correction=correction)


@op(aten.var_mean.correction)
def _var_mean(cx: Ctx, x: Tensor, dim: Any = None, *, correction: Any = None,
              keepdim: bool = False) -> tuple:  # fmt: skip
    return tuple(F.var_mean(x, _dims_arg(dim), keepdim=keepdim, correction=correction))


@op(aten.std_mean.correction)
def _std_mean(cx: Ctx, x: Tensor, dim: Any = None, *, correction: Any = None,
              keepdim: bool = False) -> tuple:  # fmt: skip
    return tuple(F.std_mean(x, _dims_arg(dim), keepdim=keepdim, correction=correction))


@op(aten.std.correction)
def _std(cx: Ctx, x: Tensor, dim: Any = None, *, correction: Any = None, keepdim: bool = False
         ) -> Tensor:  # fmt: skip
    return F.std(x, _dims_arg(dim), keepdim=keepdim, correction=correction)


@op(aten.linalg_vector_norm.default)
def _vector_norm(cx: Ctx, x: Tensor, ord: Any = 2, dim: Any = None, keepdim: bool = False,  # noqa: A002
                 *, dtype: Any = None) -> Tensor:  # fmt: skip
    return F.vector_norm(x, ord, _dims_arg(dim), keepdim, dtype=_ld(dtype))


@op(aten.dist.default)
def _dist(cx: Ctx, a: Tensor, b: Tensor, p: Any = 2) -> Tensor:
    return F.norm(F.sub(a, b), p)


@op(aten.amax.default)
def _amax(cx: Ctx, x: Tensor, dim: Any = (), keepdim: bool = False) -> Tensor:
    return x if x.ndim == 0 else F.amax(x, dim, keepdim)  # a 0-d input's dim 0 is itself


@op(aten.amin.default)
def _amin(cx: Ctx, x: Tensor, dim: Any = (), keepdim: bool = False) -> Tensor:
    return x if x.ndim == 0 else F.amin(x, dim, keepdim)


@op(aten.max.dim)
def _max_dim(cx: Ctx, x: Tensor, dim: int, keepdim: bool = False) -> tuple[Tensor, Tensor]:
    return F.amax(x, dim, keepdim), F.argmax(x, dim, keepdim)


@op(aten.min.dim)
def _min_dim(cx: Ctx, x: Tensor, dim: int, keepdim: bool = False) -> tuple[Tensor, Tensor]:
    return F.amin(x, dim, keepdim), F.argmin(x, dim, keepdim)


@op(aten.max.default)
def _max_all(cx: Ctx, x: Tensor) -> Tensor:
    return F.amax(x)


@op(aten.min.default)
def _min_all(cx: Ctx, x: Tensor) -> Tensor:
    return F.amin(x)


@op(aten.argmax.default)
def _argmax(cx: Ctx, x: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    return F.argmax(x, dim, keepdim)


@op(aten.argmin.default)
def _argmin(cx: Ctx, x: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    return F.argmin(x, dim, keepdim)


@op(aten.any.default, aten.any.dim, aten.any.dims)
def _any(cx: Ctx, x: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
    return F.any(x, _dims_arg(dim), keepdim)


@op(aten.all.default, aten.all.dim, aten.all.dims)
def _all(cx: Ctx, x: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
    return F.all(x, _dims_arg(dim), keepdim)


@op(aten.cumsum.default)
def _cumsum(cx: Ctx, x: Tensor, dim: int, *, dtype: Any = None) -> Tensor:
    return F.cumsum(x, dim, dtype=_ld(dtype))


@op(aten.cumprod.default)
def _cumprod(cx: Ctx, x: Tensor, dim: int, *, dtype: Any = None) -> Tensor:
    return F.cumprod(x, dim, dtype=_ld(dtype))


@op(aten.cummax.default)
def _cummax(cx: Ctx, x: Tensor, dim: int) -> tuple:
    return tuple(F.cummax(x, dim))


@op(aten.cummin.default)
def _cummin(cx: Ctx, x: Tensor, dim: int) -> tuple:
    return tuple(F.cummin(x, dim))


@op(aten._softmax.default, aten.softmax.int)
def _softmax(cx: Ctx, x: Tensor, dim: int, half_to_float: Any = False) -> Tensor:
    return F.softmax(x, dim)


@op(aten._log_softmax.default, aten.log_softmax.int)
def _log_softmax(cx: Ctx, x: Tensor, dim: int, half_to_float: Any = False) -> Tensor:
    return F.log_softmax(x, dim)


@op(aten.logsumexp.default)
def _logsumexp(cx: Ctx, x: Tensor, dim: Any, keepdim: bool = False) -> Tensor:
    return F.logsumexp(x, dim, keepdim)


@op(aten.logcumsumexp.default)
def _logcumsumexp(cx: Ctx, x: Tensor, dim: int) -> Tensor:
    return F.logcumsumexp(x, dim)


# ----------------------------------------------------------------------------- ordering
# luminal's sort is stable. An unstable sort (PyTorch's default) leaves the order of equal
# elements unspecified, so the stable order is one it may give; PyTorch's CPU kernel keeps
# ties in order up to 16 elements and not beyond, so indices of ties can differ from eager's
# there (a mixture of experts' routing sorts expert ids full of ties: its output does not
# depend on their order).


def _static_axis(x: Tensor, dim: int, what: str, symbolic: bool = False) -> None:
    if isinstance(x.numel(), int) and x.numel() == 0:
        raise Unsupported(f"{what} of an empty tensor")  # nothing to compute: eager is free
    n = x.shape[x._axis(dim)] if x.ndim else 1
    if not isinstance(n, int) and not symbolic or isinstance(n, int) and n > F.MAX_SORT:
        raise Unsupported(f"{what} along an axis of {n} (static and at most {F.MAX_SORT})")


@op(aten.sort.default)
def _sort(cx: Ctx, x: Tensor, dim: int = -1, descending: bool = False) -> tuple:
    _static_axis(x, dim, "sort", symbolic=True)
    return tuple(F.sort(x, dim, descending))


@op(aten.sort.stable)
def _sort_stable(cx: Ctx, x: Tensor, *, stable: Any = None, dim: int = -1,
                 descending: bool = False) -> tuple:  # fmt: skip
    _static_axis(x, dim, "sort", symbolic=True)
    return tuple(F.sort(x, dim, descending))


@op(aten.argsort.default)
def _argsort(cx: Ctx, x: Tensor, dim: int = -1, descending: bool = False) -> Tensor:
    _static_axis(x, dim, "argsort", symbolic=True)
    return F.argsort(x, dim, descending)


@op(aten.argsort.stable)
def _argsort_stable(cx: Ctx, x: Tensor, *, stable: bool, dim: int = -1, descending: bool = False
                    ) -> Tensor:  # fmt: skip
    _static_axis(x, dim, "argsort", symbolic=True)
    return F.argsort(x, dim, descending)


@op(aten.topk.default)
def _topk(cx: Ctx, x: Tensor, k: Any, dim: int = -1, largest: bool = True, sorted: bool = True  # noqa: A002
          ) -> tuple:  # fmt: skip
    if not isinstance(k, int):
        raise Unsupported("topk with a symbolic k")
    _static_axis(x, dim, "topk")
    return tuple(F.topk(x, k, dim, largest, sorted))


@op(aten.kthvalue.default)
def _kthvalue(cx: Ctx, x: Tensor, k: Any, dim: int = -1, keepdim: bool = False) -> tuple:
    if not isinstance(k, int):
        raise Unsupported("kthvalue with a symbolic k")
    _static_axis(x, dim, "kthvalue")
    return tuple(F.kthvalue(x, k, dim, keepdim))


def _whole(x: Tensor, what: str) -> None:
    n = x.numel()
    if not isinstance(n, int) or n > F.MAX_SORT:
        raise Unsupported(f"{what} of {n} elements (static and at most {F.MAX_SORT})")


@op(aten.median.default)
def _median_all(cx: Ctx, x: Tensor) -> Tensor:
    _whole(x, "median")
    return F.median(x)


@op(aten.nanmedian.default)
def _nanmedian_all(cx: Ctx, x: Tensor) -> Tensor:
    _whole(x, "nanmedian")
    return F.nanmedian(x)


@op(aten.median.dim)
def _median_dim(cx: Ctx, x: Tensor, dim: int, keepdim: bool = False) -> tuple:
    _static_axis(x, dim, "median")
    return tuple(F.median(x, dim, keepdim))


@op(aten.nanmedian.dim)
def _nanmedian_dim(cx: Ctx, x: Tensor, dim: int, keepdim: bool = False) -> tuple:
    _static_axis(x, dim, "nanmedian")
    return tuple(F.nanmedian(x, dim, keepdim))


def _pairs_axis(x: Tensor, dim: int, what: str) -> int:
    n = x.shape[x._axis(dim)] if x.ndim else 1
    if not isinstance(n, int) or n * n > F.MAX_PAIRS:
        raise Unsupported(f"{what} along an axis of {n} (static, n^2 <= {F.MAX_PAIRS})")
    return n


@op(aten.mode.default)
def _mode(cx: Ctx, x: Tensor, dim: int = -1, keepdim: bool = False) -> tuple:
    """The most frequent value (the smallest of equally frequent ones) and its last index, as
    PyTorch's CPU kernel, which sorts with std::sort: stable (insertion sort) up to 16
    elements, so beyond that the index of a repeated value is its own choice. NaNs (an order
    std::sort leaves undefined there) are counted as equal to each other."""
    if x.ndim == 0:
        return x, cx.g.zeros(dtype=dt.i64)
    n = _pairs_axis(x, dim, "mode")
    if n > 16 and output_used(cx, 1):
        raise Unsupported(f"mode's indices over {n} elements (PyTorch's unstable sort order)")
    xm = F.movedim(x, x._axis(dim), -1)  # (..., n)
    a, b = xm.unsqueeze(-1), xm.unsqueeze(-2)
    same = F.logical_or(F.eq(a, b), F.logical_and(F.isnan(a), F.isnan(b)))
    count = same.cast(dt.i64).sum_reduce(-1)  # (..., n)
    best = count.max_reduce(-1, keepdim=True)
    top = F.eq(count, best)
    # the smallest equally frequent value; NaN sorts last, so it wins only if nothing else ties
    lowest = F.amin(F.where(F.logical_and(top, F.logical_not(F.isnan(xm))), xm, math.inf), -1,
                    keepdim=True)  # fmt: skip
    nan_only = F.logical_not(F.any(F.logical_and(top, F.logical_not(F.isnan(xm))), -1, True))
    value = F.where(nan_only, math.nan, lowest)
    hit = F.where(nan_only, F.isnan(xm), F.eq(xm, value))
    pos = cx.g.arange(n, dtype=dt.i64)
    idx = F.where(hit, pos, -1).max_reduce(-1, keepdim=True)
    if not keepdim:
        return value.squeeze(-1), idx.squeeze(-1)
    return F.movedim(value, -1, x._axis(dim)), F.movedim(idx, -1, x._axis(dim))


# ----------------------------------------------------------------------------- segments
@op(aten.segment_reduce.default)
def _segment_reduce(cx: Ctx, data: Tensor, reduce: str, *, lengths: Any = None,
                    indices: Any = None, offsets: Any = None, axis: int = 0,
                    unsafe: bool = False, initial: Any = None) -> Tensor:  # fmt: skip
    """Reductions over consecutive segments along ``axis`` given by lengths or offsets;
    ``initial`` joins every segment (an empty one gives it, or the reduction's identity)."""
    if indices is not None or reduce not in ("sum", "mean", "max", "min", "prod"):
        raise Unsupported(f"segment_reduce {reduce!r} with indices")
    n = data.shape[data._axis(axis)]
    if not isinstance(n, int):
        raise Unsupported("segment_reduce along a symbolic axis")
    if lengths is not None:
        if lengths.ndim != 1:
            raise Unsupported("segment_reduce with batched lengths")
        ends = F.cumsum(lengths.cast(dt.i64), 0)
        starts = F.sub(ends, lengths.cast(dt.i64))
        count = lengths.cast(dt.i64)
    elif offsets is not None and offsets.ndim == 1:
        k = offsets.shape[0]
        if not isinstance(k, int):
            raise Unsupported("segment_reduce with a symbolic number of offsets")
        starts = offsets.slice(0, 0, k - 1).cast(dt.i64)
        ends = offsets.slice(0, 1, k - 1).cast(dt.i64)
        count = F.sub(ends, starts)
    else:
        raise Unsupported("segment_reduce without 1-D lengths or offsets")
    d = data._axis(axis)
    xm = F.movedim(data, d, 0)  # (n, ...)
    pos = cx.g.arange(n, dtype=dt.i64)
    inside = F.logical_and(F.le(starts.unsqueeze(-1), pos), F.lt(pos, ends.unsqueeze(-1)))
    m = inside.reshape([*inside.shape, *[1] * (xm.ndim - 1)])  # (segments, n, 1...)
    vals = xm.unsqueeze(0)
    ident = {"sum": 0.0, "mean": 0.0, "max": -math.inf, "min": math.inf, "prod": 1.0}[reduce]
    init = ident if initial is None else float(initial)
    if reduce in ("sum", "mean"):
        red = F.add(F.where(m, vals, 0.0).sum_reduce(1), init)
    elif reduce == "prod":
        red = F.mul(F.prod(F.where(m, vals, 1.0), 1), init)
    else:
        fill = F.where(m, vals, ident)
        red = F.amax(fill, 1) if reduce == "max" else F.amin(fill, 1)
        if initial is not None:
            red = F.maximum(red, init) if reduce == "max" else F.minimum(red, init)
    if reduce == "mean":
        c = count.reshape([count.shape[0], *[1] * (xm.ndim - 1)]).cast(red.dtype)
        empty = F.eq(c, 0.0)
        red = F.where(empty, math.nan if initial is None else init,
                      F.div(red, F.where(empty, 1.0, c)))  # fmt: skip
    return F.movedim(red.cast(data.dtype), 0, d)


# ----------------------------------------------------------------------------- searching
def _count_before(seq: Tensor, vals: Tensor, right: bool, out_int32: bool) -> Tensor:
    """#{s in seq (last axis) with s < v} (s <= v if ``right``) for each v in ``vals``."""
    if seq.ndim == 1:
        s = seq.reshape([1] * vals.ndim + [seq.shape[0]])
    else:
        s = seq.unsqueeze(-2)
    v = vals.unsqueeze(-1)
    d = dt.promote(s.dtype, v.dtype)
    s, v = s.cast(d), v.cast(d)
    out_dt = dt.i32 if out_int32 else dt.i64
    shape = broadcast_shapes(s.shape, v.shape)[:-1] if seq.ndim > 1 else vals.shape
    if vals.numel() == 0 or seq.shape[-1] == 0:
        return F.full(seq.graph, shape, 0, dtype=out_dt)
    hit = F.le(s, v) if right else F.lt(s, v)
    if d.is_float:  # PyTorch's binary search puts NaN after every boundary
        hit = F.logical_or(hit, F.isnan(v).expand(hit.shape))
    return hit.cast(out_dt).sum_reduce(-1)


def _side(right: bool, side: Any) -> bool:
    return side == "right" if side is not None else right


@op(aten.bucketize.Tensor, aten.bucketize.Scalar)
def _bucketize(cx: Ctx, x: Any, boundaries: Tensor, *, out_int32: bool = False,
               right: bool = False) -> Tensor:  # fmt: skip
    if not isinstance(x, Tensor):
        x = boundaries._lift(x)
    return _count_before(boundaries, x, right, out_int32)


@op(aten.searchsorted.Tensor, aten.searchsorted.Scalar)
def _searchsorted(cx: Ctx, seq: Tensor, x: Any, *, out_int32: bool = False, right: bool = False,
                  side: Any = None, sorter: Any = None) -> Tensor:  # fmt: skip
    if sorter is not None:
        seq = F.gather(seq, -1, sorter)
    if not isinstance(x, Tensor):
        return _count_before(seq, seq._lift(x).reshape((1,)), _side(right, side),
                             out_int32).reshape(cx.shape())  # fmt: skip
    return _count_before(seq, x, _side(right, side), out_int32)


# ----------------------------------------------------------------------------- histograms
def _bin_counts(x: Tensor, pos: Tensor, keep: Tensor, bins: int, w: Tensor | None) -> Tensor:
    """Sum of 1 (or w) per bin over the kept elements (pos in [0, bins))."""
    g = x.graph
    b = g.arange(bins, dtype=dt.i64)
    hit = F.logical_and(F.eq(pos.unsqueeze(-1), b), keep.unsqueeze(-1))  # (n, bins)
    val = hit.cast(x.dtype)
    if w is not None:
        val = F.mul(val, w.reshape(-1).cast(x.dtype).unsqueeze(-1))
    return val.sum_reduce(0)


def _range(x: Tensor, lo: float, hi: float, widen: float) -> tuple[Tensor, Tensor]:
    """The given range, or the data's min and max when both are equal (then widened)."""
    flat = x.reshape(-1)
    if lo == hi:
        mn, mx = F.amin(flat, 0), F.amax(flat, 0)
    else:
        mn, mx = x.graph.constant(lo, x.dtype), x.graph.constant(hi, x.dtype)
    same = F.eq(mn, mx)
    return F.where(same, F.sub(mn, widen), mn), F.where(same, F.add(mx, widen), mx)


@op(aten.histc.default)
def _histc(cx: Ctx, x: Tensor, bins: int = 100, min: Any = 0, max: Any = 0) -> Tensor:  # noqa: A002
    if not x.dtype.is_float or isinstance(bins, Tensor):
        raise Unsupported("histc of a non-float tensor")
    flat = x.reshape(-1)  # a symbolic length too: the counts are sums over it
    if isinstance(flat.shape[0], int) and flat.shape[0] == 0:
        return F.full(cx.g, (bins,), 0, dtype=x.dtype)
    lo, hi = _range(x, float(min), float(max), 1.0)
    pos = F.floor(F.div(F.mul(F.sub(flat, lo), bins), F.sub(hi, lo))).cast(dt.i64)
    pos = F.where(F.eq(flat, hi), bins - 1, pos)
    keep = F.logical_and(F.ge(flat, lo), F.le(flat, hi))
    return _bin_counts(flat, pos, keep, bins, None)


def _bins(cx: Ctx, flat: Tensor, bins: int, lo_v: float, hi_v: float
          ) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """(bin of each element, whether it is inside the range, the bins + 1 edges) as
    torch.histogram: the range, else the data's (widened by 1/2 when flat)."""
    lo, hi = _range(flat, lo_v, hi_v, 0.5)
    steps = cx.g.arange(bins + 1, dtype=flat.dtype)
    edges = F.add(lo, F.mul(F.sub(hi, lo), F.div(steps, float(bins))))
    edges = F.where(F.eq(steps, float(bins)), hi, edges)  # linspace ends exactly at hi
    pos = F.floor(F.div(F.mul(F.sub(flat, lo), bins), F.sub(hi, lo))).cast(dt.i64)
    pos = F.clamp(pos, 0, bins - 1)
    # the edges decide, as torch's local search does where rounding put an element one off
    left = F.gather(edges, 0, pos)
    right = F.gather(edges, 0, F.add(pos, 1))
    pos = F.where(F.logical_and(F.lt(flat, left), F.gt(pos, 0)), F.sub(pos, 1), pos)
    pos = F.where(F.logical_and(F.ge(flat, right), F.lt(pos, bins - 1)), F.add(pos, 1), pos)
    return pos, F.logical_and(F.ge(flat, lo), F.le(flat, hi)), edges


def _dd_input(x: Tensor, bins: Sequence[int]) -> Tensor:
    if not x.dtype.is_float or x.ndim < 1 or x.shape[-1] != len(bins):
        raise Unsupported("histogramdd of other than a float (..., D) tensor")
    static_shape(x, "histogramdd")
    pts = x.reshape((-1, len(bins)))
    if pts.shape[0] == 0:
        raise Unsupported("histogramdd of an empty tensor")
    return pts


def _dd_range(rng: Any, d: int) -> tuple[float, float]:
    return (0.0, 0.0) if rng is None else (float(rng[2 * d]), float(rng[2 * d + 1]))


@op(aten._histogramdd_bin_edges.default)
def _histogramdd_edges(cx: Ctx, x: Tensor, bins: Sequence[int], *, range: Any = None,  # noqa: A002
                       weight: Any = None, density: bool = False) -> list:  # fmt: skip
    pts = _dd_input(x, bins)
    return [_bins(cx, pts.slice(-1, d, 1).squeeze(-1), int(b), *_dd_range(range, d))[2]
            for d, b in enumerate(bins)]  # fmt: skip


@op(aten._histogramdd_from_bin_cts.default)
def _histogramdd_counts(cx: Ctx, x: Tensor, bins: Sequence[int], *, range: Any = None,  # noqa: A002
                        weight: Any = None, density: bool = False) -> Tensor:  # fmt: skip
    """Counts (or weights) per cell of the D-dimensional grid, row-major over the dims."""
    pts = _dd_input(x, bins)
    flat_pos: Tensor | None = None
    keep_all: Tensor | None = None
    widths = []
    for d, b in enumerate(bins):
        pos, keep, edges = _bins(cx, pts.slice(-1, d, 1).squeeze(-1), int(b), *_dd_range(range, d))
        flat_pos = pos if flat_pos is None else F.add(F.mul(flat_pos, int(b)), pos)
        keep_all = keep if keep_all is None else F.logical_and(keep_all, keep)
        widths.append(F.sub(edges.slice(0, 1, int(b)), edges.slice(0, 0, int(b))))
    assert flat_pos is not None and keep_all is not None
    cells = math.prod(int(b) for b in bins)
    w = weight if isinstance(weight, Tensor) else None
    hist = _bin_counts(pts, flat_pos, keep_all, cells, w).reshape(tuple(int(b) for b in bins))
    if density:
        vol: Tensor | None = None
        for d, wd in enumerate(widths):
            shape = [1] * len(bins)
            shape[d] = int(bins[d])
            wd = wd.reshape(shape)
            vol = wd if vol is None else F.mul(vol, wd)
        assert vol is not None
        hist = F.div(hist, F.mul(hist.reshape((-1,)).sum_reduce(0), vol))
    return hist


@op(aten.histogram.bin_ct)
def _histogram(cx: Ctx, x: Tensor, bins: int = 100, *, range: Any = None,  # noqa: A002
               weight: Any = None, density: bool = False) -> tuple:  # fmt: skip
    if not x.dtype.is_float:
        raise Unsupported("histogram of a non-float tensor")
    static_shape(x, "histogram")
    flat = x.reshape(-1)
    if flat.shape[0] == 0:
        raise Unsupported("histogram of an empty tensor")
    lo_v, hi_v = (0.0, 0.0) if range is None else (float(range[0]), float(range[1]))
    pos, keep, edges = _bins(cx, flat, bins, lo_v, hi_v)
    w = weight if isinstance(weight, Tensor) else None
    hist = _bin_counts(flat, pos, keep, bins, w)
    if density:
        widths = F.sub(edges.slice(0, 1, bins), edges.slice(0, 0, bins))  # (dim, start, length)
        hist = F.div(hist, F.mul(hist.sum_reduce(0), widths))
    return hist, edges
