"""Sorting and order statistics named as in PyTorch: ``sort``, ``argsort``, ``msort``, ``topk``,
``kthvalue``, ``median``, ``nanmedian``; and the log-space scan ``logcumsumexp``.

There is no primitive for a data-dependent permutation, so a sort is a ranking: the rank of
element i along the axis is the number of elements that come before it (smaller, or equal and
at a smaller index: a stable order, which is also what PyTorch's CPU sort gives), computed by
comparing every pair (n x n per row), then the inverse permutation is a SCATTER of the
positions to their ranks, and the values a GATHER. NaN sorts as larger than every number, as in
PyTorch. The pair comparison costs n^2 per row, so a static sorted axis may have at most
``MAX_SORT`` elements (a longer one raises ``ValueError``). ``sort`` and ``argsort`` also take a
symbolic axis (a mixture of experts' token-expert pairs: the plan's cost grows with the
square of the length it is called with); ``topk``, ``kthvalue`` and the medians need a static
one.
"""

from __future__ import annotations

import math
from typing import Any

from ..graph import dtypes as dt
from ..graph import symbolic as sym
from ..graph.view import idx_vars
from ..tensor import Tensor
from ._base import const, iota, land, lnot, lor, need_tensor
from .elementwise import _eq, abs, eq, floor, isnan, maximum, where
from .index import gather, scatter
from .reduce import ValuesIndices
from .transcendental import _exp, _log1p

__all__ = ["MAX_SORT", "argsort", "kthvalue", "logcumsumexp", "median", "msort", "nanmedian",
           "sort", "topk"]  # fmt: skip

MAX_SORT = 8192  # n^2 comparisons per row: 64M at this size


def _sort_axis(name: str, x: Tensor, dim: int, symbolic: bool = False) -> tuple[Tensor, int, Any]:
    """x with the sorted axis last (a view), that axis, and its length (static unless
    ``symbolic``)."""
    d = x._axis(dim)
    n = x.shape[d]
    if not isinstance(n, int) and not symbolic:
        raise ValueError(f"{name}: the sorted axis must have a static size, got {n}")
    if isinstance(n, int) and n > MAX_SORT:
        raise ValueError(f"{name}: the sorted axis has {n} elements; at most {MAX_SORT} "
                         "are supported (a sort compares every pair)")  # fmt: skip
    if isinstance(x.numel(), int) and x.numel() == 0:
        raise ValueError(f"{name}: an empty input {x.shape} has nothing to sort")
    order = [k for k in range(x.ndim) if k != d] + [d]
    return x.permute(order), d, n


def _before(a: Tensor, b: Tensor, descending: bool) -> Tensor:
    """Whether b strictly precedes a in the order (NaN largest)."""
    if a.dtype is dt.bool_:
        a, b = a.cast(dt.i32), b.cast(dt.i32)
    s = b.lt(a) if not descending else a.lt(b)
    if a.dtype.is_float:
        na, nb = isnan(a), isnan(b)
        s = lor(s, land(na, lnot(nb)) if not descending else land(nb, lnot(na)))
    return s


def _same(a: Tensor, b: Tensor) -> Tensor:
    if a.dtype is dt.bool_:
        a, b = a.cast(dt.i32), b.cast(dt.i32)
    e = _eq(a, b)
    return lor(e, land(isnan(a), isnan(b))) if a.dtype.is_float else e


def _ranked(xl: Tensor, n: Any, descending: bool) -> tuple[Tensor, Tensor]:
    """(sorted values, source indices) along the last axis of ``xl``."""
    g = xl.graph
    shape = (*xl.shape, n)
    xi = xl.unsqueeze(-1).expand(shape)  # element i along axis -2
    xj = xl.unsqueeze(-2).expand(shape)  # element j along axis -1
    iv = idx_vars(shape)
    earlier = iota(g, shape, sym.lt(iv[-1], iv[-2]), dt.i32).cast(dt.bool_)
    first = lor(_before(xi, xj, descending), land(_same(xi, xj), earlier))
    rank = first.cast(dt.i64).sum_reduce(-1)
    pos = iota(g, xl.shape, idx_vars(xl.shape)[-1], dt.i64)
    idx = scatter(const(g, 0, dt.i64, xl.shape), -1, rank, pos)
    return gather(xl, -1, idx), idx


def _restore(t: Tensor, d: int) -> Tensor:
    """Undo ``_sort_axis``'s permute."""
    nd = t.ndim
    order = list(range(nd - 1))
    order.insert(d, nd - 1)
    return t.permute(order)


def sort(input: Tensor, dim: int = -1, descending: bool = False, stable: bool = False  # noqa: A002
         ) -> ValuesIndices:  # fmt: skip
    x = need_tensor("sort", input)
    if x.ndim == 0:
        return ValuesIndices(x, const(x.graph, 0, dt.i64))
    xl, d, n = _sort_axis("sort", x, dim, symbolic=True)
    v, i = _ranked(xl, n, descending)
    return ValuesIndices(_restore(v, d), _restore(i, d))


def argsort(input: Tensor, dim: int = -1, descending: bool = False, stable: bool = False  # noqa: A002
            ) -> Tensor:  # fmt: skip
    return sort(input, dim, descending, stable).indices


def msort(input: Tensor) -> Tensor:  # noqa: A002
    return sort(input, 0).values


def topk(input: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True  # noqa: A002
         ) -> ValuesIndices:  # fmt: skip
    x = need_tensor("topk", input)
    if x.ndim == 0:
        if k not in (0, 1):
            raise ValueError(f"topk: k ({k}) out of range for a 0-d input")
        return ValuesIndices(x, const(x.graph, 0, dt.i64))
    xl, d, n = _sort_axis("topk", x, dim)
    if not 0 <= k <= n:
        raise ValueError(f"topk: k ({k}) out of range for an axis of {n}")
    v, i = _ranked(xl, n, largest)
    return ValuesIndices(_restore(v.slice(-1, 0, k), d), _restore(i.slice(-1, 0, k), d))


def kthvalue(input: Tensor, k: int, dim: int = -1, keepdim: bool = False) -> ValuesIndices:  # noqa: A002
    """The k-th smallest (1-based) along ``dim`` and its index."""
    x = need_tensor("kthvalue", input)
    if x.ndim == 0:
        if k != 1:
            raise ValueError(f"kthvalue: k ({k}) out of range for a 0-d input")
        return ValuesIndices(x, const(x.graph, 0, dt.i64))
    xl, d, n = _sort_axis("kthvalue", x, dim)
    if not 1 <= k <= n:
        raise ValueError(f"kthvalue: k ({k}) out of range for an axis of {n}")
    v, i = _ranked(xl, n, False)
    v, i = _restore(v.slice(-1, k - 1, 1), d), _restore(i.slice(-1, k - 1, 1), d)
    return ValuesIndices(v, i) if keepdim else ValuesIndices(v.squeeze(d), i.squeeze(d))


def _median(name: str, x: Tensor, dim: int | None, keepdim: bool, ignore_nan: bool) -> Any:
    x = need_tensor(name, x)
    whole = dim is None
    if whole:
        x = x.reshape(-1) if x.ndim != 1 else x
        dim, keepdim = 0, False
    if x.ndim == 0:
        return x if whole else ValuesIndices(x, const(x.graph, 0, dt.i64))
    xl, d, n = _sort_axis(name, x, 0 if dim is None else dim)
    v, i = _ranked(xl, n, False)
    if x.dtype.is_float and ignore_nan:
        # the lower median of the non-NaN values, which sort first (a row of NaN only: the
        # middle one, as PyTorch)
        m = lnot(isnan(xl)).cast(dt.i64).sum_reduce(-1, keepdim=True)
        m = where(eq(m, 0), n, m)
        at = floor(m.add(-1).cast(dt.f32).mul(0.5)).cast(dt.i64)
        val, idx = gather(v, -1, at), gather(i, -1, at)
    else:
        mid = (n - 1) // 2
        val, idx = v.slice(-1, mid, 1), i.slice(-1, mid, 1)
        if x.dtype.is_float:  # a NaN anywhere is the median, at its first position
            has = isnan(xl).max_reduce(-1, keepdim=True)
            first = _first_nan(xl, n)
            val = where(has, math.nan, val)
            idx = where(has, first, idx)
    val, idx = _restore(val, d), _restore(idx, d)
    if not keepdim:
        val, idx = val.squeeze(d), idx.squeeze(d)
    return val if whole else ValuesIndices(val, idx)


def _first_nan(xl: Tensor, n: int) -> Tensor:
    g = xl.graph
    rev = iota(g, xl.shape, sym.add(n, sym.mul(idx_vars(xl.shape)[-1], -1)), dt.i64)  # n - i
    best = rev.mul(isnan(xl).cast(dt.i64)).max_reduce(-1, keepdim=True)
    return const(g, n, dt.i64, best.shape).add(best.mul(-1))


def median(input: Tensor, dim: int | None = None, keepdim: bool = False) -> Any:  # noqa: A002
    """The lower median; ``median(x)`` a value, ``median(x, dim)`` (values, indices)."""
    return _median("median", input, dim, keepdim, False)


def nanmedian(input: Tensor, dim: int | None = None, keepdim: bool = False) -> Any:  # noqa: A002
    return _median("nanmedian", input, dim, keepdim, True)


def logcumsumexp(input: Tensor, dim: int) -> Tensor:  # noqa: A002
    """log(cumsum(exp(x))) without overflow: a Hillis-Steele scan of the associative
    a (+) b = max(a, b) + log1p(exp(-|a - b|))."""
    x = need_tensor("logcumsumexp", input)
    if not x.dtype.is_float:
        raise TypeError(f"logcumsumexp: needs a float input, got {x.dtype.name}")
    low = x.dtype in (dt.f16, dt.bf16)
    v = x.cast(dt.f32) if low else x
    if v.ndim == 0:
        return x
    d = v._axis(dim)
    n = v.shape[d]
    k, top = 1, sym.upper_bound(n)
    while k < top:
        first = iota(v.graph, v.shape, sym.lt(idx_vars(v.shape)[d], k), dt.i32).cast(dt.bool_)
        sv = where(first, -math.inf, v.pad_dim(d, k, 0).slice(d, 0, n))
        hi = maximum(v, sv)
        lo = where(v.lt(sv), v, sv)
        step = hi.add(_log1p(_exp(lo.add(hi.mul(-1.0)))))
        # both -inf (nothing yet), or an infinite max: the max itself (inf - inf is NaN)
        v = where(eq(abs(hi), math.inf), hi, step)
        k *= 2
    return v.cast(x.dtype) if low else v
