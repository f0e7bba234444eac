"""``scatter_reduce`` and ``index_reduce`` named as in PyTorch (sum, prod, mean, amax, amin).

SCATTER writes one value per position, so a reduction of colliding writes is computed densely
instead: for every output position i along ``dim`` and every source element j, ``index[j] == i``
selects j, and the selected values are reduced along j (``sum``/``max`` reductions, a product
tree for ``prod``). That costs (output length x source length) per row, so the product is
limited to ``MAX_PAIRS`` when static.
"""

from __future__ import annotations

from typing import Any

from ..graph import dtypes as dt
from ..graph import symbolic as sym
from ..graph.view import idx_vars
from ..tensor import Tensor
from ._base import const, int_limits, iota, need_tensor, prod, same
from .elementwise import _eq, maximum, minimum, where
from .movement import movedim
from .reduce import amax, amin
from .reduce import prod as reduce_prod

__all__ = ["MAX_PAIRS", "index_reduce", "scatter_reduce"]

MAX_PAIRS = 1 << 24
_REDUCES = ("sum", "prod", "mean", "amax", "amin")


def _extreme(d: dt.DType, largest: bool) -> Any:
    if d.is_float:
        return -float("inf") if largest else float("inf")
    if d is dt.bool_:
        return not largest
    lo, hi = int_limits(d)
    return lo if largest else hi


def _dense(name: str, x: Tensor, d: int, idx: Tensor, src: Tensor, reduce: str,
           include_self: bool) -> Tensor:  # fmt: skip
    """The reduction, with ``idx`` and ``src`` of one shape whose other dims fit in x's."""
    if reduce not in _REDUCES:
        raise ValueError(f"{name}: reduce must be one of {', '.join(_REDUCES)}, got {reduce!r}")
    if reduce == "mean" and not x.dtype.is_float:
        raise TypeError(f"{name}: reduce='mean' needs a float input, got {x.dtype.name}")
    n, m = x.shape[d], idx.shape[d]
    if isinstance(n, int) and isinstance(m, int) and n * m > MAX_PAIRS:
        raise ValueError(f"{name}: {n} output x {m} source positions along dim {d} exceed "
                         f"{MAX_PAIRS} pairs (each pair is compared)")  # fmt: skip
    g = x.graph
    il = movedim(idx, d, -1)  # (..., M)
    sl = movedim(src.cast(x.dtype), d, -1)
    shape = (*il.shape[:-1], n, m)
    hit = _eq(il.unsqueeze(-2).expand(shape).cast(dt.i64),
              iota(g, shape, idx_vars(shape)[-2], dt.i64))  # fmt: skip
    vals = sl.unsqueeze(-2).expand(shape)
    count = hit.cast(dt.i64).sum_reduce(-1)
    if reduce in ("sum", "mean"):
        red = where(hit, vals, 0).sum_reduce(-1)
    elif reduce == "prod":
        red = reduce_prod(where(hit, vals, 1), -1)
    else:
        big = reduce == "amax"
        red = (amax if big else amin)(where(hit, vals, _extreme(x.dtype, big)), -1)
    # x over the positions the index reaches (its other dims may be shorter than x's)
    xl = movedim(x, d, -1)
    region = xl
    for k, size in enumerate(il.shape[:-1]):
        if not same(size, xl.shape[k]):
            region = region.slice(k, 0, size)
    if include_self:
        if reduce == "sum":
            out = region.add(red)
        elif reduce == "prod":
            out = region.mul(red)
        elif reduce == "mean":
            out = region.add(red).mul(count.add(1).cast(x.dtype).reciprocal())
        else:
            out = (maximum if reduce == "amax" else minimum)(region, red)
    else:
        if reduce == "mean":
            red = red.mul(maximum(count, 1).cast(x.dtype).reciprocal())
        out = where(count.lt(1), region, red)
    if out.shape != xl.shape:  # put the region back into x
        mask = const(g, True, dt.bool_, out.shape)
        for k, size in enumerate(out.shape[:-1]):
            pad = sym.add(xl.shape[k], sym.mul(size, -1))
            out, mask = out.pad_dim(k, 0, pad), mask.pad_dim(k, 0, pad)
        out = where(mask, out, xl)
    return movedim(out, -1, d)


def scatter_reduce(input: Tensor, dim: int, index: Tensor, src: Tensor, reduce: str, *,  # noqa: A002
                   include_self: bool = True) -> Tensor:  # fmt: skip
    x = need_tensor("scatter_reduce", input)
    idx = need_tensor("scatter_reduce", index, "index")
    s = need_tensor("scatter_reduce", src, "src")
    if x.ndim == 0:
        x1 = x.reshape(1)
        return scatter_reduce(x1, 0, idx.reshape(-1), s.reshape(-1), reduce,
                              include_self=include_self).reshape(())  # fmt: skip
    if idx.ndim != x.ndim or s.ndim != x.ndim:
        raise ValueError(f"scatter_reduce: index {idx.shape} and src {s.shape} need the input's "
                         f"rank ({x.shape})")  # fmt: skip
    if prod(idx.shape) == 0:
        return x
    d = x._axis(dim)
    for k, size in enumerate(idx.shape):
        if not same(size, s.shape[k]):
            s = s.slice(k, 0, size)
    return _dense("scatter_reduce", x, d, idx, s, reduce, include_self)


def index_reduce(input: Tensor, dim: int, index: Tensor, source: Tensor, reduce: str, *,  # noqa: A002
                 include_self: bool = True) -> Tensor:  # fmt: skip
    x = need_tensor("index_reduce", input)
    idx = need_tensor("index_reduce", index, "index")
    s = need_tensor("index_reduce", source, "source")
    if x.ndim == 0:
        return index_reduce(x.reshape(1), 0, idx.reshape(-1), s.reshape(-1), reduce,
                            include_self=include_self).reshape(())  # fmt: skip
    if idx.ndim != 1:
        raise ValueError(f"index_reduce: index must be 1-D, got {idx.shape}")
    d = x._axis(dim)
    if idx.shape[0] == 0:
        return x
    full = idx.reshape([idx.shape[0] if k == d else 1 for k in range(x.ndim)]).expand(s.shape)
    return _dense("index_reduce", x, d, full, s, reduce, include_self)
