"""Indexing named as in PyTorch: ``x[...]``, gather/scatter, embedding, one_hot, masked_fill.

Data-dependent reads are one GATHER: a multi-dim read ``x[i, j]`` becomes a read of a flattened
(view of) ``x`` at ``i * stride + j``, with the other dims' part of the offset an IOTA.
``scatter`` is one SCATTER on the flattened destination. ``scatter_add`` / ``index_add`` sum
``(index == position) * src`` over the scattered axis (no atomics needed, exact for finite src).
Index values must be in range, as in PyTorch (out-of-range reads give 0 instead of an error).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..graph import dtypes as dt
from ..graph import symbolic as sym
from ..graph.ops import Op
from ..graph.symbolic import sint
from ..graph.view import contiguous_strides, idx_vars
from ..tensor import Tensor, broadcast_shapes
from ._base import const, gather_flat, index_dtype, iota, need_tensor, prod, select, shape_str
from .elementwise import _eq
from .movement import movedim

__all__ = [
    "embedding", "gather", "getitem", "index_add", "index_put", "index_put_flat", "index_select",
    "masked_fill",
    "one_hot", "scatter", "scatter_add", "take", "take_along_dim",
]  # fmt: skip


def _need_index(name: str, idx: Any, what: str = "index") -> Tensor:
    t = need_tensor(name, idx, what)
    if not t.dtype.is_int:
        raise TypeError(
            f"{name}: {what} must be an integer tensor, got {t.dtype.name}{shape_str(t.shape)}"
        )
    return t


def _wrap(idx: Tensor, n: sint, d: dt.DType) -> Tensor:
    """Negative indices count from the end (idx + n where idx < 0)."""
    i = idx.cast(d)
    return i.add(i.lt(0).cast(d).mul(const(idx.graph, n, d)))


def _flat_index(name: str, x: Tensor, dim: int, index: Tensor) -> tuple[Tensor, int]:
    """Flat offsets into x of x[.., index[..], ..] (index along ``dim``, position elsewhere)."""
    d = x._axis(dim)
    if index.ndim != x.ndim:
        raise ValueError(f"{name}: index {shape_str(index.shape)} and input {shape_str(x.shape)} "
                         "must have the same number of dims")  # fmt: skip
    for k, (a, b) in enumerate(zip(index.shape, x.shape, strict=True)):
        if k != d and isinstance(a, int) and isinstance(b, int) and a > b:
            raise ValueError(f"{name}: index {shape_str(index.shape)} is larger than input "
                             f"{shape_str(x.shape)} in dim {k}")  # fmt: skip
    strides = contiguous_strides(x.shape)
    idt = index_dtype(prod(x.shape))
    nv = idx_vars(index.shape)
    other: sint = 0
    for k in range(x.ndim):
        if k != d:
            other = sym.add(other, sym.mul(nv[k], strides[k]))
    pos = (
        index.cast(idt)
        .mul(const(x.graph, strides[d], idt))
        .add(iota(x.graph, index.shape, other, idt))
    )
    return pos, d


def gather(input: Tensor, dim: int, index: Tensor, *, sparse_grad: bool = False) -> Tensor:  # noqa: A002
    """out[i][j][k] = input[index[i][j][k]][j][k] (for dim 0), as ``torch.gather``."""
    x = need_tensor("gather", input)
    idx = _need_index("gather", index)
    pos, _ = _flat_index("gather", x, dim, idx)
    return gather_flat(x.reshape(-1) if x.ndim != 1 else x, pos)


def take_along_dim(input: Tensor, indices: Tensor, dim: int) -> Tensor:  # noqa: A002
    x = need_tensor("take_along_dim", input)
    idx = _need_index("take_along_dim", indices)
    d = x._axis(dim)
    xs, ids = list(x.shape), list(idx.shape)
    xs[d] = ids[d] = 1
    b = list(broadcast_shapes(xs, ids, "take_along_dim"))
    x = x.expand([x.shape[d] if k == d else s for k, s in enumerate(b)])
    idx = idx.expand([idx.shape[d] if k == d else s for k, s in enumerate(b)])
    return gather(x, d, idx)


def index_select(input: Tensor, dim: int, index: Tensor) -> Tensor:  # noqa: A002
    x = need_tensor("index_select", input)
    idx = _need_index("index_select", index)
    if idx.ndim > 1:
        raise ValueError(f"index_select: index must be 0-d or 1-D, got {shape_str(idx.shape)}")
    d = x._axis(dim)
    data = movedim(x, d, 0)
    out = Tensor(x.graph.add_op(Op.GATHER, [data.edge, idx.edge]))
    out = out if idx.ndim else out.unsqueeze(0)
    return movedim(out, 0, d)


def take(input: Tensor, index: Tensor) -> Tensor:  # noqa: A002
    x = need_tensor("take", input)
    idx = _need_index("take", index)
    n = prod(x.shape)
    return gather_flat(x.reshape(-1) if x.ndim != 1 else x, _wrap(idx, n, index_dtype(n)))


def embedding(input: Tensor, weight: Tensor, padding_idx: int | None = None,  # noqa: A002
              max_norm: float | None = None, *args: Any, **kwargs: Any) -> Tensor:  # fmt: skip
    """Rows of ``weight`` (num, dim) picked by ``input``: one GATHER."""
    idx = _need_index("embedding", input, "input")
    w = need_tensor("embedding", weight, "weight")
    if w.ndim != 2:
        raise ValueError(
            f"embedding: weight must be 2-D (num_embeddings, dim), got {shape_str(w.shape)}"
        )
    if max_norm is not None:
        raise ValueError("embedding: max_norm renormalizes weights in place; not supported")
    return Tensor(w.graph.add_op(Op.GATHER, [w.edge, idx.edge]))


def one_hot(tensor: Tensor, num_classes: int = -1) -> Tensor:
    idx = _need_index("one_hot", tensor, "tensor")
    if not isinstance(num_classes, (int, sym.Expr)) or (
        isinstance(num_classes, int) and num_classes < 1
    ):
        raise ValueError("one_hot: give num_classes (it cannot be read off the data at build time)")
    shape = tuple(idx.shape) + (num_classes,)
    cls = iota(idx.graph, shape, idx_vars(shape)[-1], idx.dtype)
    return _eq(idx.unsqueeze(-1).expand(shape), cls).cast(dt.i64)


# ----------------------------------------------------------------------------- writes
def scatter(input: Tensor, dim: int, index: Tensor, src: Any = None, *, value: Any = None,  # noqa: A002
            reduce: str | None = None) -> Tensor:  # fmt: skip
    """out = input; out[index[i][j]][j] = src[i][j] (dim 0), as ``torch.scatter``: one SCATTER
    into the flattened input. Duplicate targets keep one of the values (PyTorch: undefined)."""
    x = need_tensor("scatter", input)
    idx = _need_index("scatter", index)
    if reduce == "add":
        return scatter_add(
            x, dim, idx, src if src is not None else const(x.graph, value, x.dtype, idx.shape)
        )
    if reduce is not None:
        raise ValueError(f"scatter: reduce must be None or 'add', got {reduce!r}")
    val = src if src is not None else value
    if val is None:
        raise ValueError("scatter: give src or value")
    pos, _ = _flat_index("scatter", x, dim, idx)
    s = _src_like("scatter", x, idx, val)
    flat = x.reshape(-1) if x.ndim != 1 else x
    out = Tensor(x.graph.add_op(Op.SCATTER, [flat.edge, pos.edge, s.edge]))
    return out.reshape(x.shape)


def _src_like(name: str, x: Tensor, idx: Tensor, val: Any) -> Tensor:
    """``src`` cut to the index's shape (PyTorch reads src[i][j] at index positions only)."""
    if not isinstance(val, Tensor):
        return const(x.graph, val, x.dtype, idx.shape)
    if val.ndim != idx.ndim:
        raise ValueError(
            f"{name}: src {shape_str(val.shape)} and index {shape_str(idx.shape)} differ in rank"
        )
    s = val.cast(x.dtype)
    for k, (a, b) in enumerate(zip(idx.shape, val.shape, strict=True)):
        if not (a is b or a == b):
            if isinstance(a, int) and isinstance(b, int) and a > b:
                raise ValueError(f"{name}: src {shape_str(val.shape)} is smaller than index "
                                 f"{shape_str(idx.shape)} in dim {k}")  # fmt: skip
            s = s.slice(k, 0, a)
    return s


def scatter_add(input: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:  # noqa: A002
    """out = input + sum over i of (index[i] == position) * src[i] along ``dim``."""
    x = need_tensor("scatter_add", input)
    idx = _need_index("scatter_add", index)
    _flat_index("scatter_add", x, dim, idx)  # shape checks
    d = x._axis(dim)
    s = _src_like("scatter_add", x, idx, src)
    n = x.shape[d]
    shape = list(idx.shape[: d + 1]) + [n] + list(idx.shape[d + 1 :])
    pos = iota(x.graph, shape, idx_vars(shape)[d + 1], idx.dtype)
    hit = _eq(idx.unsqueeze(d + 1).expand(shape), pos)
    contrib = s.unsqueeze(d + 1).expand(shape).mul(hit.cast(x.dtype)).sum_reduce(d)
    for k in range(x.ndim):  # index may be smaller than input outside dim: pad with zeros
        if k != d and not (contrib.shape[k] is x.shape[k] or contrib.shape[k] == x.shape[k]):
            contrib = contrib.pad_dim(k, 0, sym.add(x.shape[k], sym.mul(contrib.shape[k], -1)))
    return x.add(contrib)


def index_add(
    input: Tensor, dim: int, index: Tensor, source: Tensor, *, alpha: float = 1
) -> Tensor:  # noqa: A002
    """out = input; out[index[k]] += alpha * source[k] along ``dim`` (duplicates accumulate)."""
    x = need_tensor("index_add", input)
    idx = _need_index("index_add", index)
    src = need_tensor("index_add", source, "source")
    if idx.ndim != 1:
        raise ValueError(f"index_add: index must be 1-D, got {shape_str(idx.shape)}")
    d = x._axis(dim)
    xm, sm = movedim(x, d, 0), movedim(src.cast(x.dtype), d, 0)
    k, n = idx.shape[0], xm.shape[0]
    if sm.ndim != xm.ndim or sm.shape[0] is not k and sm.shape[0] != k:
        raise ValueError(
            f"index_add: source {shape_str(src.shape)} does not match index "
            f"{shape_str(idx.shape)} along dim {dim} of input {shape_str(x.shape)}"
        )
    hit = _eq(idx.unsqueeze(1).expand(k, n), iota(x.graph, (k, n), idx_vars((k, n))[1], idx.dtype))
    hit = hit.cast(x.dtype).reshape([k, n] + [1] * (xm.ndim - 1))
    contrib = sm.unsqueeze(1).mul(hit).sum_reduce(0)
    if alpha != 1:
        contrib = contrib.mul(alpha)
    return movedim(xm.add(contrib), 0, d)


def index_put(
    input: Tensor, indices: Sequence[Tensor | None], values: Any, accumulate: bool = False
) -> Tensor:  # noqa: A002
    """``x[..., idx, ...] = values`` (``+=`` with ``accumulate``) for one integer index tensor,
    at dim 0 or after ``None`` entries (a KV cache's ``cache[:, :, pos] = new``): one SCATTER."""
    x = need_tensor("index_put", input)
    d = 0
    while d < len(indices) and indices[d] is None:
        d += 1
    if d == len(indices) or any(i is not None for i in indices[d + 1 :]):
        raise ValueError("index_put: exactly one index tensor is supported (None elsewhere), got "
                         f"{[None if i is None else 'tensor' for i in indices]}")  # fmt: skip
    if d >= x.ndim:
        raise ValueError(f"index_put: index at dim {d} of input {shape_str(x.shape)}")
    idx = _need_index("index_put", indices[d])
    if d and idx.ndim == 1 and not accumulate and isinstance(values, Tensor):
        return _put_flat(x, x.reshape(-1), d, idx, values)
    if d:  # the same write with the indexed dim moved first (views: no copies)
        v = values
        if isinstance(values, Tensor):  # broadcast to x[:d] + idx + x[d+1:], then idx first
            full = tuple(x.shape[:d]) + tuple(idx.shape) + tuple(x.shape[d + 1 :])
            v = _indexed_first(values.cast(x.dtype).expand(full), d, idx.ndim)
        out = index_put(movedim(x, d, 0), [idx], v, accumulate)
        return movedim(out, 0, d)
    if accumulate:
        idx = _wrap(idx, x.shape[0], index_dtype(x.shape[0]))
        flat = idx.reshape(-1) if idx.ndim != 1 else idx
        v = values if isinstance(values, Tensor) else const(x.graph, values, x.dtype)
        v = (
            v.cast(x.dtype)
            .expand(tuple(idx.shape) + tuple(x.shape[1:]))
            .reshape([flat.shape[0]] + list(x.shape[1:]))
        )
        return index_add(x, 0, flat, v)
    v = values if isinstance(values, Tensor) else const(x.graph, values, x.dtype)
    v = v.cast(x.dtype).expand(tuple(idx.shape) + tuple(x.shape[1:]))
    idx = _wrap(idx, x.shape[0], index_dtype(x.shape[0]))
    return Tensor(x.graph.add_op(Op.SCATTER, [x.edge, idx.edge, v.edge]))


def index_put_flat(flat: Tensor, shape: Sequence[sint], indices: Sequence[Tensor | None],
                   values: Tensor) -> Tensor:  # fmt: skip
    """``index_put(flat.reshape(shape), indices, values)`` as one SCATTER into ``flat`` itself
    (1-D, e.g. a graph input): an output that ``updates`` that input is then written in place.
    One 1-D index tensor after ``None`` entries; returns the result with ``shape``."""
    f = need_tensor("index_put_flat", flat)
    if f.ndim != 1:
        raise ValueError(f"index_put_flat: flat must be 1-D, got {shape_str(f.shape)}")
    d = 0
    while d < len(indices) and indices[d] is None:
        d += 1
    if d == len(indices) or any(i is not None for i in indices[d + 1 :]):
        raise ValueError("index_put_flat: exactly one index tensor is supported (None before it)")
    idx = _need_index("index_put_flat", indices[d])
    if idx.ndim != 1:
        raise ValueError(f"index_put_flat: the index must be 1-D, got {shape_str(idx.shape)}")
    return _put_flat(f.reshape(list(shape)), f, d, idx, need_tensor("index_put_flat", values))


def _put_flat(x: Tensor, flat: Tensor, d: int, idx: Tensor, values: Tensor) -> Tensor:
    """x[.., idx, ..] = values along dim ``d``, as a SCATTER into ``flat`` (x's memory)."""
    k = idx.shape[0]
    full = tuple(x.shape[:d]) + (k,) + tuple(x.shape[d + 1 :])
    pos = _wrap(idx, x.shape[d], index_dtype(x.shape[d]))
    pos = pos.reshape([1] * d + [k] + [1] * (x.ndim - d - 1)).expand(full)
    at, _ = _flat_index("index_put", x, d, pos)
    src = values.cast(x.dtype).expand(full)
    out = Tensor(x.graph.add_op(Op.SCATTER, [flat.edge, at.edge, src.edge]))
    return out.reshape(x.shape)


def _indexed_first(v: Tensor, d: int, k: int) -> Tensor:
    """``v`` (dims: d leading, k indexed, the rest) with its k indexed dims moved first."""
    order = list(range(d, d + k)) + list(range(d)) + list(range(d + k, v.ndim))
    return v.permute(order)


def masked_fill(input: Tensor, mask: Tensor, value: Any) -> Tensor:  # noqa: A002
    """``value`` where ``mask`` else ``input`` (an exact select; fine with value = -inf)."""
    x = need_tensor("masked_fill", input)
    m = need_tensor("masked_fill", mask, "mask")
    if m.dtype is not dt.bool_:
        raise TypeError(
            f"masked_fill: mask must be a bool tensor, got {m.dtype.name}{shape_str(m.shape)}"
        )
    shape = broadcast_shapes(x.shape, m.shape, "masked_fill")
    v = value.cast(x.dtype) if isinstance(value, Tensor) else const(x.graph, value, x.dtype)
    return select(m.expand(shape), v.expand(shape), x.expand(shape))


# ----------------------------------------------------------------------------- x[key]
def getitem(x: Tensor, key: Any) -> Tensor:
    """PyTorch/numpy basic and advanced indexing (ints, slices with positive steps, None,
    Ellipsis, integer tensors or lists). Bool masks give data-dependent shapes: not supported."""
    keys = list(key) if isinstance(key, tuple) else [key]
    g = x.graph
    for i, k in enumerate(keys):
        if isinstance(k, (list, np.ndarray)):
            arr = np.asarray(k)
            if arr.dtype == np.bool_:
                raise TypeError(
                    "indexing with a bool mask gives a data-dependent shape; use masked_fill/where"
                )
            keys[i] = g.tensor(arr.astype(np.int64))
        elif isinstance(k, Tensor) and k.dtype is dt.bool_:
            raise TypeError(
                "indexing with a bool tensor gives a data-dependent shape; use masked_fill/where"
            )
        elif isinstance(k, bool) or not (
            k is None or k is Ellipsis or isinstance(k, (int, slice, sym.Expr, Tensor))
        ):
            raise TypeError(f"index {k!r} of type {type(k).__name__} is not supported")
    if sum(k is Ellipsis for k in keys) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    used = sum(1 for k in keys if k is not None and k is not Ellipsis)
    if used > x.ndim:
        raise IndexError(f"too many indices for tensor of shape {shape_str(x.shape)}: {used} given")
    fill = [slice(None)] * (x.ndim - used)
    if Ellipsis in [k for k in keys if not isinstance(k, Tensor)]:
        e = next(i for i, k in enumerate(keys) if k is Ellipsis)
        keys = keys[:e] + fill + keys[e + 1 :]
    else:
        keys = keys + fill
    advanced = any(isinstance(k, Tensor) for k in keys)
    out, d, adv = x, 0, []
    for k in keys:
        if k is None:
            out, d = out.unsqueeze(d), d + 1
        elif isinstance(k, slice):
            out, d = _slice(out, d, k), d + 1
        elif isinstance(k, Tensor) or advanced:  # ints join tensor indices (numpy rules)
            t = k if isinstance(k, Tensor) else const(g, k, dt.i64)
            adv.append((d, _need_index("getitem", t)))
            d += 1
        else:
            n = out.shape[d]
            if isinstance(k, int) and isinstance(n, int) and not -n <= k < n:
                raise IndexError(f"index {k} is out of bounds for dim {d} with size {n} "
                                 f"(shape {shape_str(out.shape)})")  # fmt: skip
            out = out.slice(d, sym.add(n, k) if isinstance(k, int) and k < 0 else k, 1)
            out = out.reshape([s for j, s in enumerate(out.shape) if j != d])
    return _advanced(out, adv) if adv else out


def _slice(x: Tensor, d: int, s: slice) -> Tensor:
    n = x.shape[d]
    step = 1 if s.step is None else s.step
    if not isinstance(step, int) or step <= 0:
        raise ValueError(
            f"slice step must be a positive int, got {s.step!r} (use flip for reversal)"
        )

    def norm(v: Any, default: sint) -> sint:
        if v is None:
            return default
        if isinstance(v, int) and v < 0:
            v = sym.add(n, v)
        return sym.maximum(sym.minimum(v, n), 0)

    start, stop = norm(s.start, 0), norm(s.stop, n)
    length = sym.maximum(sym.ceildiv(sym.add(stop, sym.mul(start, -1)), step), 0)
    if start == 0 and step == 1 and (length is n or length == n):
        return x
    return x.slice(d, start, length, step)


def _advanced(x: Tensor, adv: list[tuple[int, Tensor]]) -> Tensor:
    """Gather rows of ``x`` with its indexed dims moved to the front and merged into one."""
    dims = [d for d, _ in adv]
    sizes = [x.shape[d] for d in dims]
    bshape: tuple[sint, ...] = ()
    for _, t in adv:
        bshape = broadcast_shapes(bshape, t.shape, "index")
    m = prod(sizes)
    idt = index_dtype(m)
    flat: Tensor | None = None
    stride: sint = 1
    for (_, t), n in reversed(list(zip(adv, sizes, strict=True))):
        part = _wrap(t, n, idt).expand(bshape).mul(const(x.graph, stride, idt))
        flat = part if flat is None else flat.add(part)
        stride = sym.mul(stride, n)
    assert flat is not None
    rest = [k for k in range(x.ndim) if k not in dims]
    data = x.permute(dims + rest).reshape([m] + [x.shape[k] for k in rest])
    out = Tensor(x.graph.add_op(Op.GATHER, [data.edge, flat.edge]))
    if dims == list(range(dims[0], dims[0] + len(dims))) and dims[0] > 0:
        nb = len(bshape)  # adjacent indexed dims: the result dims go where they were
        order = (
            list(range(nb, nb + dims[0])) + list(range(nb)) + list(range(nb + dims[0], out.ndim))
        )
        out = out.permute(order)
    return out
