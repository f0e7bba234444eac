"""Converters of ``convert.TABLE`` for the rest of PyTorch's op database that the primitives
can write: bilinear forms, pairwise distances, pooling gradients, histograms, padded
``nonzero``, index writes through several index tensors and solves from a Cholesky or LU
factor. Same contract as ``convert.py``: ``Unsupported`` sends a node to eager.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .. import functional as F
from ..functional._base import index_dtype, prod
from ..graph import dtypes as dt
from ..tensor import Tensor, broadcast_shapes
from .convert import Ctx, op
from .convert_extra import _empty_like_val, _output_used, _unrolled
from .symbols import Unsupported

aten = torch.ops.aten


def _static_shape(x: Tensor, what: str) -> tuple[int, ...]:
    if not all(isinstance(s, int) for s in x.shape):
        raise Unsupported(f"{what} of a symbolic shape {x.shape}")
    return tuple(int(s) for s in x.shape)  # type: ignore[arg-type]


def _const(cx: Ctx, data: np.ndarray) -> Tensor:
    return cx.g.tensor(np.ascontiguousarray(data))


# ----------------------------------------------------------------------------- special
for _tgt, _fn in (
    (aten.special_bessel_j0.default, F.bessel_j0), (aten.special_bessel_j1.default, F.bessel_j1),
    (aten.special_bessel_y0.default, F.bessel_y0), (aten.special_bessel_y1.default, F.bessel_y1),
    (aten.special_modified_bessel_k0.default, F.modified_bessel_k0),
    (aten.special_modified_bessel_k1.default, F.modified_bessel_k1),
    (aten.special_scaled_modified_bessel_k0.default, F.scaled_modified_bessel_k0),
    (aten.special_scaled_modified_bessel_k1.default, F.scaled_modified_bessel_k1),
    (aten.special_airy_ai.default, F.airy_ai),
):  # fmt: skip
    op(_tgt)(lambda cx, x, _f=_fn: _f(x))


# ----------------------------------------------------------------------------- nn
@op(aten._trilinear.default)
def _trilinear(cx: Ctx, i1: Tensor, i2: Tensor, i3: Tensor, expand1: Sequence[int],
               expand2: Sequence[int], expand3: Sequence[int], sumdim: Sequence[int],
               unroll_dim: int = 1) -> Tensor:  # fmt: skip
    """Each operand gets size-1 dims at its ``expand`` positions; the product is summed over
    ``sumdim`` (``F.bilinear`` is x1 (n, 1, i, 1) * W (1, o, i, j) * x2 (n, 1, 1, j))."""
    terms = []
    for x, ex in ((i1, expand1), (i2, expand2), (i3, expand3)):
        for d in sorted(ex):
            x = x.unsqueeze(d)
        terms.append(x)
    dtype = dt.promote(dt.promote(i1.dtype, i2.dtype), i3.dtype)
    prod = F.mul(F.mul(terms[0].cast(dtype), terms[1].cast(dtype)), terms[2].cast(dtype))
    return prod.sum_reduce(sorted(sumdim)) if sumdim else prod


@op(aten._pdist_forward.default)
def _pdist(cx: Ctx, x: Tensor, p: float = 2.0) -> Tensor:
    """||x_i - x_j||_p for i < j, row by row (torch.pdist's order)."""
    n, _ = _static_shape(x, "pdist")
    i, j = np.triu_indices(n, 1)
    if len(i) == 0:
        return F.full(cx.g, (0,), 0, dtype=x.dtype)
    a = F.index_select(x, 0, _const(cx, i.astype(np.int64)))
    b = F.index_select(x, 0, _const(cx, j.astype(np.int64)))
    return F.vector_norm(F.sub(a, b), p, -1)


@op(aten.max_pool2d_with_indices_backward.default, aten.max_pool3d_with_indices_backward.default)
def _max_pool_backward(cx: Ctx, grad: Tensor, x: Tensor, kernel: Any, stride: Any, padding: Any,
                       dilation: Any, ceil_mode: bool, indices: Tensor) -> Tensor:  # fmt: skip
    """Each output's gradient added at its maximum's flat index in its (n, c) plane."""
    nd = len(kernel)
    if x.ndim <= nd or grad.ndim != x.ndim or indices.ndim != x.ndim:
        raise Unsupported(f"max pooling backward of {x.shape}")
    lead = list(x.shape[:-nd])
    plane = [*lead, -1]
    zeros = F.full(cx.g, [*lead, prod(x.shape[-nd:])], 0, dtype=grad.dtype)
    out = F.scatter_add(zeros, -1, indices.reshape(plane), grad.reshape(plane))
    return out.reshape(x.shape)


# ----------------------------------------------------------------------------- data
@op(aten.nonzero_static.default)
def _nonzero_static(cx: Ctx, x: Tensor, *, size: int, fill_value: int = -1) -> Tensor:
    """The first ``size`` nonzero positions in row-major order, rows of ``fill_value`` after."""
    shape = _static_shape(x, "nonzero_static")
    nd, n = len(shape), int(np.prod(shape))
    if size == 0 or nd == 0 or n == 0:
        return F.full(cx.g, cx.shape(), fill_value, dtype=cx.dtype)
    hit = F.ne(x.reshape(-1), 0).cast(dt.i64)  # (n,)
    rank = F.sub(F.cumsum(hit, 0), 1)  # where each hit goes
    row = F.where(F.logical_and(F.ne(hit, 0), F.lt(rank, size)), rank, size)  # size: dropped
    coords = np.stack(np.unravel_index(np.arange(n), shape), -1).astype(np.int64)  # (n, nd)
    at = F.add(F.mul(row.unsqueeze(-1), nd), _const(cx, np.arange(nd, dtype=np.int64)))
    dest = F.full(cx.g, ((size + 1) * nd,), fill_value, dtype=dt.i64)
    out = F.scatter(dest, 0, at.reshape(-1), _const(cx, coords).reshape(-1))
    return out.reshape((size + 1, nd)).slice(0, 0, size)


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
    _static_shape(x, "histogramdd")
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
    _static_shape(x, "histogram")
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


@op(aten.index_put.default)
def _index_put(cx: Ctx, x: Tensor, indices: Sequence[Any], values: Any, accumulate: bool = False
               ) -> Tensor:  # fmt: skip
    """One index tensor: convert.py's write. Several adjacent integer index tensors address
    the merged dims they index: one linear index into x viewed with those dims merged."""
    given = [k for k, i in enumerate(indices) if i is not None]
    if len(given) == 1:
        return _one_index_put(cx, x, indices, values, accumulate)
    if not given or given != list(range(given[0], given[-1] + 1)):
        raise Unsupported("index_put with index tensors that are not adjacent")
    if any(not isinstance(indices[k], Tensor) or indices[k].dtype is dt.bool_ for k in given):
        raise Unsupported("index_put with boolean masks")
    d0, d1 = given[0], given[-1] + 1
    if not all(isinstance(s, int) for s in x.shape[d0:d1]):
        raise Unsupported("index_put through several index tensors into symbolic dims")
    sizes = [s for s in x.shape[d0:d1] if isinstance(s, int)]
    bshape: tuple[Any, ...] = ()
    for k in given:
        bshape = broadcast_shapes(bshape, indices[k].shape)
    n = int(np.prod(sizes))
    it = index_dtype(n)
    lin: Tensor | None = None
    for k, s in zip(given, sizes, strict=True):
        i = indices[k].cast(it)
        i = F.where(F.lt(i, 0), F.add(i, s), i).expand(bshape)
        lin = i if lin is None else F.add(F.mul(lin, s), i)
    assert lin is not None
    merged = x.reshape([*x.shape[:d0], n, *x.shape[d1:]])
    out = F.index_put(merged, [None] * d0 + [lin], values, accumulate)
    return out.reshape(x.shape)


def _one_index_put(cx: Ctx, x: Tensor, indices: Sequence[Any], values: Any, accumulate: bool
                   ) -> Tensor:  # fmt: skip
    from .convert import _index_put as core

    return core(cx, x, indices, values, accumulate)


# ----------------------------------------------------------------------------- linear algebra
def _batched_pair(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    lead = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return a.expand((*lead, *a.shape[-2:])), b.expand((*lead, *b.shape[-2:]))


def _chol_solve(b: Tensor, factor: Tensor, upper: bool) -> Tensor:
    """X with (L L^T) X = B, L lower (or U^T U with U upper)."""
    low = factor.mT if upper else factor
    low, b = _batched_pair(low, b)
    d = dt.promote(low.dtype, b.dtype)
    low, b = low.cast(d), b.cast(d)
    y = F.solve_triangular(low, b, upper=False)
    return F.solve_triangular(low.mT, y, upper=True)


@op(aten.cholesky_solve.default)
def _cholesky_solve(cx: Ctx, b: Tensor, factor: Tensor, upper: bool = False) -> Tensor:
    if factor.ndim >= 2 and factor.shape[-1] == 0:
        return F.full(cx.g, cx.shape(), 0, dtype=cx.dtype)
    _unrolled(factor, "cholesky_solve")
    if b.ndim < 2:
        raise Unsupported("cholesky_solve of a vector")
    return _chol_solve(b, factor, upper)


@op(aten.cholesky_inverse.default)
def _cholesky_inverse(cx: Ctx, factor: Tensor, upper: bool = False) -> Tensor:
    if factor.ndim >= 2 and factor.shape[-1] == 0:
        return F.full(cx.g, cx.shape(), 0, dtype=cx.dtype)
    _unrolled(factor, "cholesky_inverse")
    n = factor.shape[-1]
    eye = cx.g.eye(n, dtype=factor.dtype).expand(factor.shape)
    return _chol_solve(eye, factor, upper)


@op(aten.linalg_lu_solve.default)
def _lu_solve(cx: Ctx, lu: Tensor, piv: Tensor, b: Tensor, *, left: bool = True,
              adjoint: bool = False) -> Tensor:  # fmt: skip
    """A X = B (or A^T X = B, X A = B, X A^T = B) with A = P L U from lu_factor."""
    _unrolled(lu, "lu_solve")
    if b.ndim < 2:
        raise Unsupported("lu_solve of a vector")
    if not left:  # X A = B  <=>  A^T X^T = B^T (real matrices: adjoint is the transpose)
        return _lu_solve(cx, lu, piv, b.mT, left=True, adjoint=not adjoint).mT
    lead = broadcast_shapes(broadcast_shapes(lu.shape[:-2], b.shape[:-2]), piv.shape[:-1])
    n = lu.shape[-1]
    lu = lu.expand((*lead, n, n))
    piv = piv.expand((*lead, n))
    b = b.expand((*lead, *b.shape[-2:])).cast(lu.dtype)
    if not adjoint:
        return F.lu_solve(lu, piv, b)
    # A^T X = B: U^T L^T P^T X = B
    low, up = F.triangular._unpack(lu)
    y = F.solve_triangular(up.mT, b, upper=False)
    z = F.solve_triangular(low.mT, y, upper=True, unitriangular=True)
    return F.matmul(F.permutation_matrix(piv, int(n)).cast(lu.dtype), z)  # type: ignore[arg-type]


@op(aten._linalg_eigh.default)
def _eigh(cx: Ctx, a: Tensor, UPLO: str = "L", compute_v: bool = True) -> tuple:  # noqa: N803
    if compute_v and _output_used(cx, 1):
        raise Unsupported("eigenvectors (their signs are LAPACK's choice)")
    if a.numel() == 0:
        return _empty_like_val(cx, 0), _empty_like_val(cx, 1)
    return F.eigvalsh(a, UPLO), _empty_like_val(cx, 1)


@op(aten._linalg_svd.default)
def _svd(cx: Ctx, a: Tensor, full_matrices: bool = True, compute_uv: bool = True,
         driver: Any = None) -> tuple:  # fmt: skip
    if compute_uv and (_output_used(cx, 0) or _output_used(cx, 2)):
        raise Unsupported("singular vectors (their signs are LAPACK's choice)")
    if a.numel() == 0:
        return _empty_like_val(cx, 0), _empty_like_val(cx, 1), _empty_like_val(cx, 2)
    return _empty_like_val(cx, 0), F.svdvals(a), _empty_like_val(cx, 2)


@op(aten.linalg_pinv.atol_rtol_tensor, aten.linalg_pinv.atol_rtol_float)
def _pinv(cx: Ctx, a: Tensor, *, atol: Any = None, rtol: Any = None, hermitian: bool = False
          ) -> Tensor:  # fmt: skip
    return F.pinv(a, atol, rtol, hermitian)


@op(aten.geqrf.default)
def _geqrf(cx: Ctx, a: Tensor) -> tuple:
    return F.geqrf(a)


@op(aten.linalg_householder_product.default)
def _householder_product(cx: Ctx, a: Tensor, tau: Tensor) -> Tensor:
    return F.householder_product(a, tau)


@op(aten.ormqr.default)
def _ormqr(cx: Ctx, a: Tensor, tau: Tensor, c: Tensor, left: bool = True,
           transpose: bool = False) -> Tensor:  # fmt: skip
    return F.ormqr(a, tau, c, left, transpose)


@op(aten.linalg_qr.default)
def _qr(cx: Ctx, a: Tensor, mode: str = "reduced") -> tuple:
    if a.numel() == 0:
        return _empty_like_val(cx, 0), _empty_like_val(cx, 1)
    return F.qr(a, mode)


# ----------------------------------------------------------------------------- groups
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
    if n > 16 and _output_used(cx, 1):
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


@op(aten._embedding_bag_forward_only.default, aten._embedding_bag.default)
def _embedding_bag(cx: Ctx, weight: Tensor, indices: Tensor, offsets: Tensor,
                   scale_grad_by_freq: bool = False, mode: int = 0, sparse: bool = False,
                   per_sample_weights: Any = None, include_last_offset: bool = False,
                   padding_idx: int = -1) -> tuple:  # fmt: skip
    """Sums, means or maxima of embedding rows over bags that start at ``offsets``; rows of
    ``padding_idx`` are left out (an empty bag gives zeros). Only the result converts: the
    bookkeeping outputs (offset2bag, bag sizes, argmax) are for the backward."""
    if any(_output_used(cx, k) for k in (1, 2, 3)):
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


@op(aten.as_strided_scatter.default)
def _as_strided_scatter(cx: Ctx, x: Tensor, src: Tensor, size: Any, stride: Any,
                        storage_offset: Any = None) -> Tensor:  # fmt: skip
    """``src`` written into x's memory where ``x.as_strided(size, stride, offset)`` reads; a
    position the view covers twice gets the last of its elements, as a sequential copy."""
    base = cx.node.args[0].meta.get("val") if cx.node is not None else None
    if not isinstance(base, torch.Tensor) or base.storage_offset() != 0 or \
            not base.is_contiguous():  # fmt: skip
        raise Unsupported("as_strided_scatter into a tensor that is not its own storage")
    if not all(isinstance(v, int) for v in (*size, *stride, *x.shape)):
        raise Unsupported("as_strided_scatter with symbolic sizes or strides")
    off = int(storage_offset or 0)
    shape = tuple(int(v) for v in size)
    pos = np.full(shape, off, np.int64)
    for d, st in enumerate(stride):
        pos = pos + np.arange(shape[d], dtype=np.int64).reshape(
            [1] * d + [shape[d]] + [1] * (len(shape) - d - 1)) * int(st)  # fmt: skip
    flat_pos = pos.reshape(-1)
    # duplicates: keep the last writer only, as PyTorch's element-by-element copy does
    last = {int(p): k for k, p in enumerate(flat_pos)}
    keep = np.array(sorted(last.values()), np.int64)
    n = math.prod(v for v in x.shape if isinstance(v, int))  # static: checked above
    if len(flat_pos) and (flat_pos.min() < 0 or flat_pos.max() >= n):
        raise Unsupported("as_strided_scatter outside the tensor's memory")
    flat = x.reshape((-1,)) if x.ndim != 1 else x
    if not len(keep):
        return x
    vals = F.index_select(src.cast(x.dtype).reshape((-1,)), 0, _const(cx, keep))
    out = F.scatter(flat, 0, _const(cx, flat_pos[keep]), vals)
    return out.reshape(x.shape)


@op(aten.grid_sampler_3d.default)
def _grid_sampler_3d(cx: Ctx, x: Tensor, grid: Tensor, interpolation_mode: int,
                     padding_mode: int, align_corners: bool) -> Tensor:  # fmt: skip
    """Trilinear (mode 0) or nearest (mode 1) samples of (N, C, D, H, W) at grid (N, D', H',
    W', 3) positions (x, y, z in [-1, 1]), zeros (0) or border (1) padding."""
    if interpolation_mode not in (0, 1) or padding_mode not in (0, 1) or x.ndim != 5:
        raise Unsupported("grid_sampler_3d other than trilinear / nearest with zeros / border")
    if not all(isinstance(s, int) for s in (*x.shape, *grid.shape)):
        raise Unsupported("grid_sampler_3d of symbolic sizes")
    sizes = [int(x.shape[k]) for k in (4, 3, 2)]  # type: ignore[arg-type]  # W, H, D: x, y, z
    n, c = x.shape[0], x.shape[1]
    out_sp = list(grid.shape[1:4])
    g = grid.cast(dt.f64 if x.dtype is dt.f64 else dt.f32)
    coords = []
    for k, s in enumerate(sizes):
        v = g.slice(-1, k, 1).squeeze(-1)  # (N, D', H', W')
        if align_corners:
            v = F.mul(F.add(v, 1.0), (s - 1) / 2)
        else:
            v = F.mul(F.sub(F.mul(F.add(v, 1.0), s), 1.0), 0.5)
        if padding_mode == 1:
            v = F.clamp(v, 0.0, float(s - 1))
        coords.append(v)
    flat = x.reshape((n, c, -1))
    npos = int(np.prod(out_sp))  # type: ignore[arg-type]

    def corner(ix: list[Tensor], w: Tensor | None) -> Tensor:
        inside = None
        lin: Tensor | None = None
        for v, s, stride in zip(ix, sizes, (1, sizes[0], sizes[0] * sizes[1]), strict=True):
            ok = F.logical_and(F.ge(v, 0), F.lt(v, s))
            inside = ok if inside is None else F.logical_and(inside, ok)
            term = F.mul(F.clamp(v, 0, s - 1), stride)
            lin = term if lin is None else F.add(lin, term)
        assert lin is not None and inside is not None
        idx = lin.reshape((n, 1, npos)).expand((n, c, npos))
        vals = F.gather(flat, 2, idx)
        wt = inside.cast(vals.dtype) if w is None else F.mul(w, inside.cast(w.dtype))
        return F.mul(vals, wt.reshape((n, 1, npos)).cast(vals.dtype))

    if interpolation_mode == 1:  # nearest: round half to even, as nearbyint
        out = corner([F.round(v).cast(dt.i64) for v in coords], None)
    else:
        lo = [F.floor(v) for v in coords]
        fr = [F.sub(v, f) for v, f in zip(coords, lo, strict=True)]
        out = None
        for bits in range(8):
            ix, w = [], None
            for k in range(3):
                hi = (bits >> k) & 1
                ix.append(F.add(lo[k], float(hi)).cast(dt.i64))
                wk = fr[k] if hi else F.sub(1.0, fr[k])
                w = wk if w is None else F.mul(w, wk)
            term = corner(ix, w)
            out = term if out is None else F.add(out, term)
    assert out is not None
    return out.reshape((n, c, *out_sp)).cast(x.dtype)


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
    if any(_output_used(cx, k) for k in (1, 2, 3)) or reduction not in ("mean", "sum"):
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


def _aa_weights(n_in: int, n_out: int, scale_opt: Any) -> np.ndarray:
    """(n_out, n_in) antialiased bilinear (triangle filter) weights, PyTorch's and PIL's:
    the filter widens by the scale when downsampling, each row normalized to sum 1."""
    scale = 1.0 / scale_opt if scale_opt else n_in / n_out
    support = scale if scale >= 1.0 else 1.0
    inv = 1.0 / scale if scale >= 1.0 else 1.0
    w = np.zeros((n_out, n_in))
    for i in range(n_out):
        center = scale * (i + 0.5)
        lo = max(int(center - support + 0.5), 0)
        hi = min(int(center + support + 0.5), n_in)
        xs = (np.arange(lo, hi) - center + 0.5) * inv
        row = np.clip(1.0 - np.abs(xs), 0.0, None)
        total = row.sum()
        w[i, lo:hi] = row / total if total != 0 else row
    return w


@op(aten._upsample_bilinear2d_aa.default)
def _upsample_aa(cx: Ctx, x: Tensor, output_size: Sequence[int], align_corners: bool,
                 scales_h: Any = None, scales_w: Any = None) -> Tensor:  # fmt: skip
    """Antialiased bilinear resizing as two products with constant (static-size) weights."""
    if align_corners or x.ndim != 4:
        raise Unsupported("antialiased upsampling with align_corners")
    h, w = x.shape[-2], x.shape[-1]
    if not isinstance(h, int) or not isinstance(w, int):
        raise Unsupported("antialiased upsampling of symbolic sizes")
    oh, ow = (int(v) for v in output_size)
    d = x.dtype if x.dtype.is_float else dt.f32
    wh = cx.g.tensor(_aa_weights(h, oh, scales_h).astype(np.float32)).cast(d)
    ww = cx.g.tensor(_aa_weights(w, ow, scales_w).astype(np.float32)).cast(d)
    return F.matmul(F.matmul(wh, x.cast(d)), ww.mT)


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
