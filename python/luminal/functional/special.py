"""Inverse trigonometric and hyperbolic functions, sign manipulation, NaN-ignoring extrema,
hypot and lgamma, named as in PyTorch.

Compositions of the primitives like the rest of ``functional``. The polynomial fits are
Cephes' single-precision ones (atanf, asinf), so results are within a few f32 ulps; each
branch of a piecewise formula is selected with an exact ``where``, so an unselected branch
that overflows or divides by zero never leaks into the result. Low-precision and integer
inputs are computed in f32, as PyTorch does.
"""

from __future__ import annotations

import math

from ..graph import dtypes as dt
from ..tensor import Tensor, TensorLike
from ._base import need_tensor, pair
from .elementwise import (
    _in_f32,
    abs,
    eq,
    floor,
    isnan,
    logical_and,
    logical_or,
    lt,
    maximum,
    minimum,
    neg,
    where,
)  # fmt: skip
from .transcendental import _log, _log1p

__all__ = [
    "acos", "acosh", "arccos", "arccosh", "arcsin", "arcsinh", "arctan", "arctan2", "arctanh",
    "asin", "asinh", "atan", "atan2", "atanh", "copysign", "fmax", "fmin", "hypot", "lgamma",
    "signbit",
]  # fmt: skip

_HALF_PI = math.pi / 2
_TAN_3PI_8 = 2.414213562373095
_TAN_PI_8 = 0.4142135623730950
# Cephes atanf on |x| <= tan(pi/8) and asinf on |x| <= 0.5: x + x z P(z), z = x^2
_ATAN_P = (8.05374449538e-2, -1.38776856032e-1, 1.99777106478e-1, -3.33329491539e-1)
_ASIN_P = (4.2163199048e-2, 2.4181311049e-2, 4.5470025998e-2, 7.4953002686e-2, 1.6666752422e-1)


def _odd_poly(x: Tensor, cs: tuple[float, ...]) -> Tensor:
    z = x.mul(x)
    p = z.mul(cs[0]).add(cs[1])
    for c in cs[2:]:
        p = p.mul(z).add(c)
    return p.mul(z).mul(x).add(x)


def _with_sign_of(r: Tensor, x: Tensor) -> Tensor:
    """r >= 0 given the sign of x (odd functions; -0 stays -0)."""
    return where(lt(x, 0.0), neg(r), r)


def _atan_pos(a: Tensor) -> Tensor:
    """atan of a >= 0: reduced to |t| <= tan(pi/8) by atan(a) = pi/2 - atan(1/a) above
    tan(3pi/8) and pi/4 + atan((a-1)/(a+1)) between."""
    big = lt(_TAN_3PI_8, a)
    mid = logical_and(lt(_TAN_PI_8, a), big.logical_not())
    t = where(big, neg(a.reciprocal()), where(mid, a.add(-1.0).mul(a.add(1.0).reciprocal()), a))
    base = where(big, _HALF_PI, where(mid, math.pi / 4, 0.0))
    return _odd_poly(t, _ATAN_P).add(base)


def atan(input: Tensor) -> Tensor:  # noqa: A002
    return _in_f32(lambda x: _with_sign_of(_atan_pos(abs(x)), x))(input)


def _asin_pos(a: Tensor) -> Tensor:
    """asin of a in [0, 1]: above 0.5, asin(a) = pi/2 - 2 asin(sqrt((1-a)/2)) (no cancellation
    near 1); a > 1 gives NaN from the square root."""
    big = lt(0.5, a)
    s = where(big, a.mul(-0.5).add(0.5).sqrt(), a)
    p = _odd_poly(s, _ASIN_P)
    return where(big, p.mul(-2.0).add(_HALF_PI), p)


def asin(input: Tensor) -> Tensor:  # noqa: A002
    return _in_f32(lambda x: _with_sign_of(_asin_pos(abs(x)), x))(input)


def _acos(x: Tensor) -> Tensor:
    # 2 asin(sqrt((1-x)/2)) near 1 and pi - 2 asin(sqrt((1+x)/2)) near -1, where pi/2 - asin(x)
    # would cancel
    hi, lo = lt(0.5, x), lt(x, -0.5)
    s = where(hi, x.mul(-0.5).add(0.5).sqrt(), where(lo, x.mul(0.5).add(0.5).sqrt(), x))
    p = _odd_poly(s, _ASIN_P)
    return where(hi, p.mul(2.0), where(lo, p.mul(-2.0).add(math.pi), neg(p).add(_HALF_PI)))


def acos(input: Tensor) -> Tensor:  # noqa: A002
    return _in_f32(_acos)(input)


def _atan2(y: Tensor, x: Tensor) -> Tensor:
    """atan of min(|x|,|y|) / max(|x|,|y|) in [0, 1] (no overflow), then reflected into the
    quadrant; signed zeros of x pick 0 or pi as in C's atan2."""
    ax, ay = abs(x), abs(y)
    hi, lo = maximum(ax, ay), minimum(ax, ay)
    both_inf = logical_and(eq(hi, math.inf), eq(lo, math.inf))
    q = where(eq(hi, 0.0), 0.0, where(both_inf, 1.0, lo.mul(hi.reciprocal())))
    t = _atan_pos(q)
    t = where(lt(ax, ay), neg(t).add(_HALF_PI), t)
    t = where(signbit(x), neg(t).add(math.pi), t)
    t = where(logical_or(isnan(x), isnan(y)), math.nan, t)
    return where(signbit(y), neg(t), t)


def atan2(input: TensorLike, other: TensorLike) -> Tensor:  # noqa: A002
    y, x = pair(input, other, "atan2")
    d = y.dtype if y.dtype.is_float else dt.f32
    return _in_f32(lambda yy: _atan2(yy, x.cast(yy.dtype)))(y.cast(d))


def atanh(input: Tensor) -> Tensor:  # noqa: A002
    # (log1p(x) - log1p(-x)) / 2: 1 + x and 1 - x are exact near the poles, where a single
    # log1p(2x / (1 - x)) would amplify the quotient's rounding
    return _in_f32(lambda x: _log1p(x).add(neg(_log1p(neg(x)))).mul(0.5))(input)


_BIG = 1e18  # past it, x^2 + 1 == x^2 in f32 and squaring could overflow


def _asinh(x: Tensor) -> Tensor:
    a = abs(x)
    small = minimum(a, _BIG)
    a2 = small.mul(small)
    near = _log1p(small.add(a2.mul(a2.add(1.0).sqrt().add(1.0).reciprocal())))
    far = _log(a).add(math.log(2.0))
    return _with_sign_of(where(lt(_BIG, a), far, near), x)


def asinh(input: Tensor) -> Tensor:  # noqa: A002
    return _in_f32(_asinh)(input)


def _acosh(x: Tensor) -> Tensor:
    # log1p(t + sqrt(2t + t^2)), t = x - 1: no cancellation near 1
    t = minimum(x, _BIG).add(-1.0)
    near = _log1p(t.add(t.mul(t.add(2.0)).sqrt()))
    out = where(lt(_BIG, x), _log(x).add(math.log(2.0)), near)
    return where(lt(x, 1.0), math.nan, out)  # t (t + 2) overflows to +inf for x << -1


def acosh(input: Tensor) -> Tensor:  # noqa: A002
    return _in_f32(_acosh)(input)


arctan, arcsin, arccos, arctan2 = atan, asin, acos, atan2
arctanh, arcsinh, arccosh = atanh, asinh, acosh


def signbit(input: Tensor) -> Tensor:  # noqa: A002
    """True where the sign bit is set: negative numbers and -0.0 (1 / -0.0 is -inf)."""
    x = need_tensor("signbit", input)
    if not x.dtype.is_float:
        return lt(x, 0)
    return logical_or(lt(x, 0.0), logical_and(eq(x, 0.0), lt(x.reciprocal(), 0.0)))


def copysign(input: TensorLike, other: TensorLike) -> Tensor:  # noqa: A002
    a, b = pair(input, other, "copysign")
    d = a.dtype if a.dtype.is_float else dt.f32
    mag = abs(a.cast(d))
    return where(signbit(b), neg(mag), mag)


def fmax(input: TensorLike, other: TensorLike) -> Tensor:  # noqa: A002
    """Elementwise max that ignores NaN (NaN only where both are)."""
    a, b = pair(input, other, "fmax")
    if not a.dtype.is_float:
        return maximum(a, b)
    return where(isnan(a), b, where(isnan(b), a, maximum(a, b)))


def fmin(input: TensorLike, other: TensorLike) -> Tensor:  # noqa: A002
    a, b = pair(input, other, "fmin")
    if not a.dtype.is_float:
        return minimum(a, b)
    return where(isnan(a), b, where(isnan(b), a, minimum(a, b)))


def hypot(input: TensorLike, other: TensorLike) -> Tensor:  # noqa: A002
    """max * sqrt(1 + (min/max)^2): no overflow or underflow of the squares; inf wins over
    NaN, as in C's hypot."""
    a, b = pair(input, other, "hypot")
    d = a.dtype if a.dtype.is_float else dt.f32

    def fn(x: Tensor) -> Tensor:
        ax, ay = abs(x), abs(b.cast(x.dtype))
        hi, lo = maximum(ax, ay), minimum(ax, ay)
        r = where(eq(hi, 0.0), 0.0, lo.mul(hi.reciprocal()))
        out = hi.mul(r.mul(r).add(1.0).sqrt())
        return where(logical_or(eq(ax, math.inf), eq(ay, math.inf)), math.inf, out)

    return _in_f32(fn)(a.cast(d))


# Stirling's series for log Gamma at z >= 8: (z - 1/2) log z - z + log(2 pi)/2 + sum B/z^k
_STIRLING = (1.0 / 12, -1.0 / 360, 1.0 / 1260, -1.0 / 1680)
_SHIFT = 8


def _lgamma_pos(x: Tensor) -> Tensor:
    """log|Gamma(x)| for x > 0: shifted up to z = x + n >= 8 with
    lgamma(x) = lgamma(z) - log(x (x+1) ... (x+n-1)); the product's factors are counted with
    0/1 weights (a factor of 1 where x is already large), so one formula covers every x."""
    prod = x._const(1.0).expand(x.shape)
    z = x
    for _ in range(_SHIFT):
        use = lt(z, float(_SHIFT))
        prod = prod.mul(where(use, z, 1.0))
        z = where(use, z.add(1.0), z)
    r = z.reciprocal()
    r2 = r.mul(r)
    series = r2.mul(_STIRLING[3]).add(_STIRLING[2])
    for c in (_STIRLING[1], _STIRLING[0]):
        series = series.mul(r2).add(c)
    series = series.mul(r)
    lz = _log(z)
    main = z.add(-0.5).mul(lz).add(neg(z)).add(0.5 * math.log(2 * math.pi)).add(series)
    return main.add(neg(_log(prod)))


def _lgamma(x: Tensor) -> Tensor:
    # reflection for x < 0.5: lgamma(x) = log(pi / |sin(pi x)|) - lgamma(1 - x); sin(pi x) from
    # the fractional part so it is exact at the poles (non-positive integers give inf)
    neg_side = lt(x, 0.5)
    pos = _lgamma_pos(where(neg_side, neg(x).add(1.0), x))
    frac = x.add(neg(floor(x)))
    s = abs(minimum(frac, neg(frac).add(1.0)).mul(math.pi).sin())  # from the exact distance
    refl = _log(s.reciprocal().mul(math.pi)).add(neg(pos))
    out = where(neg_side, refl, pos)
    return where(eq(x, math.inf), math.inf, where(eq(x, -math.inf), math.inf, out))


def lgamma(input: Tensor) -> Tensor:  # noqa: A002
    return _in_f32(_lgamma)(input)
