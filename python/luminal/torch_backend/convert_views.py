"""Converters of casts, copies, views and creation: reshapes (symbolic sizes included),
expands, permutes, slices, concatenation and splits, padding, flips and rolls, the ``*_copy``
variants, ``unfold`` and ``as_strided`` windows, and tensors made from sizes (``full``,
``zeros``, ``arange``). Same contract as ``convert.py``: arguments arrive as luminal values,
``Unsupported`` sends a node to eager.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from .. import functional as F
from ..graph import dtypes as dt
from ..graph import symbolic as sym
from ..graph.view import contiguous_strides, idx_vars
from ..tensor import Tensor
from .convert import Ctx, op
from .symbols import Unsupported, dense_order

aten = torch.ops.aten
prims = torch.ops.prims


# ----------------------------------------------------------------------------- dtype / copies
@op(aten._to_copy.default)
def _to_copy(cx: Ctx, x: Tensor, **kw: Any) -> Tensor:
    dev = kw.get("device")
    if dev is not None and torch.device(dev).type != "cpu":
        raise Unsupported(f"copy to device {dev}")
    return x.cast(cx.dtype)


@op(prims.convert_element_type.default)
def _convert(cx: Ctx, x: Tensor, dtype: Any) -> Tensor:
    return x.cast(dt.to_dtype(dtype))


@op(aten.clone.default, aten.alias.default, aten.lift_fresh_copy.default, aten.detach.default,
    aten.contiguous.default)  # fmt: skip
def _identity(cx: Ctx, x: Tensor, *args: Any, **kw: Any) -> Tensor:
    return x


@op(aten.dropout.default)
def _dropout(cx: Ctx, x: Tensor, p: float, train: bool) -> Tensor:
    if train and p > 0:
        raise Unsupported("dropout in training mode")
    return x


@op(aten.copy.default)
def _copy(cx: Ctx, dst: Tensor, src: Any, non_blocking: bool = False) -> Tensor:
    return copy_value(cx, dst, src)


def copy_value(cx: Ctx, dst: Tensor, src: Any) -> Tensor:
    """The value ``copy_(dst, src)`` leaves in ``dst``: ``src`` cast and broadcast to dst's
    shape (an expand), or viewed to it where a size of src equals dst's only under a guard
    (``b * ((s + 1) // b)`` for ``s + 1``, which each call checks: view_exact)."""
    if not isinstance(src, Tensor):
        return F.full_like(dst, src)
    src = src.cast(dst.dtype)
    if tuple(src.shape) == tuple(dst.shape):
        return src
    try:
        return src.expand(dst.shape)
    except ValueError:
        pass
    hints = [[cx.dims.hint(n) for n in t.shape] for t in (src, dst)]
    if hints[0] != hints[1] or None in hints[0]:
        raise Unsupported(f"copy into {tuple(dst.shape)} from a value of shape "
                          f"{tuple(src.shape)}")  # fmt: skip
    try:
        return view_exact(cx, src, dst.shape)
    except ValueError as e:
        raise Unsupported(f"copy into {tuple(dst.shape)} from {tuple(src.shape)}: {e}") from e


# ----------------------------------------------------------------------------- views
@op(aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.squeeze.default,
    aten.squeeze.dim, aten.squeeze.dims, aten.unsqueeze.default, aten.flatten.using_ints,
    aten.unflatten.int, aten.view_as.default)  # fmt: skip
def _reshape(cx: Ctx, x: Tensor, *args: Any, **kw: Any) -> Tensor:
    # the fake value holds the resolved shape (no -1, symbolic sizes simplified by torch)
    return view_exact(cx, x, cx.shape())


def view_exact(cx: Ctx, x: Tensor, shape: Sequence[sym.sint]) -> Tensor:
    """``x`` viewed as ``shape``, also where the element counts agree only when the divisors
    of ``shape``'s quotients divide their dividends: a view to (b, a // b, ...) of a tensor of
    ``a`` elements per row (a batch split off rows that hold batch x heads), where ``a`` is a
    size or a size plus a constant (LED's ``s + 1`` chunks). Eager's view refuses the other
    sizes and dynamo guards the division; each call checks it (Dims.divides), and the
    elements are then the same, in order."""
    try:
        return x.reshape(shape)
    except ValueError:
        quotients: list[sym.Expr] = []
        for e in (*shape, *x.shape):
            _quotients_in(e, quotients)
        if not quotients:
            raise
    n: sym.sint = 1
    for e in shape:
        n = sym.mul(n, e)
    # the same count wherever each dividend is a multiple of its divisor: write it so
    exact: dict[str, sym.sint] = {}
    for k, q in enumerate(quotients):
        a, b = q.args[0], q.args[1]
        v, c = _size_plus_const(a)
        if v is None or v.name in exact:
            raise ValueError(f"reshape: cannot view {tuple(x.shape)} as {tuple(shape)}")
        k_dim = sym.dim(f"_exact{k}", 1, max(sym.upper_bound(a), 1))
        exact[v.name] = sym.add(sym.mul(b, k_dim), -c)
    if sym.add(sym.substitute(n, exact), sym.mul(sym.substitute(x.numel(), exact), -1)) != 0:
        raise ValueError(f"reshape: cannot view {tuple(x.shape)} as {tuple(shape)}")
    what = f"view to {tuple(shape)}"
    cx.dims.divides += [(q.args[0], q.args[1], what) for q in quotients]
    return x.reshape(-1).slice(0, 0, n).reshape(shape)


def _quotients_in(e: Any, out: list[sym.Expr]) -> None:
    """The floor divisions inside ``e`` (a sint, or the tuples of a sum's terms), each once."""
    if isinstance(e, tuple):
        for a in e:
            _quotients_in(a, out)
    elif isinstance(e, sym.Expr):
        if e.kind == sym.DIV:
            if e not in out:
                out.append(e)
        elif e.kind != sym.VAR:
            _quotients_in(e.args, out)


def _size_plus_const(a: sym.sint) -> tuple[Any, int]:
    """(v, c) where ``a`` is the dim ``v`` plus the constant ``c``; (None, 0) otherwise."""
    if isinstance(a, sym.Expr) and a.kind == sym.VAR:
        return a, 0
    if isinstance(a, sym.Expr) and a.kind == sym.ADD:
        terms, c = a.args
        if len(terms) == 1:
            ((v, coef),) = dict(terms).items()
            if coef == 1 and v.kind == sym.VAR:
                return v, c
    return None, 0


@op(aten.expand.default, aten.expand_as.default)
def _expand(cx: Ctx, x: Tensor, *args: Any, **kw: Any) -> Tensor:
    return x.expand(cx.shape())


@op(aten.permute.default, aten.permute_copy.default)
def _permute(cx: Ctx, x: Tensor, dims: Sequence[int]) -> Tensor:
    return x.permute(list(dims))


@op(aten.transpose.int)
def _transpose(cx: Ctx, x: Tensor, a: int, b: int) -> Tensor:
    return F.transpose(x, a, b)


@op(aten.t.default)
def _t(cx: Ctx, x: Tensor) -> Tensor:
    return F.t(x)


@op(aten.slice.Tensor)
def _slice(cx: Ctx, x: Tensor, dim: int = 0, start: Any = None, end: Any = None, step: int = 1
           ) -> Tensor:  # fmt: skip
    d = x._axis(dim)
    n = x.shape[d]
    length = cx.shape()[d]  # torch's, end and clamping applied
    if start is None:
        start = 0
    elif cx.dims.negative(start, "slice"):
        start = sym.maximum(sym.add(n, start), 0)
    elif not sym.prove_lt(start, sym.add(n, 1)):
        start = sym.minimum(start, n)
    return x.slice(d, start, length, step)


@op(aten.select.int)
def _select(cx: Ctx, x: Tensor, dim: int, index: Any) -> Tensor:
    if isinstance(index, sym.Expr):
        index = cx.dims.position(index, x.shape[x._axis(dim)], "select")
    return F.select(x, dim, index)


@op(aten.narrow.default, aten.narrow_copy.default)
def _narrow(cx: Ctx, x: Tensor, dim: int, start: Any, length: Any) -> Tensor:
    if isinstance(start, sym.Expr):
        start = cx.dims.position(start, x.shape[x._axis(dim)], "narrow")
    return F.narrow(x, dim, start, length)


@op(aten.cat.default)
def _cat(cx: Ctx, tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    # torch ignores legacy empty 1-D tensors in cat
    ts = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)] or list(tensors)
    return F.cat(ts, dim)


@op(aten.stack.default)
def _stack(cx: Ctx, tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    return F.stack(list(tensors), dim)


def _split_at(x: Tensor, sizes: Sequence[Any], dim: int) -> tuple[Tensor, ...]:
    d = x._axis(dim)
    out: list[Tensor] = []
    off: Any = 0
    for s in sizes:
        out.append(x.slice(d, off, s))
        off = sym.add(off, s)
    return tuple(out)


@op(aten.split_with_sizes.default)
def _split_with_sizes(cx: Ctx, x: Tensor, sizes: Sequence[Any], dim: int = 0) -> tuple:
    return _split_at(x, sizes, dim)


@op(aten.split.Tensor)
def _split(cx: Ctx, x: Tensor, size: Any, dim: int = 0) -> tuple:
    d = x._axis(dim)
    return _split_at(x, [cx.dims.shape(v)[d] for v in cx.val], d)


@op(aten.unbind.int, aten.unbind_copy.int)
def _unbind(cx: Ctx, x: Tensor, dim: int = 0) -> tuple:
    return F.unbind(x, dim)


@op(aten.constant_pad_nd.default)
def _pad(cx: Ctx, x: Tensor, pad: Sequence[Any], value: Any = 0) -> Tensor:
    return F.pad(x, list(pad), "constant", value)


@op(aten.flip.default)
def _flip(cx: Ctx, x: Tensor, dims: Sequence[int]) -> Tensor:
    return F.flip(x, list(dims))


@op(aten.roll.default)
def _roll(cx: Ctx, x: Tensor, shifts: Any, dims: Any = ()) -> Tensor:
    return F.roll(x, shifts, dims if dims else None)


@op(aten.repeat.default)
def _repeat(cx: Ctx, x: Tensor, repeats: Sequence[Any]) -> Tensor:
    return F.repeat(x, *repeats)


@op(aten.tril.default)
def _tril(cx: Ctx, x: Tensor, diagonal: int = 0) -> Tensor:
    return F.tril(x, diagonal)


@op(aten.triu.default)
def _triu(cx: Ctx, x: Tensor, diagonal: int = 0) -> Tensor:
    return F.triu(x, diagonal)


@op(aten.diagonal.default, aten.diagonal_copy.default)
def _diagonal(cx: Ctx, x: Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
    return F.diagonal(x, offset, dim1, dim2)


@op(aten.view_copy.default, aten._reshape_copy.default)
def _view_copy(cx: Ctx, x: Tensor, *args: Any, **kw: Any) -> Tensor:
    return x.reshape(cx.shape())


# ----------------------------------------------------------------------------- windows
@op(aten.unfold.default)
def _unfold(cx: Ctx, x: Tensor, dim: int, size: int, step: int) -> Tensor:
    """Windows of ``size`` every ``step`` along ``dim``, the window axis appended last."""
    if x.ndim == 0:
        return x.reshape((1,))
    d = x._axis(dim)
    n = x.shape[d]
    if not isinstance(n, int):
        raise Unsupported("unfold along a symbolic axis")
    w = (n - size) // step + 1
    if w <= 0 or size == 0:
        return F.full(cx.g, cx.shape(), 0, dtype=cx.dtype)
    wi, ki = idx_vars((w, size))
    pos = F._base.iota(cx.g, (w, size), sym.add(sym.mul(wi, step), ki), dt.i64)
    taken = F.index_select(x, d, pos.reshape((w * size,)))  # (..., w*size, ...) at d
    shape = list(x.shape)
    shape[d : d + 1] = [w, size]
    out = taken.reshape(shape)
    order = [k for k in range(len(shape)) if k != d + 1] + [d + 1]
    return out.permute(order)


def _storage_block(cx: Ctx, node: Any, value: Any) -> tuple[Tensor, sym.sint] | None:
    """``value`` (the luminal value of ``node``) as the block of storage it fills, in storage
    order, and that block's storage offset; None where its elements do not fill a block
    (gaps, overlaps, or a layout luminal cannot read)."""
    val = node.meta.get("val")
    if not isinstance(value, Tensor) or not isinstance(val, torch.Tensor):
        return None
    try:
        size = cx.dims.shape(val)
        stride = tuple(cx.dims.expr(st) for st in val.stride())
        off = cx.dims.expr(val.storage_offset())
    except Unsupported:
        return None
    order = dense_order(val, size, stride)
    if order is None:
        return None
    block = value.permute(order) if order != sorted(order) else value
    return (block.reshape((-1,)) if block.ndim != 1 else block), off


def _within(cx: Ctx, lo: sym.sint, hi: sym.sint, n: sym.sint, what: str) -> bool:
    """Whether reads from ``lo`` to ``hi`` stay in ``[0, n)``: proved, or true at the traced
    sizes and then checked at each call (Dims.nonneg); False where it fails at the traced
    sizes."""
    conds = [sym.add(n, sym.add(sym.mul(hi, -1), -1)), lo]
    if all(sym.prove_nonneg(c) for c in conds):
        return True
    hints = [cx.dims.hint(c) for c in conds]
    if any(h is None or h < 0 for h in hints):
        return False
    cx.dims.nonneg += [(c, what) for c in conds if not sym.prove_nonneg(c)]
    return True


@op(aten.as_strided.default, aten.as_strided_copy.default)
def _as_strided(cx: Ctx, x: Tensor, size: Any, stride: Any, storage_offset: Any = None) -> Tensor:
    """A gather from the storage ``x`` views, at ``storage_offset + sum(i_k * stride_k)``:
    from ``x`` itself or from the view it was made from (Longformer's sliding chunks
    transpose and reshape before their ``as_strided``), whichever holds a block of storage
    that covers every element read, taken in storage order."""
    off = storage_offset or 0
    last: Any = off  # the furthest element read
    for n, st in zip(size, stride, strict=True):
        if isinstance(st, int) and st < 0:
            raise Unsupported("as_strided with a negative stride")
        last = sym.add(last, sym.mul(sym.add(n, -1), st))
    shape = tuple(size)
    node = cx.node.args[0] if cx.node is not None else None
    if not isinstance(node, torch.fx.Node) or not isinstance(node.meta.get("val"), torch.Tensor):
        raise Unsupported("as_strided of a value without a known layout")
    if any(isinstance(n, int) and n == 0 for n in shape):
        return F.full(cx.g, shape, 0, dtype=x.dtype)
    if (
        tuple(size) == tuple(x.shape)
        and off == 0
        and node.meta["val"].storage_offset() == 0
        and all(
            n == 1 or F._base.same(st, want)
            for n, st, want in zip(size, stride, contiguous_strides(x.shape), strict=True)
        )
        and node.meta["val"].is_contiguous()
    ):
        return x  # x's own layout restated (AOTAutograd restrides a keepdim reduction so)
    storage = StorageWeakRef(node.meta["val"].untyped_storage())
    value: Any = x
    why = "as_strided of a tensor that is not a block of its storage, nor a view of one"
    while True:
        got = _storage_block(cx, node, value)
        if got is not None:
            flat, base = got
            what = f"as_strided reading elements {off}..{last} of a block at {base}"
            if _within(cx, sym.add(off, sym.mul(base, -1)), sym.add(last, sym.mul(base, -1)),
                       flat.shape[0], what):  # fmt: skip
                break
            why = f"as_strided reading up to element {last} of {base} + {flat.shape[0]}"
        up = [a for a in node.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor)
              and StorageWeakRef(a.meta["val"].untyped_storage()) == storage]  # fmt: skip
        if len(up) != 1:
            raise Unsupported(why)
        node = up[0]
        value = cx.values.get(node)
        if not isinstance(value, Tensor):
            raise Unsupported("as_strided of a view whose source luminal does not hold")
    expr: Any = sym.add(off, sym.mul(base, -1))
    for v, st in zip(idx_vars(shape), stride, strict=True):
        expr = sym.add(expr, sym.mul(v, st))
    if not shape:
        return flat.slice(0, expr, 1).reshape(())
    idx = F._base.iota(cx.g, shape, expr, dt.i64)
    return F._base.gather_flat(flat, idx)


# ----------------------------------------------------------------------------- creation
def _fill(cx: Ctx, value: Any) -> Tensor:
    return F.full(cx.g, cx.shape(), value, dtype=cx.dtype)


@op(aten.full.default, aten.new_full.default, aten.full_like.default)
def _full(cx: Ctx, *args: Any, **kw: Any) -> Tensor:
    return _fill(cx, args[-1])


@op(aten.zeros.default, aten.zeros_like.default, aten.new_zeros.default, aten.empty.memory_format,
    aten.empty_like.default, aten.new_empty.default, aten.empty_strided.default,
    aten.empty_permuted.default, aten.new_empty_strided.default)  # fmt: skip
def _zeros(cx: Ctx, *args: Any, **kw: Any) -> Tensor:
    return _fill(cx, 0)


@op(aten.ones.default, aten.ones_like.default, aten.new_ones.default)
def _ones(cx: Ctx, *args: Any, **kw: Any) -> Tensor:
    return _fill(cx, 1)


@op(aten.scalar_tensor.default)
def _scalar_tensor(cx: Ctx, value: Any, **kw: Any) -> Tensor:
    return _fill(cx, value)


@op(aten.fill.Scalar)
def _fill_scalar(cx: Ctx, x: Tensor, value: Any) -> Tensor:
    return F.full_like(x, value)


@op(aten.arange.start_step, aten.arange.start, aten.arange.default)
def _arange(cx: Ctx, *args: Any, step: Any = 1, **kw: Any) -> Tensor:
    start, end = (0, args[0]) if len(args) == 1 else args[:2]
    step = args[2] if len(args) > 2 else step
    return F.arange(cx.g, start, end, step, dtype=cx.dtype)
