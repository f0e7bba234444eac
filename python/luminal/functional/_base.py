"""Shared building blocks of the PyTorch-named ops (private).

Three constructions recur and are exact, including for ±inf and NaN:
- a *select* (``where``) is one GATHER over the two candidates laid end to end (a ``cat`` made
  of two padded views and an ADD, exact since one side reads 0); arithmetic blends
  ``a*c + b*(1-c)`` turn an unselected inf or NaN into NaN;
- an elementwise max is a MAX_REDUCE over a two-element axis made by padding;
- masks that depend only on positions (tril, pad regions) go into a view's ``valid``
  expression, so the masked elements read 0 without any op.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ml_dtypes
import numpy as np

from ..graph import dtypes as dt
from ..graph import symbolic as sym
from ..graph.dtypes import DType
from ..graph.ops import Leaf, Op
from ..graph.symbolic import sint
from ..graph.view import View, idx_vars
from ..tensor import Graph, Tensor, TensorLike

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
INF = float("inf")


def shape_str(shape: Sequence[sint]) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ")"


def desc(x: Any) -> str:
    """How error messages name an argument: dtype and shape for tensors."""
    return f"{x.dtype.name}{shape_str(x.shape)}" if isinstance(x, Tensor) else repr(x)


def need_tensor(name: str, x: Any, what: str = "input") -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: {what} must be a luminal Tensor, got {type(x).__name__}")
    return x


def prod(xs: Sequence[sint]) -> sint:
    out: sint = 1
    for x in xs:
        out = sym.mul(out, x)
    return out


def same(a: sint, b: sint) -> bool:
    return a is b or (isinstance(a, int) and isinstance(b, int) and a == b)


def index_dtype(n: sint) -> DType:
    """i32 when every index below ``n`` fits, else i64."""
    return dt.i32 if sym.upper_bound(n) < 2**31 else dt.i64


def finfo(d: DType) -> Any:
    return ml_dtypes.finfo(d.np_type) if d.is_float else np.iinfo(np.dtype(d.np_type))


def int_limits(d: DType) -> tuple[int, int]:
    if d is dt.i4:
        return -8, 7
    if d is dt.u4:
        return 0, 15
    info = np.iinfo(np.dtype(d.np_type))
    return int(info.min), int(info.max)


def default_dtype(value: Any) -> DType:
    """PyTorch's dtype for a Python scalar standing alone."""
    if isinstance(value, bool):
        return dt.bool_
    if isinstance(value, (int, sym.Expr)):
        return dt.i64
    return dt.f32


def const(g: Graph, value: Any, dtype: DType, shape: Sequence[sint] = ()) -> Tensor:
    t = g.constant(value, dtype)
    return t.expand(tuple(shape)) if shape else t


def const_value(t: Tensor) -> Any:
    """The Python value of a (broadcast) scalar constant, else None."""
    n = t.node
    if n.op is Leaf.CONSTANT and not isinstance(n.arg, sym.Expr) and t.layout.valid == 1:
        return n.arg
    return None


def iota(g: Graph, shape: Sequence[sint], expr: sint, dtype: DType = dt.i32) -> Tensor:
    """An IOTA: ``expr`` over the index variables of ``shape`` (``idx_vars(shape)``)."""
    return Tensor(g.add_op(Op.IOTA, [], arg=expr, shape=tuple(shape), dtype=dtype))


def flat_expr(shape: Sequence[sint]) -> sint:
    """The row-major flat position of an element, over ``idx_vars(shape)``."""
    return View.contiguous(shape).index


def pair(a: TensorLike, b: TensorLike, name: str) -> tuple[Tensor, Tensor]:
    """Promote and broadcast two operands (either may be a Python scalar)."""
    if isinstance(a, Tensor):
        return a._broadcast_pair(b, name)
    if isinstance(b, Tensor):
        bb, aa = b._broadcast_pair(a, name)
        return aa, bb
    raise TypeError(
        f"{name}: expected at least one Tensor, got {type(a).__name__} and {type(b).__name__}"
    )


def as_bool(x: Tensor) -> Tensor:
    return x if x.dtype is dt.bool_ else x.cast(dt.bool_)


def lnot(x: Tensor) -> Tensor:
    """Logical not of a bool tensor: ``x < True``."""
    return x._op(Op.LESS_THAN, x._const(True).expand(x.shape))


def land(a: Tensor, b: Tensor) -> Tensor:
    return a.mul(b)  # MUL on bool is logical and


def lor(a: Tensor, b: Tensor) -> Tensor:
    return lnot(land(lnot(a), lnot(b)))


def with_valid(t: Tensor, extra: sint) -> Tensor:
    """The same view with elements where ``extra`` (over ``idx_vars(t.shape)``) is 0 reading 0."""
    v = t.layout
    return Tensor(t.node, View(v.shape, v.index, sym.mul(v.valid, extra)))


def remap(t: Tensor, shape: Sequence[sint], old: Sequence[sint], valid: sint = 1) -> Tensor:
    """A view of ``shape`` whose element reads old position ``old`` (exprs over the new index
    variables); where ``valid`` is 0 it reads 0. Nothing is copied."""
    return Tensor(t.node, t.layout._remap(tuple(shape), list(old), valid))


def new_vars(shape: Sequence[sint]) -> list[sint]:
    return idx_vars(shape)


def cat_flat(parts: Sequence[Tensor]) -> Tensor:
    """Flatten each part and lay them end to end (padded views + ADD: exact)."""
    flats = [p.reshape(prod(p.shape)) if p.ndim != 1 else p for p in parts]
    total: sint = 0
    for f in flats:
        total = sym.add(total, f.shape[0])
    out: Tensor | None = None
    off: sint = 0
    for f in flats:
        after = sym.add(total, sym.mul(sym.add(off, f.shape[0]), -1))
        p = f.pad_dim(0, off, after)
        out = p if out is None else out.add(p)
        off = sym.add(off, f.shape[0])
    assert out is not None
    return out


def gather_flat(data: Tensor, idx: Tensor) -> Tensor:
    """GATHER from a 1-D ``data``: out has ``idx``'s shape."""
    return Tensor(data.graph.add_op(Op.GATHER, [data.edge, idx.edge]))


def select(cond: Tensor, a: Tensor, b: Tensor) -> Tensor:
    """Exact ``where``: a, b, cond broadcast already to one shape and a, b of one dtype."""
    shape = a.shape
    if a.dtype is dt.bool_:
        return lor(land(a, cond), land(b, lnot(cond)))
    if not a.dtype.is_float:  # ints are exact under arithmetic blends
        ci = cond.cast(a.dtype)
        return b.add(a.add(b.mul(-1)).mul(ci))
    g = cond.graph
    if prod(shape) == 0:  # nothing selected; a reshape of an empty view has no strides
        return const(g, 0, a.dtype, shape)
    # each side: a 0-d constant is stored once, anything else at the full shape
    sides, offs = [], []
    flat = flat_expr(shape)
    for t in (a, b):
        src = _unexpanded_scalar(t)
        sides.append(src if src is not None else t)
        offs.append(0 if src is not None else flat)
    n_a = prod(sides[0].shape)
    total = sym.add(n_a, prod(sides[1].shape))
    ia, ib = offs[0], sym.add(n_a, offs[1])
    d = index_dtype(total)
    idx_b = iota(g, shape, ib, d)
    diff = iota(g, shape, sym.add(ia, sym.mul(ib, -1)), d)
    idx = idx_b.add(diff.mul(cond.cast(d)))
    return gather_flat(cat_flat(sides), idx)


def _unexpanded_scalar(t: Tensor) -> Tensor | None:
    """A broadcast 0-d tensor read back as its 1-element source, else None."""
    if t.node.shape == () and t.layout.valid == 1:
        return Tensor(t.node).reshape(1)
    return None


def fill_mask(mask: Tensor, value: float, dtype: DType) -> Tensor:
    """``value`` where ``mask`` (bool) else 0, exact for finite values, ±inf and NaN."""
    m = mask.cast(dtype)
    if value == INF:
        return m.mul(-1).add(1.0).log2().mul(-1)  # -log2(1 - m): +inf or (-)0
    if value == -INF:
        return m.mul(-1).add(1.0).log2()
    if value != value:
        return m.mul(-1).sqrt()  # sqrt(-1) is NaN, sqrt(-0) is -0
    return m.mul(value)


def float_dtype(x: Tensor) -> DType:
    return x.dtype if x.dtype.is_float else dt.f32


def int_exact_bound(d: DType) -> float:
    """Above this magnitude every value of float dtype ``d`` is an integer."""
    return float(2 ** (int(finfo(d).nmant) + 1))
