"""Constant folding and exact identities on kernel IR values, for renderers to run before
they emit code.

Loop rewrites (schedule.py's pair-jam) substitute literal indices into value trees, which turns
index arithmetic (``IOTA`` values such as a nibble's shift factor) into constants. Folding
them here lets the C compiler see ``x % 16`` instead of a call with a runtime divisor, and drops
``x * 1`` and ``x % 1`` entirely. Only rewrites that keep every bit of every result are made:
float ``x * 1 -> x`` and ``x + (-0.0) -> x`` hold for every x (NaN, inf and signed zeros
included); ``x + 0.0 -> x`` only where x cannot be -0.0 (a float converted from an integer).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from ..graph import dtypes as dt
from ..graph.ops import Op
from . import kernel_ir as K


def folded(k: K.Kernel) -> K.Kernel:
    """``k`` with its value trees folded."""
    memo: dict[int, K.Value] = {}
    row = fold(k.scatter_row, memo) if k.scatter_row is not None else None
    return replace(k, value=fold(k.value, memo), scatter_row=row)


def fold(v: K.Value, memo: dict[int, K.Value] | None = None) -> K.Value:
    """``v`` with constant subtrees computed and exact identities applied (a DAG-safe walk)."""
    memo = {} if memo is None else memo
    hit = memo.get(id(v))
    if hit is not None:
        return hit
    out = _fold(v, memo)
    memo[id(v)] = out
    return out


def _np(d: dt.DType) -> Any:
    return np.dtype(d.np_type)


def _const(value: Any, d: dt.DType) -> K.Const:
    x = np.asarray(value).astype(_np(d)).item()
    if d is dt.bool_:
        x = bool(x)
    return K.Const(x, d)


def _foldable(d: dt.DType) -> bool:
    # types whose arithmetic numpy reproduces exactly as the renderers compute it
    return d in (dt.f32, dt.f64, dt.i32, dt.i64, dt.bool_)


def _no_neg_zero(v: K.Value) -> bool:
    return isinstance(v, K.Cast) and not v.src.dtype.is_float


def _fold(v: K.Value, memo: dict[int, K.Value]) -> K.Value:
    if isinstance(v, K.IndexVal):
        if isinstance(v.expr, int) and _foldable(v.dtype):
            return _const(v.expr, v.dtype)
        return v
    if isinstance(v, K.Cast):
        src = fold(v.src, memo)
        if isinstance(src, K.Const) and _foldable(v.dtype) and _foldable(src.dtype):
            if v.dtype is dt.bool_:
                return K.Const(bool(src.value != 0), v.dtype)
            if not v.dtype.is_float and src.dtype.is_float:
                f = float(src.value)
                if not np.isfinite(f):
                    return K.Cast(src, v.dtype)  # out of range: left to the target's rules
                return _const(int(f), v.dtype)  # C truncates toward zero
            return _const(src.value, v.dtype)
        return v if src is v.src else K.Cast(src, v.dtype)
    if isinstance(v, K.Alu):
        srcs = tuple(fold(s, memo) for s in v.srcs)
        out = _alu(v.op, srcs, v.dtype)
        if out is not None:
            return out
        v = v if srcs == v.srcs else K.Alu(v.op, srcs, v.dtype)
        if v.op is Op.ADD and v.dtype in (dt.i32, dt.i64):
            return _linear(v)
        return v
    if isinstance(v, K.Reduce):
        body = fold(v.body, memo)
        return v if body is v.body else K.Reduce(v.op, v.var, v.extent, body, v.dtype)
    if isinstance(v, K.Masked):
        inner = fold(v.value, memo)
        return v if inner is v.value else K.Masked(v.valid, inner, v.dtype)
    if isinstance(v, K.Gather):
        row, body = fold(v.row, memo), fold(v.body, memo)
        if row is v.row and body is v.body:
            return v
        return K.Gather(v.var, row, v.rows, body, v.dtype)
    if isinstance(v, K.SoftmaxSum):
        score, weight = fold(v.score, memo), fold(v.weight, memo)
        if score is v.score and weight is v.weight:
            return v
        return K.SoftmaxSum(v.var, v.extent, score, weight, v.dtype)
    return v


def _linear(v: K.Alu) -> K.Value:
    """An integer sum of terms times constants with like terms combined, when that takes fewer
    operations (a loop rewrite's literal nibble index leaves ``x + -m + -m + m``, which is
    ``x - m``). Integer sums wrap, so any regrouping is exact."""
    d = v.dtype
    terms: dict[K.Value, int] = {}
    const = [0]
    ops: set[int] = set()

    def walk(x: K.Value, c: int) -> None:
        if isinstance(x, K.Const) and not isinstance(x.value, float):
            const[0] += c * int(x.value)
        elif isinstance(x, K.Alu) and x.dtype is d and x.op is Op.ADD:
            ops.add(id(x))
            for s in x.srcs:
                walk(s, c)
        elif (
            isinstance(x, K.Alu)
            and x.dtype is d
            and x.op is Op.MUL
            and len(x.srcs) == 2
            and any(isinstance(s, K.Const) for s in x.srcs)
        ):
            ops.add(id(x))
            k, other = (x.srcs[0], x.srcs[1]) if isinstance(x.srcs[0], K.Const) else x.srcs[::-1]
            assert isinstance(k, K.Const)
            walk(other, c * int(k.value))
        else:
            terms[x] = terms.get(x, 0) + c

    walk(v, 1)
    live = [(x, c) for x, c in terms.items() if c != 0]
    need = max(len(live) + (const[0] != 0) - 1, 0) + sum(c != 1 for _, c in live)
    if need >= len(ops):
        return v
    out: K.Value | None = None
    for x, c in live:
        t = x if c == 1 else K.Alu(Op.MUL, (x, _const(c, d)), d)
        out = t if out is None else K.Alu(Op.ADD, (out, t), d)
    if const[0] != 0 or out is None:
        k = _const(const[0], d)
        out = k if out is None else K.Alu(Op.ADD, (out, k), d)
    return out


def _is(x: K.Value, value: float) -> bool:
    if not isinstance(x, K.Const):
        return False
    if value == 0 and x.dtype.is_float:
        return False  # float zeros are handled by sign explicitly
    return bool(x.value == value)


def _alu(op: Op, srcs: tuple[K.Value, ...], d: dt.DType) -> K.Value | None:
    if op is Op.LESS_THAN:
        a, b = srcs
        if isinstance(a, K.Const) and isinstance(b, K.Const) and _foldable(a.dtype):
            return K.Const(bool(a.value < b.value), d)
        return None
    if not _foldable(d) or d is dt.bool_:  # bool ADD/MUL are logical ops in the renderers
        return None
    if all(isinstance(s, K.Const) for s in srcs):
        return _compute(op, [s.value for s in srcs if isinstance(s, K.Const)], d)
    if op not in (Op.ADD, Op.MUL, Op.MOD) or len(srcs) != 2:
        return None
    a, b = srcs
    if op is Op.MOD:
        if not d.is_float and (_is(b, 1) or _is(b, -1)):
            return K.Const(0, d)
        return None
    for x, c in ((a, b), (b, a)):
        if not isinstance(c, K.Const) or x.dtype is not d:
            continue
        if op is Op.MUL and c.value == 1:
            return x  # exact for every x, NaN and signed zeros included
        if op is Op.MUL and not d.is_float and c.value == 0:
            return K.Const(0, d)
        if op is Op.ADD and c.value == 0:
            if not d.is_float:
                return x
            neg = bool(np.signbit(float(c.value)))
            if neg or _no_neg_zero(x):  # -0.0 + x == x always; +0.0 + x == x unless x is -0.0
                return x
    return None


def _compute(op: Op, vals: list[Any], d: dt.DType) -> K.Value | None:
    t = _np(d)
    a = [np.asarray(x).astype(t) for x in vals]
    with np.errstate(all="ignore"):
        if op is Op.ADD:
            r = a[0] + a[1]
        elif op is Op.MUL:
            r = a[0] * a[1]
        elif op is Op.MOD:
            if not d.is_float and int(a[1]) == 0:
                return None  # the targets define x % 0; leave it to them
            r = np.fmod(a[0], a[1])
        elif op is Op.RECIP and d.is_float:
            r = np.asarray(1, t) / a[0]
        else:
            return None
    return _const(r, d)
