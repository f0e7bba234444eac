"""Tensor creation named as in PyTorch. A graph is always given (lazy tensors belong to one):
``F.arange(g, 10)`` or the same as a method, ``g.arange(10)``. Constants are a scalar CONSTANT
broadcast by a view (nothing is stored per element); ranges and ``eye`` are IOTAs; an end or
size may be a symbolic dim (``g.arange(seq)``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..graph import dtypes as dt
from ..graph import symbolic as sym
from ..graph.symbolic import sint
from ..graph.view import idx_vars
from ..tensor import Graph, Tensor
from ._base import const, default_dtype, index_dtype, iota, need_tensor

__all__ = [
    "arange", "empty", "empty_like", "eye", "full", "full_like", "linspace", "ones", "ones_like",
    "zeros", "zeros_like",
]  # fmt: skip


def _graph(name: str, g: Any) -> Graph:
    if not isinstance(g, Graph):
        raise TypeError(
            f"{name}: the first argument must be the luminal Graph, got {type(g).__name__}"
        )
    return g


def _size(args: Sequence[Any]) -> tuple[sint, ...]:
    size = tuple(args[0]) if len(args) == 1 and isinstance(args[0], (list, tuple)) else tuple(args)
    for s in size:
        if (
            not isinstance(s, (int, sym.Expr))
            or isinstance(s, bool)
            or (isinstance(s, int) and s < 0)
        ):
            raise ValueError(f"invalid size {size}: entries must be ints >= 0 or dims")
    return size


def full(g: Graph, size: Sequence[sint], fill_value: Any, *, dtype: Any = None) -> Tensor:
    g = _graph("full", g)
    d = dt.to_dtype(dtype) if dtype is not None else default_dtype(fill_value)
    return const(g, fill_value, d, _size([size]))


def zeros(g: Graph, *size: Any, dtype: Any = None) -> Tensor:
    return const(_graph("zeros", g), 0, dt.to_dtype(dtype or dt.f32), _size(size))


def ones(g: Graph, *size: Any, dtype: Any = None) -> Tensor:
    return const(_graph("ones", g), 1, dt.to_dtype(dtype or dt.f32), _size(size))


empty = zeros  # a lazy graph has no uninitialized memory to hand out


def full_like(input: Tensor, fill_value: Any, *, dtype: Any = None) -> Tensor:  # noqa: A002
    x = need_tensor("full_like", input)
    return const(x.graph, fill_value, dt.to_dtype(dtype or x.dtype), x.shape)


def zeros_like(input: Tensor, *, dtype: Any = None) -> Tensor:  # noqa: A002
    return full_like(input, 0, dtype=dtype)


def ones_like(input: Tensor, *, dtype: Any = None) -> Tensor:  # noqa: A002
    return full_like(input, 1, dtype=dtype)


empty_like = zeros_like


def _whole(v: Any) -> Any:
    return int(v) if isinstance(v, float) and v.is_integer() else v


def arange(g: Graph, start: Any, end: Any = None, step: Any = 1, *, dtype: Any = None) -> Tensor:
    """[start, end) by step; ``arange(g, n)`` is [0, n). Integer ranges are an IOTA (end may be
    a dim); float ranges scale an integer IOTA."""
    g = _graph("arange", g)
    if end is None:
        start, end = 0, start
    if step == 0:
        raise ValueError("arange: step must be nonzero")
    is_int = all(
        isinstance(v, (int, sym.Expr)) and not isinstance(v, bool) for v in (start, end, step)
    )
    d = dt.to_dtype(dtype) if dtype is not None else (dt.i64 if is_int else dt.f32)
    # a whole-valued float bound or step (XLNet's arange(klen, -qlen, -1.0)) counts as an int:
    # the same points, and a symbolic bound stays possible
    start, end, step = (_whole(v) for v in (start, end, step))
    if all(isinstance(v, (int, sym.Expr)) for v in (start, end, step)) and isinstance(step, int):
        n = sym.maximum(sym.ceildiv(sym.add(end, sym.mul(start, -1)), step), 0) if step > 0 else \
            sym.maximum(sym.ceildiv(sym.add(start, sym.mul(end, -1)), -step), 0)  # fmt: skip
        shape = (n,)
        expr = sym.add(start, sym.mul(idx_vars(shape)[0], step))
        if d.is_int:
            return iota(g, shape, expr, d)
        return iota(g, shape, expr, index_dtype(sym.add(sym.maximum(start, end), 1))).cast(d)
    if any(isinstance(v, sym.Expr) for v in (start, end, step)):
        raise ValueError("arange: a symbolic bound needs an integer start and step")
    n = max(math.ceil((float(end) - float(start)) / float(step)), 0)
    i = iota(g, (n,), idx_vars((n,))[0], index_dtype(n))
    work = d if d.is_float else dt.f64
    return i.cast(work).mul(float(step)).add(float(start)).cast(d)


def linspace(g: Graph, start: float, end: float, steps: int, *, dtype: Any = None) -> Tensor:
    """``steps`` points from start to end, both included; like PyTorch, the second half is
    counted back from ``end`` so the last point is exactly ``end``."""
    g = _graph("linspace", g)
    if not isinstance(steps, int) or steps < 0:
        raise ValueError(f"linspace: steps must be an int >= 0, got {steps!r}")
    d = dt.to_dtype(dtype or dt.f32)
    if steps <= 1:
        return const(g, start, d, (steps,))
    step = (float(end) - float(start)) / (steps - 1)
    i = iota(g, (steps,), idx_vars((steps,))[0], dt.i32).cast(dt.f32 if d is not dt.f64 else dt.f64)
    half = steps // 2
    lo = i.mul(step).add(float(start))
    hi = i.add(float(-(steps - 1))).mul(step).add(float(end))
    second = iota(g, (steps,), sym.lt(half - 1, idx_vars((steps,))[0]), dt.i32).cast(lo.dtype)
    out = lo.mul(second.mul(-1.0).add(1.0)).add(hi.mul(second))  # exact blend: both finite
    return out.cast(d)


def eye(g: Graph, n: sint, m: sint | None = None, *, dtype: Any = None) -> Tensor:
    g = _graph("eye", g)
    m = n if m is None else m
    shape = (n, m)
    i, j = idx_vars(shape)
    return iota(g, shape, sym.eq(i, j), dt.i32).cast(dt.to_dtype(dtype or dt.f32))
