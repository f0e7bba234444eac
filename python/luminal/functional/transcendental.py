"""Exponentials, logarithms, trigonometric and error functions named as in PyTorch.

Built on EXP2, LOG2, SIN, SQRT and RECIP. Where a textbook formula cancels (expm1 and log1p
near 0, tanh near 0, erfc in the tails) a corrected form is used, and piecewise formulas blend
branches with 0/1 weights only after clamping each branch's argument, so the unselected
branch stays finite (0 * inf would be NaN). Low-precision inputs are computed in f32.
"""

from __future__ import annotations

import math

from ..tensor import Tensor
from ._base import LN2, LOG2E
from .elementwise import _in_f32, abs, clamp, eq, floor, fmod, neg, where

__all__ = [
    "cos", "cosh", "erf", "erfc", "exp", "exp2", "expm1", "log", "log10", "log1p", "log2",
    "rsqrt", "sigmoid", "sin", "sinh", "sqrt", "tan", "tanh",
]  # fmt: skip


def exp(input: Tensor) -> Tensor:  # noqa: A002
    return _in_f32(_exp)(input)


def _exp(x: Tensor) -> Tensor:
    return x.mul(LOG2E).exp2()


def exp2(input: Tensor) -> Tensor:  # noqa: A002
    return _in_f32(lambda x: x.exp2())(input)


def log(input: Tensor) -> Tensor:  # noqa: A002
    return _in_f32(_log)(input)


def _log(x: Tensor) -> Tensor:
    return x.log2().mul(LN2)


def log2(input: Tensor) -> Tensor:  # noqa: A002
    return _in_f32(lambda x: x.log2())(input)


def log10(input: Tensor) -> Tensor:  # noqa: A002
    return _in_f32(lambda x: x.log2().mul(math.log10(2.0)))(input)


def sqrt(input: Tensor) -> Tensor:  # noqa: A002
    return _in_f32(lambda x: x.sqrt())(input)


def rsqrt(input: Tensor) -> Tensor:  # noqa: A002
    return _in_f32(lambda x: x.sqrt().reciprocal())(input)


def sin(input: Tensor) -> Tensor:  # noqa: A002
    return _in_f32(lambda x: x.sin())(input)


def _cos(x: Tensor) -> Tensor:
    s = x.mul(0.5).sin()  # 1 - 2 sin^2(x/2): no rounding of x + pi/2 for large x
    return s.mul(s).mul(-2.0).add(1.0)


def cos(input: Tensor) -> Tensor:  # noqa: A002
    return _in_f32(_cos)(input)


# pi as three floats of 12 significant bits (Cody-Waite): t * _PI_A is exact for |t| < 2^11,
# so the distance to tan's pole keeps its digits.
_PI_A, _PI_B, _PI_C = 3.1416015625, -8.907169103622437e-06, -1.741103261565513e-09
_TAN_SPLIT_MAX = 6000.0


def _tan(x: Tensor) -> Tensor:
    """sin(x) / cos(x) with cos(x) = -(-1)^m sin(h), h = x - (m + 1/2) pi the distance to the
    pole between m pi and (m+1) pi: near the pole h is a small difference computed from the
    split pi (x - t * _PI_A is exact there), where cos(x) itself would be mostly rounding."""
    m = floor(x.mul(1.0 / math.pi))
    t = m.add(0.5)
    h = x.add(t.mul(-_PI_A)).add(t.mul(-_PI_B)).add(t.mul(-_PI_C))
    sign = abs(fmod(m, 2.0)).mul(2.0).add(-1.0)  # -(-1)^m
    near = x.sin().mul(h.sin().mul(sign).reciprocal())
    # past |t| = 2^11 the split is no longer exact: sin / cos of x, whose own reduction is exact
    far = x.sin().mul(_cos(x).reciprocal())
    return where(abs(x).lt(_TAN_SPLIT_MAX), near, far)


def tan(input: Tensor) -> Tensor:  # noqa: A002
    return _in_f32(_tan)(input)


def _expm1(x: Tensor) -> Tensor:
    """Taylor polynomial for |x| < 0.5 (no cancellation), exp(x) - 1 elsewhere; each branch is
    fed a clamped argument so the unselected one stays finite in the blend."""
    small = abs(x).lt(0.5).cast(x.dtype)
    xc = clamp(x, -0.5, 0.5)
    p = x._const(1.0 / math.factorial(10)).expand(x.shape)
    for k in range(9, 0, -1):
        p = p.mul(xc).add(1.0 / math.factorial(k))
    p = p.mul(xc)
    big = _exp(x).add(-1.0)
    return p.mul(small).add(big.mul(small.mul(-1.0).add(1.0)))


def expm1(input: Tensor) -> Tensor:  # noqa: A002
    return _in_f32(_expm1)(input)


def _log1p(x: Tensor) -> Tensor:
    """log(u) + (x - (u - 1)) / u with u = 1 + x: the second term restores what rounding u
    lost. x is clamped in the correction so x = inf and x = -1 stay exact."""
    u = x.add(1.0)
    xc = clamp(x, max=1e30)
    uc = xc.add(1.0)
    num = xc.add(uc.add(-1.0).mul(-1.0))
    den = uc.add(eq(uc, 0.0).cast(x.dtype))
    return _log(u).add(num.mul(den.reciprocal()))


def log1p(input: Tensor) -> Tensor:  # noqa: A002
    return _in_f32(_log1p)(input)


def _sigmoid(x: Tensor) -> Tensor:
    return _exp(neg(x)).add(1.0).reciprocal()


def sigmoid(input: Tensor) -> Tensor:  # noqa: A002
    return _in_f32(_sigmoid)(input)


# tanh(x) = x * P(x^2) / Q(x^2), a rational fit of our own (tools/fit_tanh.py: relative-error
# least squares pushed toward minimax), max relative error ~3.6e-7 in f32 (near 0 too: no
# cancellation). About a third of the operations of expm1(2x) / (expm1(2x) + 2), which
# computed both of expm1's branches: tanh-GELU was compute-bound on a CPU with that form. The
# argument is clamped to +-9.5, where the quotient is just above 1, and the result to +-1:
# tanh(+-inf) and large arguments give exactly +-1.
_TANH_CLAMP = 9.5
_TANH_P = (-1.161845618352669e-14, 2.122179969996218e-11, -1.308570740095404e-08,
           9.281127093074251e-06, 2.918647441117004e-03, 1.291637728228546e-01,
           9.999999200443502e-01)  # fmt: skip
_TANH_Q = (2.279926384311133e-04, 2.375169715977587e-02, 4.624964526612068e-01, 1.0)  # fmt: skip


def _horner(x2: Tensor, cs: tuple[float, ...]) -> Tensor:
    acc = x2.mul(cs[0]).add(cs[1])
    for c in cs[2:]:
        acc = acc.mul(x2).add(c)
    return acc


def _tanh(x: Tensor) -> Tensor:
    xc = clamp(x, -_TANH_CLAMP, _TANH_CLAMP)  # NaN stays NaN
    x2 = xc.mul(xc)
    return clamp(xc.mul(_horner(x2, _TANH_P)).mul(_horner(x2, _TANH_Q).reciprocal()), -1.0, 1.0)


def tanh(input: Tensor) -> Tensor:  # noqa: A002
    return _in_f32(_tanh)(input)


def sinh(input: Tensor) -> Tensor:  # noqa: A002
    return _in_f32(lambda x: _expm1(x).add(neg(_expm1(neg(x)))).mul(0.5))(input)


def cosh(input: Tensor) -> Tensor:  # noqa: A002
    return _in_f32(lambda x: _exp(x).add(_exp(neg(x))).mul(0.5))(input)


# x * P(x^2) / Q(x^2) on [-4, 4] (erf(4) rounds to 1 in f32): max relative error ~4e-7.
_ERF_P = (
    -2.72614225801306e-10,
    2.77068142495902e-08,
    -2.10102402082508e-06,
    -5.69250639462346e-05,
    -7.34990630326855e-04,
    -2.95459980854025e-03,
    -1.60960333262415e-02,
)
_ERF_Q = (
    -1.45660718464996e-05,
    -2.13374055278905e-04,
    -1.68282697438203e-03,
    -7.37332916720468e-03,
    -1.42647390514189e-02,
)


def _erf(x: Tensor) -> Tensor:
    xc = clamp(x, -4.0, 4.0)
    x2 = xc.mul(xc)

    return xc.mul(_horner(x2, _ERF_P)).mul(_horner(x2, _ERF_Q).reciprocal())


def erf(input: Tensor) -> Tensor:  # noqa: A002
    return _in_f32(_erf)(input)


# erfc(z) = t * exp(-z^2 + P(t)), t = 1 / (1 + z/2), z >= 0 (Numerical Recipes' erfcc): relative
# error < 1.2e-7 everywhere, so tails like gelu(-4) keep their digits (1 - erf would cancel).
_ERFC_P = (0.17087277, -0.82215223, 1.48851587, -1.13520398, 0.27886807, -0.18628806, 0.09678418,
           0.37409196, 1.00002368, -1.26551223)  # fmt: skip


def _erfc(x: Tensor) -> Tensor:
    z = abs(x)
    t = z.mul(0.5).add(1.0).reciprocal()
    p = t.mul(_ERFC_P[0]).add(_ERFC_P[1])
    for c in _ERFC_P[2:]:
        p = p.mul(t).add(c)
    e = t.mul(_exp(p.add(neg(z.mul(z)))))
    m = x.lt(0.0).cast(x.dtype)  # erfc(-z) = 2 - erfc(z): an exact blend of finite values
    return e.mul(m.mul(-2.0).add(1.0)).add(m.mul(2.0))


def erfc(input: Tensor) -> Tensor:  # noqa: A002
    return _in_f32(_erfc)(input)
