"""Converters of indexing and writes through indices: advanced indexing, ``index_select``,
``gather`` and embeddings; ``scatter`` and its reductions, ``index_put`` through one or several
index tensors, ``slice_scatter`` / ``diagonal_scatter`` / ``as_strided_scatter``,
``masked_scatter``, ``put`` and padded ``nonzero``. Same contract as ``convert.py``: arguments
arrive as luminal values, ``Unsupported`` sends a node to eager.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from .. import functional as F
from ..functional._base import index_dtype
from ..graph import dtypes as dt
from ..graph import symbolic as sym
from ..graph.view import idx_vars
from ..tensor import Tensor, broadcast_shapes
from .convert import Converter, Ctx, constant, need_tensor, op, static_shape
from .symbols import Unsupported

aten = torch.ops.aten


# ----------------------------------------------------------------------------- indexing
@op(aten.index.Tensor, aten._unsafe_index.Tensor)
def _index(cx: Ctx, x: Tensor, indices: Sequence[Any]) -> Tensor:
    key = tuple(slice(None) if i is None else need_tensor(i, "index") for i in indices)
    if any(isinstance(k, Tensor) and k.dtype is dt.bool_ for k in key):
        raise Unsupported("indexing with a bool mask (data-dependent shape)")
    return F.getitem(x, key)


@op(aten.index_select.default)
def _index_select(cx: Ctx, x: Tensor, dim: int, index: Tensor) -> Tensor:
    if x.ndim == 0:  # torch treats a 0-d input as 1-d here
        return F.index_select(x.reshape((1,)), 0, index.reshape((-1,))).reshape(cx.shape())
    return F.index_select(x, dim, index)


@op(aten.gather.default)
def _gather(cx: Ctx, x: Tensor, dim: int, index: Tensor, *, sparse_grad: bool = False) -> Tensor:
    return F.gather(x, dim, index)


@op(aten.embedding.default)
def _embedding(cx: Ctx, weight: Tensor, indices: Tensor, padding_idx: int = -1, *args: Any
               ) -> Tensor:  # fmt: skip
    return F.embedding(indices, weight)


@op(aten.scatter.src, aten.scatter.value)
def _scatter(cx: Ctx, x: Tensor, dim: int, index: Tensor, src: Any) -> Tensor:
    if isinstance(src, Tensor):
        return F.scatter(x, dim, index, src)
    return F.scatter(x, dim, index, value=src)


@op(aten.scatter_add.default)
def _scatter_add(cx: Ctx, x: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:
    return F.scatter_add(x, dim, index, src)


@op(aten.index_put.default)
def _index_put(cx: Ctx, x: Tensor, indices: Sequence[Any], values: Any, accumulate: bool = False
               ) -> Tensor:  # fmt: skip
    """One index tensor: ``_one_index_put``. Several adjacent integer index tensors address
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
    """One integer index tensor; into a written graph input, an update in place."""
    given = [i for i in indices if i is not None]
    if len(given) != 1 or given[0].dtype is dt.bool_ or indices[-1] is None:
        raise Unsupported("index_put with other than one integer index (None before it)")
    flat = cx.flat_inputs.get(id(x))
    if flat is not None and given[0].ndim == 1 and not accumulate and isinstance(values, Tensor):
        out = F.index_put_flat(flat, x.shape, list(indices), values)  # can update in place
        cx.flat_writes[id(out.node)] = (flat.node, out.layout)
        return out
    return F.index_put(x, list(indices), values, accumulate)


# ----------------------------------------------------------------------------- index reductions
# the same reduction into x, by an index per element of src (scatter_reduce) or per slice
# along dim (index_reduce)
_INDEX_REDUCTIONS: dict[Any, tuple[str, Callable[..., Tensor]]] = {
    aten.scatter_reduce.two: ("scatter_reduce", F.scatter_reduce),
    aten.index_reduce.default: ("index_reduce", F.index_reduce),
}


def _index_reduction(what: str, fn: Callable[..., Tensor]) -> Converter:
    def convert(cx: Ctx, x: Tensor, dim: int, index: Tensor, src: Tensor, reduce: str, *,
                include_self: bool = True) -> Tensor:  # fmt: skip
        if reduce == "mean" and not x.dtype.is_float:
            raise Unsupported(f"an integer {what} mean (PyTorch floors it)")
        return fn(x, dim, index, src, reduce, include_self=include_self)

    return convert


for _target, (_what, _fn) in _INDEX_REDUCTIONS.items():
    op(_target)(_index_reduction(_what, _fn))


# ----------------------------------------------------------------------------- scatters into views
def _norm_start(start: Any, n: Any) -> int:
    if start is None:
        return 0
    if not isinstance(start, int) or not isinstance(n, int):
        raise Unsupported("a scatter into a slice at a symbolic position")
    return min(max(start + n if start < 0 else start, 0), n)


def _slice_scatter_unit(cx: Ctx, x: Tensor, src: Tensor, d: int, start: Any, end: Any) -> Tensor:
    """Unit steps: ``src`` padded into place and selected by a range test, with bounds that
    may be symbolic."""
    n = x.shape[d]
    lo = 0 if start is None else start
    hi = n if end is None else end
    if not all(isinstance(e, (int, sym.Expr)) for e in (lo, hi)):
        raise Unsupported("slice_scatter with non-integer bounds")
    lo = cx.dims.position(lo, n, "slice_scatter")
    hi = sym.minimum(cx.dims.position(hi, n, "slice_scatter"), n)
    placed = src.cast(x.dtype).pad_dim(d, lo, sym.add(n, sym.mul(hi, -1)))
    pos = F.arange(cx.g, n, dtype=dt.i32).reshape([n if k == d else 1 for k in range(x.ndim)])
    bounds: tuple[Any, Any] = (lo, hi)  # dims: Tensor comparisons take expressions too
    inside = F.logical_and(F.ge(pos, bounds[0]), F.lt(pos, bounds[1]))
    return F.where(inside.expand(x.shape), placed, x)


@op(aten.slice_scatter.default)
def _slice_scatter(cx: Ctx, x: Tensor, src: Tensor, dim: int = 0, start: Any = None,
                   end: Any = None, step: int = 1) -> Tensor:  # fmt: skip
    """``x`` with ``x[start:end:step]`` along ``dim`` replaced by ``src``."""
    d = x._axis(dim)
    if step == 1:
        return _slice_scatter_unit(cx, x, src, d, start, end)
    n, m = x.shape[d], src.shape[d]
    s0 = _norm_start(start, n)
    if not isinstance(m, int):
        raise Unsupported("a strided scatter of a symbolic-length slice")
    if m == 0:
        return x
    i = idx_vars((n,))[0]
    off = sym.add(i, -s0)
    j = sym.minimum(sym.maximum(sym.floordiv(off, step), 0), m - 1)
    ge0 = sym.add(1, sym.mul(sym.lt(off, 0), -1))
    inside = sym.mul(sym.mul(ge0, sym.lt(off, m * step)), sym.eq(sym.mod(off, step), 0))
    taken = F.index_select(src.cast(x.dtype), d, F._base.iota(cx.g, (n,), j, dt.i64))
    mask = F._base.iota(cx.g, (n,), inside, dt.i32).cast(dt.bool_)
    mask = mask.reshape([n if k == d else 1 for k in range(x.ndim)]).expand(x.shape)
    return F.where(mask, taken, x)


@op(aten.diagonal_scatter.default)
def _diagonal_scatter(cx: Ctx, x: Tensor, src: Tensor, offset: int = 0, dim1: int = 0,
                      dim2: int = 1) -> Tensor:  # fmt: skip
    d1, d2 = x._axis(dim1), x._axis(dim2)
    a, b = x.shape[d1], x.shape[d2]
    length = src.shape[-1]
    if not all(isinstance(v, int) for v in (a, b, length)):
        raise Unsupported("diagonal_scatter over symbolic sizes")
    if length == 0:
        return x
    rest = [k for k in range(x.ndim) if k not in (d1, d2)]
    t = x.permute(rest + [d1, d2])
    ia, ib = idx_vars((a, b))
    n_along = a if offset >= 0 else b  # the source index is the row (column) index
    k = sym.minimum(idx_vars((n_along,))[0], length - 1)
    pick = F.index_select(src.cast(x.dtype), -1, F._base.iota(cx.g, (n_along,), k, dt.i64))
    srcx = pick.unsqueeze(-1) if offset >= 0 else pick.unsqueeze(-2)
    srcx = srcx.expand(t.shape)
    on = F._base.iota(cx.g, (a, b), sym.eq(sym.add(ib, sym.mul(ia, -1)), offset), dt.i32)
    mask = on.cast(dt.bool_).expand(t.shape)
    out = F.where(mask, srcx, t)
    inv = [0] * x.ndim
    for pos, k2 in enumerate(rest + [d1, d2]):
        inv[k2] = pos
    return out.permute(inv)


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
    vals = F.index_select(src.cast(x.dtype).reshape((-1,)), 0, constant(cx, keep))
    out = F.scatter(flat, 0, constant(cx, flat_pos[keep]), vals)
    return out.reshape(x.shape)


@op(aten.masked_scatter.default)
def _masked_scatter(cx: Ctx, x: Tensor, mask: Tensor, source: Tensor) -> Tensor:
    """The k-th set position (row-major) takes source's k-th element: k from a cumsum."""
    m = mask.expand(x.shape).reshape((-1,))
    n = source.numel()
    if x.numel() == 0 or n == 0:
        return x
    k = F.cumsum(m.cast(dt.i64), 0).add(-1)
    k = F.clamp(k, 0, n - 1 if isinstance(n, int) else cx.g.constant(sym.add(n, -1), dt.i64))
    taken = F.index_select(source.reshape((-1,)).cast(x.dtype), 0, k)
    return F.where(m, taken, x.reshape((-1,))).reshape(x.shape)


@op(aten.put.default)
def _put(cx: Ctx, x: Tensor, index: Tensor, source: Tensor, accumulate: bool = False) -> Tensor:
    flat = x.reshape((-1,))
    n = flat.shape[0]
    idx = index.reshape((-1,)).cast(dt.i64)
    size = n if isinstance(n, int) else cx.g.constant(n, dt.i64)
    idx = F.where(F.lt(idx, 0), F.add(idx, size), idx)
    src = source.reshape((-1,)).cast(x.dtype)
    if idx.shape[0] == 0:
        return x
    out = F.scatter_add(flat, 0, idx, src) if accumulate else F.scatter(flat, 0, idx, src)
    return out.reshape(x.shape)


@op(aten.nonzero_static.default)
def _nonzero_static(cx: Ctx, x: Tensor, *, size: int, fill_value: int = -1) -> Tensor:
    """The first ``size`` nonzero positions in row-major order, rows of ``fill_value`` after."""
    shape = static_shape(x, "nonzero_static")
    nd, n = len(shape), int(np.prod(shape))
    if size == 0 or nd == 0 or n == 0:
        return F.full(cx.g, cx.shape(), fill_value, dtype=cx.dtype)
    hit = F.ne(x.reshape(-1), 0).cast(dt.i64)  # (n,)
    rank = F.sub(F.cumsum(hit, 0), 1)  # where each hit goes
    row = F.where(F.logical_and(F.ne(hit, 0), F.lt(rank, size)), rank, size)  # size: dropped
    coords = np.stack(np.unravel_index(np.arange(n), shape), -1).astype(np.int64)  # (n, nd)
    at = F.add(F.mul(row.unsqueeze(-1), nd), constant(cx, np.arange(nd, dtype=np.int64)))
    dest = F.full(cx.g, ((size + 1) * nd,), fill_value, dtype=dt.i64)
    out = F.scatter(dest, 0, at.reshape(-1), constant(cx, coords).reshape(-1))
    return out.reshape((size + 1, nd)).slice(0, 0, size)
