"""Gamma-family, Bessel-type and error-function special functions named as in PyTorch
(``torch.special``): digamma, polygamma, Hurwitz zeta, i0/i0e/i1/i1e, erfcx, log_ndtr, erfinv,
ndtri, spherical_bessel_j0, Chebyshev polynomials of the four kinds (and shifted).

Each is computed in f64 from series, recurrences and asymptotic expansions with fixed term
counts, each branch picked by an exact ``where``, and rounded to the input's float dtype
(f32 for integers and low precision, as PyTorch). The term counts are chosen for full f32
accuracy; the tests check them against PyTorch over wide ranges. Limit: ``zeta(s, q)`` shifts
q up by a fixed 64 steps, so q < -54 gives NaN (PyTorch sums further); polygamma reflects
instead and has no such limit.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ..graph import dtypes as dt
from ..tensor import Tensor, TensorLike
from ._base import float_dtype, need_tensor, pair
from .elementwise import abs, eq, floor, isnan, logical_and, logical_or, lt, neg, trunc, where

__all__ = ["chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v",
           "chebyshev_polynomial_w", "shifted_chebyshev_polynomial_t",
           "shifted_chebyshev_polynomial_u", "shifted_chebyshev_polynomial_v",
           "shifted_chebyshev_polynomial_w", "digamma", "erfcx", "erfinv", "i0", "i0e", "i1",
           "i1e", "log_ndtr", "ndtri", "polygamma", "spherical_bessel_j0", "zeta"]  # fmt: skip

_LN2 = math.log(2.0)
_INV_LN2 = 1.0 / _LN2
_SQRT_PI = math.sqrt(math.pi)
# B_2k for k = 1..10
_BERNOULLI = (1 / 6, -1 / 30, 1 / 42, -1 / 30, 5 / 66, -691 / 2730, 7 / 6, -3617 / 510,
              43867 / 798, -174611 / 330)  # fmt: skip
_ZETA_SHIFT = 64


def _work(x: Any) -> dt.DType:
    d = need_tensor("special function", x).dtype
    return d if d in (dt.f32, dt.f64) else dt.f32


def _f64(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """Run ``fn`` on f64 copies of its tensor arguments; the result in the first one's float
    dtype."""

    def wrapper(input: Tensor, *args: Any) -> Tensor:  # noqa: A002
        x = need_tensor(fn.__name__, input)
        if x.numel() == 0:  # nothing to compute (and no selects over empty views)
            return x.cast(float_dtype(x))
        out = fn(x.cast(dt.f64), *(a.cast(dt.f64) if isinstance(a, Tensor) else a for a in args))
        return out.cast(float_dtype(x))

    wrapper.__name__, wrapper.__doc__ = fn.__name__, fn.__doc__
    return wrapper


def _log(x: Tensor) -> Tensor:
    return x.log2().mul(_LN2)


def _exp(x: Tensor) -> Tensor:
    return x.mul(_INV_LN2).exp2()


def _pi_times(x: Tensor, work: dt.DType) -> Tensor:
    """pi x rounded in ``work``, the dtype PyTorch computes in: near a pole its result is set by
    that rounding, which the f64 evaluation then follows."""
    return x.cast(work).mul(math.pi).cast(dt.f64)


def _cot_pi(r: Tensor, work: dt.DType) -> Tensor:
    """pi / tan(pi r) for |r| < 1."""
    p = _pi_times(r, work)
    return p.add(math.pi / 2).sin().mul(math.pi).mul(p.sin().reciprocal())


# ----------------------------------------------------------------------------- gamma family
def _digamma_pos(t: Tensor) -> Tensor:
    """psi(t) for t > 0: psi(t) = psi(t + 10) - sum 1/(t + k), then the asymptotic series."""
    s = t.reciprocal()
    for k in range(1, 10):
        s = s.add(t.add(float(k)).reciprocal())
    y = t.add(10.0)
    r2 = y.mul(y).reciprocal()
    ser = r2.mul(_BERNOULLI[6] / 14)
    for k in range(5, -1, -1):
        ser = ser.add(_BERNOULLI[k] / (2 * k + 2)).mul(r2) if k else ser.add(_BERNOULLI[0] / 2)
    ser = ser.mul(r2)
    return _log(y).add(y.reciprocal().mul(-0.5)).add(neg(ser)).add(neg(s))


def _digamma(x: Tensor, work: dt.DType) -> Tensor:
    neg_side = lt(x, 0.0)
    t = where(neg_side, neg(x).add(1.0), x)
    pos = _digamma_pos(where(eq(t, 0.0), 1.0, t))
    r = x.add(neg(trunc(x)))  # exact: the distance to the pole sets the reflection term
    out = where(neg_side, pos.add(neg(_cot_pi(where(eq(r, 0.0), 0.5, r), work))), pos)
    pole = logical_and(neg_side, eq(r, 0.0))
    out = where(pole, math.nan, out)
    zero = where(x.reciprocal().lt(0.0), math.inf, -math.inf)  # psi(+-0) = -+inf
    out = where(eq(x, 0.0), zero, out)
    return where(eq(x, math.inf), math.inf, where(eq(x, -math.inf), math.nan, out))


def digamma(input: Tensor) -> Tensor:  # noqa: A002
    return _f64(_digamma)(input, dt.f64)  # PyTorch reflects in double for every dtype


def _pow_neg(base: Tensor, s: Tensor, s_odd: Tensor) -> Tensor:
    """base^-s for integer s where base may be negative (|base|^-s with the sign)."""
    mag = _exp(neg(s).mul(_log(abs(base))))
    return where(logical_and(lt(base, 0.0), s_odd), neg(mag), mag)


def _hurwitz(s: Tensor, q: Tensor, shift: int = _ZETA_SHIFT) -> Tensor:
    """zeta(s, q) by Euler-Maclaurin summation after ``shift`` terms (for q > 10 - shift)."""
    s_odd = eq(s.fmod(2.0).abs(), 1.0)
    total = _pow_neg(q, s, s_odd)
    for k in range(1, shift):
        total = total.add(_pow_neg(q.add(float(k)), s, s_odd))
    a = q.add(float(shift))
    la = _log(abs(a))
    b = _exp(neg(s).mul(la))  # a^-s
    total = total.add(b.mul(a).mul(s.add(-1.0).reciprocal())).add(b.mul(0.5))
    ainv = a.reciprocal()
    fact = s.mul(ainv).mul(b)  # s (s+1)...(s+2j-2) a^(-s-2j+1) / (2j)!, built term by term
    fac = 2.0
    for j, bern in enumerate(_BERNOULLI, start=1):
        total = total.add(fact.mul(bern / fac))
        fact = fact.mul(s.add(2.0 * j - 1)).mul(s.add(2.0 * j)).mul(ainv).mul(ainv)
        fac *= (2 * j + 1) * (2 * j + 2)
    return total


def _zeta(s: Tensor, q: Tensor) -> Tensor:
    out = where(lt(q, -float(_ZETA_SHIFT - 10)), math.nan, _hurwitz(s, q))
    s_int = eq(s, floor(s))
    q_int = eq(q, floor(q))
    nonpos = logical_or(lt(q, 0.0), eq(q, 0.0))
    out = where(logical_and(nonpos, q_int), math.inf, out)
    out = where(logical_and(lt(q, 0.0), logical_and(s_int.logical_not(), q_int.logical_not())),
                math.nan, out)  # fmt: skip
    out = where(eq(q, math.inf), math.nan, out)
    out = where(eq(s, 1.0), math.inf, where(lt(s, 1.0), math.nan, out))
    return where(logical_or(isnan(s), isnan(q)), math.nan, out)


def zeta(input: TensorLike, other: TensorLike) -> Tensor:  # noqa: A002
    """The Hurwitz zeta function sum_k (k + q)^-s, as ``torch.special.zeta(s, q)``."""
    s, q = pair(input, other, "zeta")
    d = dt.promote(s.dtype, q.dtype)
    d = d if d.is_float and d not in (dt.f16, dt.bf16) else dt.f32
    if s.numel() == 0:
        return s.cast(d)
    return _zeta(s.cast(dt.f64), q.cast(dt.f64)).cast(d)


def _trigamma(x: Tensor, work: dt.DType) -> Tensor:
    """psi'(x): reflection psi'(x) = pi^2 / sin^2(pi x) - psi'(1 - x) below 1/2 (finite at the
    poles, where sin(pi x) is a rounding residue: as in PyTorch)."""
    refl = lt(x, 0.5)
    t = where(refl, neg(x).add(1.0), x)
    two = t._const(2.0).expand(t.shape)
    pos = _hurwitz(two, where(eq(t, math.inf), 1.0, t), 10)
    pos = where(eq(t, math.inf), 0.0, pos)
    sp = _pi_times(x, work).sin()
    return where(refl, sp.mul(sp).reciprocal().mul(math.pi * math.pi).add(neg(pos)), pos)


def _cot_derivative(n: int) -> list[float]:
    """Coefficients (constant first) of the polynomial P_n with d^n/dx^n cot(pi x) = P_n(c),
    c = cot(pi x): P_0 = c, P_(k+1) = -pi (1 + c^2) P_k'(c)."""
    p = [0.0, 1.0]
    for _ in range(n):
        d = [k * p[k] for k in range(1, len(p))] or [0.0]
        q = [0.0] * (len(d) + 2)
        for k, v in enumerate(d):
            q[k] -= math.pi * v
            q[k + 2] -= math.pi * v
        p = q
    return p


def _polygamma(x: Tensor, n: int) -> Tensor:
    """psi^(n)(x) = (-1)^(n+1) n! zeta(n + 1, x) for x >= 1/2; below, the reflection
    psi^(n)(x) = (-1)^n psi^(n)(1 - x) - pi d^n/dx^n cot(pi x)."""
    refl = lt(x, 0.5)
    t = where(refl, neg(x).add(1.0), x)
    big = eq(t, math.inf)
    s = x._const(float(n + 1)).expand(x.shape)
    pos = _hurwitz(s, where(big, 1.0, t), 10).mul((-1.0) ** (n + 1) * math.factorial(n))
    r = x.add(neg(floor(x)))
    c = _cot_pi(where(eq(r, 0.0), 0.5, r), dt.f64).mul(1.0 / math.pi)
    coefs = _cot_derivative(n)
    poly = c._const(coefs[-1]).expand(c.shape)
    for v in reversed(coefs[:-1]):
        poly = poly.mul(c).add(v)
    out = where(refl, pos.mul((-1.0) ** n).add(poly.mul(-math.pi)), pos)
    out = where(eq(x, math.inf), math.nan, out)
    pole = logical_or(logical_and(refl, eq(r, 0.0)), eq(x, -math.inf))
    return where(pole, math.inf if n % 2 else -math.inf, out)  # as zeta's inf at q = -k


def polygamma(n: int, input: Tensor) -> Tensor:  # noqa: A002
    """The n-th derivative of digamma."""
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"polygamma: n must be a non-negative int, got {n!r}")
    if n == 0:
        return digamma(input)
    if n == 1:  # PyTorch's trigamma rounds pi x in the input's dtype: followed here
        return _f64(_trigamma)(input, _work(input))

    def fn(x: Tensor) -> Tensor:
        return _polygamma(x, n)

    fn.__name__ = "polygamma"
    return _f64(fn)(input)


# ----------------------------------------------------------------------------- Bessel I
def _bessel_i_series(x: Tensor, nu: int, terms: int = 40) -> Tensor:
    """I_nu(x) = (x/2)^nu sum (x^2/4)^k / (k! (k+nu)!): positive terms, no cancellation."""
    q = x.mul(x).mul(0.25)
    term = x._const(1.0 / math.factorial(nu)).expand(x.shape)
    total = term
    for k in range(1, terms):
        term = term.mul(q).mul(1.0 / (k * (k + nu)))
        total = total.add(term)
    return total.mul(x.mul(0.5)) if nu == 1 else total


def _bessel_i_asym(a: Tensor, nu: int, terms: int = 20) -> Tensor:
    """I_nu(a) e^-a sqrt(2 pi a) = sum (-1)^k prod(4 nu^2 - (2j-1)^2) / (k! (8a)^k), a > 0."""
    inv = a.mul(8.0).reciprocal()
    coef = 1.0
    total = a._const(1.0).expand(a.shape)
    p = total
    for k in range(1, terms):
        coef *= -(4 * nu * nu - (2 * k - 1) ** 2) / k
        p = p.mul(inv)
        total = total.add(p.mul(coef))
    return total.mul(a.mul(2 * math.pi).sqrt().reciprocal())


_I_SPLIT = 20.0


def _bessel_i(x: Tensor, nu: int, scaled: bool) -> Tensor:
    a = abs(x)
    big = lt(_I_SPLIT, a)
    small_a = where(big, 0.0, a)
    ser = _bessel_i_series(where(big, 0.0, x), nu)
    if scaled:
        ser = ser.mul(_exp(neg(small_a)))
    asym = _bessel_i_asym(where(big, a, _I_SPLIT), nu)
    if not scaled:
        asym = asym.mul(_exp(where(big, a, 0.0)))
    if nu == 1:
        asym = where(lt(x, 0.0), neg(asym), asym)
    out = where(big, asym, ser)
    if scaled:
        out = where(eq(a, math.inf), 0.0, out)
    else:
        out = where(eq(a, math.inf), math.nan, out)  # PyTorch: exp(inf) times a zero
    return where(isnan(x), math.nan, out)


def i0(input: Tensor) -> Tensor:  # noqa: A002
    return _f64(lambda x: _bessel_i(x, 0, False))(input)


def i0e(input: Tensor) -> Tensor:  # noqa: A002
    return _f64(lambda x: _bessel_i(x, 0, True))(input)


def i1(input: Tensor) -> Tensor:  # noqa: A002
    return _f64(lambda x: _bessel_i(x, 1, False))(input)


def i1e(input: Tensor) -> Tensor:  # noqa: A002
    return _f64(lambda x: _bessel_i(x, 1, True))(input)


def _spherical_j0(x: Tensor) -> Tensor:
    safe = where(eq(x, 0.0), 1.0, x)
    out = safe.sin().mul(safe.reciprocal())
    return where(eq(x, 0.0), 1.0, where(eq(abs(x), math.inf), 0.0, out))


def spherical_bessel_j0(input: Tensor) -> Tensor:  # noqa: A002
    return _f64(_spherical_j0)(input)


# ----------------------------------------------------------------------------- error functions
_ERF_SPLIT = 2.5


def _erf_series(x: Tensor, terms: int = 40) -> Tensor:
    """erf(x) = 2/sqrt(pi) sum (-1)^n x^(2n+1) / (n! (2n+1)), for |x| <= 2.5."""
    x2 = x.mul(x)
    term = x
    total = x
    for n in range(1, terms):
        term = term.mul(x2).mul(-1.0 / n)
        total = total.add(term.mul(1.0 / (2 * n + 1)))
    return total.mul(2.0 / _SQRT_PI)


def _erfcx_cf(x: Tensor, depth: int = 30) -> Tensor:
    """exp(x^2) erfc(x) for x >= 2.5: the continued fraction
    1/sqrt(pi) / (x + (1/2)/(x + 1/(x + (3/2)/(x + ...)))), evaluated from the bottom."""
    f = x
    for k in range(depth, 0, -1):
        f = x.add(f.reciprocal().mul(k / 2))
    return f.reciprocal().mul(1.0 / _SQRT_PI)


def _erfcx_pos(a: Tensor) -> Tensor:
    """erfcx(a) for a >= 0."""
    big = lt(_ERF_SPLIT, a)
    small = where(big, 0.0, a)
    near = _exp(small.mul(small)).mul(neg(_erf_series(small)).add(1.0))
    return where(big, _erfcx_cf(where(big, a, _ERF_SPLIT)), near)


def _erfcx(x: Tensor) -> Tensor:
    """erfcx(x) = exp(x^2) erfc(x); for x < 0, 2 exp(x^2) - erfcx(-x) (inf below -26.6)."""
    pos = _erfcx_pos(abs(x))
    xs = where(lt(x, -27.0), 0.0, x)
    negv = _exp(xs.mul(xs)).mul(2.0).add(neg(pos))
    out = where(lt(x, 0.0), where(lt(x, -27.0), math.inf, negv), pos)
    return where(eq(x, math.inf), 0.0, out)


def erfcx(input: Tensor) -> Tensor:  # noqa: A002
    return _f64(_erfcx)(input)


def _erfc(x: Tensor) -> Tensor:
    """erfc in f64 for any x: the series near 0, erfcx(|x|) exp(-x^2) beyond 2.5."""
    a = abs(x)
    big = lt(_ERF_SPLIT, a)
    small = where(big, 0.0, x)
    near = neg(_erf_series(small)).add(1.0)
    ab = where(big, a, _ERF_SPLIT)
    tail = _erfcx_cf(ab).mul(_exp(neg(ab.mul(ab))))
    far = where(lt(x, 0.0), neg(tail).add(2.0), tail)
    return where(big, far, near)


def _log_ndtr(x: Tensor) -> Tensor:
    """log(Phi(x)): log(erfc(-x/sqrt2)/2); below -1 through erfcx (no underflow)."""
    t = x.mul(-1.0 / math.sqrt(2.0))
    low = lt(x, -1.0)
    tl = where(low, t, 1.0)
    lo = _log(_erfcx(tl).mul(0.5)).add(neg(tl.mul(tl)))
    th = where(low, 0.0, t)
    hi = _log(_erfc(th).mul(0.5))
    out = where(low, lo, hi)
    return where(eq(x, -math.inf), -math.inf, where(eq(x, math.inf), 0.0, out))


def log_ndtr(input: Tensor) -> Tensor:  # noqa: A002
    return _f64(_log_ndtr)(input)


def _erfc_inv(c: Tensor) -> Tensor:
    """x with erfc(x) = c, for c in (0, 2): Winitzki's closed form as the start, then Newton
    steps on erfc (its derivative -2/sqrt(pi) exp(-x^2)) in f64."""
    lg = _log(c).add(_log(neg(c).add(2.0)))  # log(1 - y^2), y = 1 - c
    a = 0.147
    u = lg.mul(0.5).add(2.0 / (math.pi * a))
    x = u.mul(u).add(lg.mul(-1.0 / a)).sqrt().add(neg(u)).sqrt()
    x = where(lt(c, 1.0), x, neg(x))
    for _ in range(3):  # quadratic from Winitzki's ~2e-3: 1e-5, 1e-10, then f64 rounding
        step = _erfc(x).add(neg(c)).mul(_exp(x.mul(x))).mul(_SQRT_PI / 2)
        x = x.add(step)
    return x


def _erfinv(y: Tensor) -> Tensor:
    c = neg(y).add(1.0)
    inside = logical_and(lt(0.0, c), lt(c, 2.0))
    out = _erfc_inv(where(inside, c, 1.0))
    out = where(eq(y, 1.0), math.inf, where(eq(y, -1.0), -math.inf, out))
    out = where(logical_or(lt(1.0, abs(y)), isnan(y)), math.nan, out)
    return where(eq(y, 0.0), y, out)  # keeps -0


def erfinv(input: Tensor) -> Tensor:  # noqa: A002
    return _f64(_erfinv)(input)


def _ndtri(p: Tensor) -> Tensor:
    """Phi^-1(p) = -sqrt(2) erfc^-1(2p)."""
    inside = logical_and(lt(0.0, p), lt(p, 1.0))
    out = _erfc_inv(where(inside, p.mul(2.0), 1.0)).mul(-math.sqrt(2.0))
    out = where(eq(p, 0.0), -math.inf, where(eq(p, 1.0), math.inf, out))
    return where(logical_or(logical_or(lt(p, 0.0), lt(1.0, p)), isnan(p)), math.nan, out)


def ndtri(input: Tensor) -> Tensor:  # noqa: A002
    return _f64(_ndtri)(input)


# ----------------------------------------------------------------------------- Chebyshev
_CHEB_REC = 24  # orders up to this by the three-term recurrence (as PyTorch), beyond in closed form
# (first term, second term as (a, b) for a*x + b) of T, U, V, W
_CHEB_START = {"t": (1.0, 0.0), "u": (2.0, 0.0), "v": (2.0, -1.0), "w": (2.0, 1.0)}


def _cheb_closed(kind: str, x: Tensor, n: Tensor) -> Tensor:
    """T/U/V/W_n(x) from angles: cos / sin of multiples of theta = acos x inside [-1, 1], and
    cosh / sinh of multiples of t = acosh |x| outside (with the parity of n for x < -1)."""
    a = abs(x)
    inside = lt(a, 1.0)
    th = _acos64(where(inside, x, 0.5))
    ao = where(inside, 2.0, a)
    t = _log(ao.add(ao.mul(ao).add(-1.0).sqrt()))

    def ch(m: Tensor) -> Tensor:
        return _exp(m).add(_exp(neg(m))).mul(0.5)

    def sh(m: Tensor) -> Tensor:
        return _exp(m).add(neg(_exp(neg(m)))).mul(0.5)

    half = n.add(0.5)
    flip_vw = lt(x, 0.0)  # V_n(-x) = (-1)^n W_n(x), W_n(-x) = (-1)^n V_n(x)
    if kind == "t":
        cin, cout = th.mul(n).add(math.pi / 2).sin(), ch(t.mul(n))
    elif kind == "u":
        cin = th.mul(n.add(1.0)).sin().mul(th.sin().reciprocal())
        cout = sh(t.mul(n.add(1.0))).mul(sh(t).reciprocal())
    else:
        cos_half = th.mul(0.5).add(math.pi / 2).sin()
        if kind == "v":
            cin = th.mul(half).add(math.pi / 2).sin().mul(cos_half.reciprocal())
        else:
            cin = th.mul(half).sin().mul(th.mul(0.5).sin().reciprocal())
        hyper_v = ch(t.mul(half)).mul(ch(t.mul(0.5)).reciprocal())
        hyper_w = sh(t.mul(half)).mul(sh(t.mul(0.5)).reciprocal())
        mine, other = (hyper_v, hyper_w) if kind == "v" else (hyper_w, hyper_v)
        cout = where(flip_vw, other, mine)
    odd = eq(n.fmod(2.0), 1.0)
    cout = where(logical_and(lt(x, 0.0), odd), neg(cout), cout)
    return where(inside, cin, cout)


def _acos64(x: Tensor) -> Tensor:
    """acos in f64 for |x| < 1: atan2(sqrt(1 - x^2), x) by Newton on cos (f64 accurate)."""
    from .special import _acos

    th = _acos(x)
    for _ in range(2):
        th = th.add(th.add(math.pi / 2).sin().add(neg(x)).mul(th.sin().reciprocal()))
    return th


def _chebyshev(kind: str, x: Tensor, n: Tensor) -> Tensor:
    n = trunc(n)
    a0 = x._const(1.0).expand(x.shape)
    sa, sb = _CHEB_START[kind]
    a1 = x.mul(sa).add(sb) if kind != "t" else x
    p, q = a0, a1
    out = where(eq(n, 0.0), a0, where(eq(n, 1.0), a1, 0.0))
    x2 = x.add(x)
    for k in range(2, _CHEB_REC + 1):
        r = x2.mul(q).add(neg(p))
        out = where(eq(n, float(k)), r, out)
        p, q = q, r
    out = where(lt(float(_CHEB_REC), n), _cheb_closed(kind, x, n), out)
    # |x| == 1, as PyTorch: T: +-1; U: +-(n+1); V, W: 1 or +-(2n+1)
    neg_x = lt(x, 0.0)
    even = eq(n.fmod(2.0), 0.0)
    sign = where(logical_or(lt(0.0, x), even), 1.0, -1.0)
    if kind == "t":
        edge = sign
    elif kind == "u":
        edge = sign.mul(n.add(1.0))
    elif kind == "v":
        edge = where(neg_x, where(even, n.mul(2.0).add(1.0), n.mul(-2.0).add(-1.0)), 1.0)
    else:
        edge = where(neg_x, where(even, 1.0, -1.0), n.mul(2.0).add(1.0))
    out = where(eq(abs(x), 1.0), edge, out)
    return where(lt(n, 0.0), 0.0, where(logical_or(isnan(x), isnan(n)), math.nan, out))


def _cheb_fn(kind: str, shifted: bool) -> Callable[[TensorLike, TensorLike], Tensor]:
    name = f"{'shifted_' if shifted else ''}chebyshev_polynomial_{kind}"

    def fn(input: TensorLike, n: TensorLike) -> Tensor:  # noqa: A002
        x, nn = pair(input, n, name)
        d = dt.promote(x.dtype, nn.dtype)
        d = d if d.is_float and d not in (dt.f16, dt.bf16) else dt.f32
        if x.numel() == 0:
            return x.cast(d)
        x64 = x.cast(dt.f64)
        if shifted:
            x64 = x64.add(x64).add(-1.0)
        return _chebyshev(kind, x64, nn.cast(dt.f64)).cast(d)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"PyTorch's ``torch.special.{name}(x, n)`` (n truncated to an integer)."
    return fn


chebyshev_polynomial_t = _cheb_fn("t", False)
chebyshev_polynomial_u = _cheb_fn("u", False)
chebyshev_polynomial_v = _cheb_fn("v", False)
chebyshev_polynomial_w = _cheb_fn("w", False)
shifted_chebyshev_polynomial_t = _cheb_fn("t", True)
shifted_chebyshev_polynomial_u = _cheb_fn("u", True)
shifted_chebyshev_polynomial_v = _cheb_fn("v", True)
shifted_chebyshev_polynomial_w = _cheb_fn("w", True)
