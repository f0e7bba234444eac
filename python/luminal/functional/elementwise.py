"""Elementwise ops named as in PyTorch: arithmetic, comparisons, logic, rounding, selection and
the transcendental functions, all compositions of the 15 primitives.

Conventions: operands broadcast and promote as in PyTorch (Python scalars do not widen a
tensor's dtype category); float functions of integer tensors return f32; low-precision floats
(f16, bf16, fp8) are computed in f32 and rounded once at the end, as PyTorch's kernels do.
Comparisons are NaN-correct (``nan == nan`` is False, ``nan <= x`` is False).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ..graph import dtypes as dt
from ..graph import symbolic as sym
from ..graph.dtypes import DType
from ..graph.ops import Op
from ..tensor import Tensor, TensorLike, broadcast_shapes
from ._base import (
    INF,
    as_bool,
    cat_flat,
    const,
    const_value,
    default_dtype,
    finfo,
    flat_expr,
    float_dtype,
    gather_flat,
    index_dtype,
    int_exact_bound,
    int_limits,
    iota,
    land,
    lnot,
    lor,
    need_tensor,
    pair,
    prod,
    select,
)  # fmt: skip

__all__ = [
    "abs", "absolute", "add", "bitwise_and", "bitwise_not", "bitwise_or", "bitwise_xor", "ceil",
    "clamp", "clamp_max", "clamp_min", "clip", "div", "divide", "eq", "fix", "floor",
    "floor_divide", "fmod", "frac", "ge", "greater", "greater_equal", "gt", "isfinite", "isinf",
    "isnan", "isneginf", "isposinf", "le", "lerp", "less", "less_equal", "logical_and",
    "logical_not", "logical_or", "logical_xor", "lt", "maximum", "minimum", "mul", "multiply",
    "nan_to_num", "ne", "neg", "negative", "not_equal", "pow", "reciprocal", "remainder",
    "round", "sgn", "sign", "square", "sub", "subtract", "true_divide", "trunc", "where",
]  # fmt: skip

_LOW = frozenset({dt.f16, dt.bf16, dt.f8e4m3, dt.f8e5m2, dt.e8m0, dt.fp4e2m1})


def _in_f32(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """Run ``fn`` in f32 for low-precision and integer inputs; cast back to the float dtype."""

    def wrapper(input: Tensor, *args: Any, **kwargs: Any) -> Tensor:  # noqa: A002
        x = need_tensor(fn.__name__, input)
        out = fn(
            x.cast(dt.f32) if (x.dtype in _LOW or not x.dtype.is_float) else x, *args, **kwargs
        )
        return out.cast(float_dtype(x))

    wrapper.__name__, wrapper.__doc__, wrapper.__qualname__ = (
        fn.__name__,
        fn.__doc__,
        fn.__qualname__,
    )
    return wrapper


# ----------------------------------------------------------------------------- arithmetic
def add(input: TensorLike, other: TensorLike, *, alpha: float = 1) -> Tensor:  # noqa: A002
    a, b = pair(input, other, "add")
    if alpha != 1:
        b = b.mul(alpha)
    return lor(a, b) if a.dtype is dt.bool_ else a._op(Op.ADD, b)


def neg(input: Tensor) -> Tensor:  # noqa: A002
    x = need_tensor("neg", input)
    if x.dtype is dt.bool_:
        raise TypeError("neg: negation of a bool tensor is not supported; use logical_not")
    if x.dtype.kind == "uint":
        return x.mul(int_limits(x.dtype)[1])  # wraps like -x
    return x.mul(-1)


negative = neg


def sub(input: TensorLike, other: TensorLike, *, alpha: float = 1) -> Tensor:  # noqa: A002
    a, b = pair(input, other, "sub")
    if a.dtype is dt.bool_:
        raise TypeError(
            f"sub: subtraction of bool tensors is not supported ({a.shape} - {b.shape})"
        )
    return a._op(Op.ADD, neg(b) if alpha == 1 else b.mul(-alpha))


subtract = sub


def mul(input: TensorLike, other: TensorLike) -> Tensor:  # noqa: A002
    a, b = pair(input, other, "mul")
    return a._op(Op.MUL, b)


multiply = mul


def _true_div(a: Tensor, b: Tensor) -> Tensor:
    d = float_dtype(a)
    return a.cast(d)._op(Op.MUL, b.cast(d).reciprocal())


def div(input: TensorLike, other: TensorLike, *, rounding_mode: str | None = None) -> Tensor:  # noqa: A002
    a, b = pair(input, other, "div")
    if rounding_mode is None:
        return _true_div(a, b)
    if rounding_mode == "trunc":
        return trunc(_true_div(a, b)) if a.dtype.is_float else _int_divmod(a, b)[0]
    if rounding_mode == "floor":
        return floor_divide(a, b)
    raise ValueError(f"div: rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")


divide = div


def true_divide(input: TensorLike, other: TensorLike) -> Tensor:  # noqa: A002
    return div(input, other)


def _int_divmod(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """Truncating integer division: (a - fmod(a, b)) / b is exact, done in f64 and rounded."""
    if a.dtype is dt.bool_:
        a, b = a.cast(dt.i64), b.cast(dt.i64)
    r = a._op(Op.MOD, b)
    q = a._op(Op.ADD, neg(r)).cast(dt.f64).mul(b.cast(dt.f64).reciprocal())
    q = q.add(0.5).add(q.lt(0.0).cast(dt.f64).mul(-1.0))  # nearest: the cast truncates
    return q.cast(a.dtype), r


def _floor_fix(r: Tensor, b: Tensor) -> Tensor:
    """1 where a truncated remainder and the divisor have different signs (needs a floor fix)."""
    zero = 0.0 if r.dtype.is_float else 0
    return land(ne(r, zero), ne(r.lt(zero), b.lt(zero)))


def remainder(input: TensorLike, other: TensorLike) -> Tensor:  # noqa: A002
    """Python-style modulo: the result has the sign of the divisor."""
    a, b = pair(input, other, "remainder")
    if a.dtype is dt.bool_:
        a, b = a.cast(dt.i64), b.cast(dt.i64)
    r = a._op(Op.MOD, b)
    return r._op(Op.ADD, b._op(Op.MUL, _floor_fix(r, b).cast(r.dtype)))


def fmod(input: TensorLike, other: TensorLike) -> Tensor:  # noqa: A002
    a, b = pair(input, other, "fmod")
    return a._op(Op.MOD, b)


def floor_divide(input: TensorLike, other: TensorLike) -> Tensor:  # noqa: A002
    a, b = pair(input, other, "floor_divide")
    if not a.dtype.is_float:
        q, r = _int_divmod(a, b)
        return q._op(Op.ADD, neg(_floor_fix(r, b).cast(q.dtype)))
    # PyTorch's algorithm (div_floor_floating): exact in more cases than floor(a / b)
    m = a._op(Op.MOD, b)
    q = _true_div(a._op(Op.ADD, neg(m)), b)
    q = q.add(neg(_floor_fix(m, b).cast(q.dtype)))
    f = floor(q)
    return f.add(_gt(q.add(neg(f)), 0.5))  # q is near an integer: fix floor's off-by-one


def _gt(a: Tensor, v: float) -> Tensor:
    return a._const(v).expand(a.shape).lt(a).cast(a.dtype)


def abs(input: Tensor) -> Tensor:  # noqa: A001,A002
    x = need_tensor("abs", input)
    if x.dtype is dt.bool_ or x.dtype.kind == "uint":
        return x
    return _max2(x, neg(x))


absolute = abs


def sign(input: Tensor) -> Tensor:  # noqa: A002
    x = need_tensor("sign", input)
    if x.dtype is dt.bool_:
        return x
    zero = x._const(0).expand(x.shape)
    return zero.lt(x).cast(x.dtype).add(neg(x.lt(zero).cast(x.dtype)))


sgn = sign


def square(input: Tensor) -> Tensor:  # noqa: A002
    x = need_tensor("square", input)
    return x.mul(x) if x.dtype is not dt.bool_ else x.cast(dt.i64).mul(x.cast(dt.i64))


def reciprocal(input: Tensor) -> Tensor:  # noqa: A002
    return need_tensor("reciprocal", input).reciprocal()


def _pow_int(x: Tensor, n: int) -> Tensor:
    """x**n for an int n >= 1 by repeated squaring (exact sign handling, like PyTorch)."""
    out: Tensor | None = None
    base = x
    while n:
        if n & 1:
            out = base if out is None else out.mul(base)
        n >>= 1
        if n:
            base = base.mul(base)
    assert out is not None
    return out


def pow(input: TensorLike, exponent: TensorLike) -> Tensor:  # noqa: A001,A002
    if isinstance(input, Tensor) and not isinstance(exponent, Tensor):
        return _pow_scalar(input, exponent)
    if not isinstance(input, Tensor) and isinstance(exponent, Tensor):
        c = input
        to_float = exponent.dtype.is_float or isinstance(c, float)
        if to_float and isinstance(c, (int, float)) and not isinstance(c, bool) and c > 0:
            return _in_f32(lambda e: e.mul(math.log2(c)).exp2())(exponent)
    a, b = pair(input, exponent, "pow")
    if not a.dtype.is_float:
        if a.dtype is dt.bool_:
            a, b = a.cast(dt.i64), b.cast(dt.i64)
        return round(_pow_float(a.cast(dt.f64), b.cast(dt.f64))).cast(a.dtype)
    return _in_f32(_pow_f)(a, b)


def _pow_f(a: Tensor, b: Tensor) -> Tensor:
    return _pow_float(a, b.cast(a.dtype))


def _pow_float(a: Tensor, b: Tensor) -> Tensor:
    """exp2(b * log2|a|) with PyTorch's sign rules; b == 0 gives 1 (also for a == 0)."""
    d = a.dtype
    bz = eq(b, 0.0).cast(d)
    r = b.mul(abs(a).add(bz).log2()).exp2()
    is_neg = a.lt(0.0)
    b_int = eq(b, trunc(b))
    odd = land(b_int, ne(fmod(b, 2.0), 0.0))
    factor = land(is_neg, odd).cast(d).mul(-2.0).add(1.0)
    bad = land(is_neg, lnot(b_int)).cast(d)  # negative base, fractional exponent: NaN
    return r.mul(factor).add(bad.mul(-1.0).sqrt())


def _pow_scalar(x: Tensor, p: Any) -> Tensor:
    if isinstance(p, bool):
        p = int(p)
    if not isinstance(p, (int, float)):
        raise TypeError(f"pow: exponent must be a Tensor or a number, got {type(p).__name__}")
    if isinstance(p, float) and not x.dtype.is_float:
        x = x._floating()
    if x.dtype is dt.bool_:
        x = x.cast(dt.i64)
    if float(p).is_integer() and builtins_abs(p) < 2**31:
        n = int(p)
        if n == 0:
            return const(x.graph, 1, x.dtype, x.shape)
        if n < 0 and not x.dtype.is_float:
            raise ValueError(
                f"pow: integers to negative integer powers are not allowed ({x.dtype.name} ** {n})"
            )
        y = _pow_int(x, builtins_abs(n))
        return y.reciprocal() if n < 0 else y
    if p == 0.5:
        return _in_f32(lambda t: t.sqrt())(x)
    if p == -0.5:
        return _in_f32(lambda t: t.sqrt().reciprocal())(x)
    return _in_f32(lambda t: t.log2().mul(float(p)).exp2())(x)


def builtins_abs(v: Any) -> Any:
    return v if v >= 0 else -v


def lerp(input: Tensor, end: TensorLike, weight: TensorLike) -> Tensor:  # noqa: A002
    return add(input, mul(weight, sub(end, input)))


# ----------------------------------------------------------------------------- comparisons
def _notnan(s: Tensor) -> Tensor:
    """True unless NaN: NaN is the only value that is neither below +inf nor above -inf."""
    return lor(s.lt(INF), s._const(-INF).expand(s.shape).lt(s))


def lt(input: TensorLike, other: TensorLike) -> Tensor:  # noqa: A002
    a, b = pair(input, other, "lt")
    return a._op(Op.LESS_THAN, b)


def gt(input: TensorLike, other: TensorLike) -> Tensor:  # noqa: A002
    a, b = pair(input, other, "gt")
    return b._op(Op.LESS_THAN, a)


def _eq(a: Tensor, b: Tensor) -> Tensor:
    out = land(lnot(a._op(Op.LESS_THAN, b)), lnot(b._op(Op.LESS_THAN, a)))
    return land(out, _notnan(a._op(Op.ADD, b))) if a.dtype.is_float else out


def _le(a: Tensor, b: Tensor) -> Tensor:
    out = lnot(b._op(Op.LESS_THAN, a))
    return land(out, _notnan(a._op(Op.ADD, b))) if a.dtype.is_float else out


def eq(input: TensorLike, other: TensorLike) -> Tensor:  # noqa: A002
    return _eq(*pair(input, other, "eq"))


def ne(input: TensorLike, other: TensorLike) -> Tensor:  # noqa: A002
    return lnot(_eq(*pair(input, other, "ne")))


def le(input: TensorLike, other: TensorLike) -> Tensor:  # noqa: A002
    return _le(*pair(input, other, "le"))


def ge(input: TensorLike, other: TensorLike) -> Tensor:  # noqa: A002
    a, b = pair(input, other, "ge")
    return _le(b, a)


less, greater, less_equal, greater_equal, not_equal = lt, gt, le, ge, ne


def isnan(input: Tensor) -> Tensor:  # noqa: A002
    x = need_tensor("isnan", input)
    return lnot(_notnan(x)) if x.dtype.is_float else const(x.graph, False, dt.bool_, x.shape)


def isfinite(input: Tensor) -> Tensor:  # noqa: A002
    x = need_tensor("isfinite", input)
    if not x.dtype.is_float:
        return const(x.graph, True, dt.bool_, x.shape)
    return land(x.lt(INF), x._const(-INF).expand(x.shape).lt(x))


def isposinf(input: Tensor) -> Tensor:  # noqa: A002
    x = need_tensor("isposinf", input)
    if not x.dtype.is_float:
        return const(x.graph, False, dt.bool_, x.shape)
    return land(lnot(x.lt(INF)), x._const(-INF).expand(x.shape).lt(x))


def isneginf(input: Tensor) -> Tensor:  # noqa: A002
    return isposinf(neg(need_tensor("isneginf", input)))


def isinf(input: Tensor) -> Tensor:  # noqa: A002
    x = need_tensor("isinf", input)
    return (
        lor(isposinf(x), isneginf(x))
        if x.dtype.is_float
        else const(x.graph, False, dt.bool_, x.shape)
    )


def nan_to_num(input: Tensor, nan: float = 0.0, posinf: float | None = None,  # noqa: A002
               neginf: float | None = None) -> Tensor:  # fmt: skip
    """One GATHER over [x, nan, posinf, neginf] laid end to end; the index is x's own position
    for finite values, else the slot of its replacement."""
    x = need_tensor("nan_to_num", input)
    if not x.dtype.is_float:
        return x
    big = float(_finfo_max(x.dtype))
    vals = [nan, big if posinf is None else posinf, -big if neginf is None else neginf]
    g, n = x.graph, prod(x.shape)
    d = index_dtype(sym.add(n, 3))
    r = x.lt(INF).cast(d)
    t = x._const(-INF).expand(x.shape).lt(x).cast(d)
    alt = r.mul(2).add(t).add(const(g, n, d))  # n + 2r + t: slot of nan / posinf / neginf
    idx = alt.add(iota(g, x.shape, flat_expr(x.shape), d).add(neg(alt)).mul(r.mul(t)))
    data = cat_flat([x] + [const(g, v, x.dtype, (1,)) for v in vals])
    return gather_flat(data, idx)


def _finfo_max(d: DType) -> float:
    return float(finfo(d).max)


# ----------------------------------------------------------------------------- logic
def logical_not(input: Tensor) -> Tensor:  # noqa: A002
    return lnot(as_bool(need_tensor("logical_not", input)))


def _bools(a: TensorLike, b: TensorLike, name: str) -> tuple[Tensor, Tensor]:
    x, y = pair(a, b, name)
    return as_bool(x), as_bool(y)


def logical_and(input: TensorLike, other: TensorLike) -> Tensor:  # noqa: A002
    return land(*_bools(input, other, "logical_and"))


def logical_or(input: TensorLike, other: TensorLike) -> Tensor:  # noqa: A002
    return lor(*_bools(input, other, "logical_or"))


def logical_xor(input: TensorLike, other: TensorLike) -> Tensor:  # noqa: A002
    a, b = _bools(input, other, "logical_xor")
    return lor(a.lt(b), b.lt(a))


def _bitwise(name: str, fn: Callable[..., Tensor]) -> Callable[[TensorLike, TensorLike], Tensor]:
    def op(input: TensorLike, other: TensorLike) -> Tensor:  # noqa: A002
        a, b = pair(input, other, name)
        if a.dtype is not dt.bool_:
            raise TypeError(f"{name}: only bool tensors are supported, got {a.dtype.name}{a.shape}")
        return fn(a, b)

    op.__name__ = name
    return op


bitwise_and = _bitwise("bitwise_and", logical_and)
bitwise_or = _bitwise("bitwise_or", logical_or)
bitwise_xor = _bitwise("bitwise_xor", logical_xor)


def bitwise_not(input: Tensor) -> Tensor:  # noqa: A002
    """~x: logical not for bool, -x - 1 for integers (two's complement, wraps like C)."""
    x = need_tensor("bitwise_not", input)
    if x.dtype is dt.bool_:
        return lnot(x)
    if x.dtype.is_float:
        raise TypeError(f"bitwise_not: not defined for float tensors ({x.dtype.name}{x.shape})")
    m1 = int_limits(x.dtype)[1] if x.dtype.kind == "uint" else -1
    return x.mul(m1).add(m1)


# ----------------------------------------------------------------------------- select / min / max
def where(condition: Tensor, input: TensorLike, other: TensorLike) -> Tensor:  # noqa: A002
    c = need_tensor("where", condition, "condition")
    if c.dtype is not dt.bool_:
        raise TypeError(f"where: condition must be a bool tensor, got {c.dtype.name}{c.shape}")
    if not isinstance(input, Tensor) and not isinstance(other, Tensor):
        d = dt.promote(default_dtype(input), default_dtype(other))
        input = const(c.graph, input, d)
    a, b = pair(input, other, "where")
    shape = broadcast_shapes(a.shape, c.shape, "where")
    return select(c.expand(shape), a.expand(shape), b.expand(shape))


def _max2(a: Tensor, b: Tensor) -> Tensor:
    """Elementwise max of two same-shape tensors: MAX_REDUCE over a padded 2-element axis."""
    if a.dtype is dt.bool_:
        return lor(a, b)
    x = a.unsqueeze(-1).pad_dim(-1, 0, 1)
    if const_value(b) == 0:
        return x.max_reduce(-1)  # the padded element is the 0
    return x._op(Op.ADD, b.unsqueeze(-1).pad_dim(-1, 1, 0)).max_reduce(-1)


def _min2(a: Tensor, b: Tensor) -> Tensor:
    if a.dtype is dt.bool_:
        return land(a, b)
    if a.dtype.is_float:
        return neg(_max2(neg(a), neg(b)))
    return bitwise_not(_max2(bitwise_not(a), bitwise_not(b)))  # no overflow at INT_MIN


def maximum(input: TensorLike, other: TensorLike) -> Tensor:  # noqa: A002
    return _max2(*pair(input, other, "maximum"))


def minimum(input: TensorLike, other: TensorLike) -> Tensor:  # noqa: A002
    return _min2(*pair(input, other, "minimum"))


def clamp(input: Tensor, min: TensorLike | None = None, max: TensorLike | None = None) -> Tensor:  # noqa: A001,A002
    x = need_tensor("clamp", input)
    if min is None and max is None:
        raise ValueError(
            f"clamp: at least one of 'min' or 'max' must be given (input {x.dtype.name}{x.shape})"
        )
    if min is not None:
        x = maximum(x, min)
    if max is not None:
        x = minimum(x, max)
    return x


clip = clamp


def clamp_min(input: Tensor, min: TensorLike) -> Tensor:  # noqa: A001,A002
    return clamp(input, min=min)


def clamp_max(input: Tensor, max: TensorLike) -> Tensor:  # noqa: A001,A002
    return clamp(input, max=max)


# ----------------------------------------------------------------------------- rounding
def trunc(input: Tensor) -> Tensor:  # noqa: A002
    """x - fmod(x, 1); x is clamped first to where every float is an integer, so ±inf stay."""
    x = need_tensor("trunc", input)
    if not x.dtype.is_float:
        return x
    b = int_exact_bound(x.dtype)
    return x.add(neg(clamp(x, -b, b)._op(Op.MOD, x._const(1.0).expand(x.shape))))


fix = trunc


def floor(input: Tensor) -> Tensor:  # noqa: A002
    x = need_tensor("floor", input)
    if not x.dtype.is_float:
        return x
    t = trunc(x)
    return t.add(neg(x.lt(t).cast(x.dtype)))


def ceil(input: Tensor) -> Tensor:  # noqa: A002
    x = need_tensor("ceil", input)
    if not x.dtype.is_float:
        return x
    t = trunc(x)
    return t.add(t.lt(x).cast(x.dtype))


def round(input: Tensor, *, decimals: int = 0) -> Tensor:  # noqa: A001,A002
    """Round half to even (PyTorch's rule)."""
    x = need_tensor("round", input)
    if not x.dtype.is_float:
        return x
    if decimals:
        s = 10.0 ** builtins_abs(decimals)
        return round(x.mul(s)).mul(1.0 / s) if decimals > 0 else round(x.mul(1.0 / s)).mul(s)
    f = floor(x)
    d = x.add(neg(f))  # exact, in [0, 1)
    up = lor(_gt(d, 0.5).cast(dt.bool_), land(eq(d, 0.5), ne(fmod(f, 2.0), 0.0)))
    return f.add(up.cast(x.dtype))


def frac(input: Tensor) -> Tensor:  # noqa: A002
    x = need_tensor("frac", input)
    return x.add(neg(trunc(x)))
