"""Bessel functions of the first and second kind (J0, J1, Y0, Y1), modified Bessel functions of
the second kind (K0, K1 and their scaled forms) and the Airy function Ai, named as in PyTorch
(``torch.special``).

Computed in f64 and rounded to the input's float dtype, as ``specfun``: the power series
(A&S 9.1.10-11, 9.6.10-11, 10.4.2-3) where their terms stay within a few orders of magnitude
of the result, Hankel's asymptotic expansions beyond (A&S 9.2.5-6, 9.7.2, 10.4.59-60), each
branch picked by an exact ``where``. The splits are chosen so both sides keep full f32
accuracy; the tests compare against PyTorch over wide ranges.
"""

from __future__ import annotations

import math

from ..tensor import Tensor
from .elementwise import abs, eq, isnan, lt, neg, where
from .specfun import _exp, _f64, _log

__all__ = ["airy_ai", "bessel_j0", "bessel_j1", "bessel_y0", "bessel_y1", "modified_bessel_k0",
           "modified_bessel_k1", "scaled_modified_bessel_k0",
           "scaled_modified_bessel_k1"]  # fmt: skip

_EULER = 0.57721566490153286061
_JY_SPLIT = 20.0  # series below, Hankel's expansion from here (terms there: at most ~1e7)
_K_SPLIT = 10.0
_AI_HI, _AI_LO = 6.0, -7.0


def _sums(x: Tensor, n: int, sign: float, terms: int) -> tuple[Tensor, Tensor]:
    """S0 = sum s^k q^k / (k! (k+n)!) and S1 = the same terms weighted by
    psi(k+1) + psi(k+n+1), q = x^2 / 4, s = ``sign``."""
    q = x.mul(x).mul(0.25 * sign)
    term = x._const(1.0 / math.factorial(n)).expand(x.shape)
    psi_k = -_EULER  # psi(k + 1)
    psi_kn = -_EULER + sum(1.0 / j for j in range(1, n + 1))  # psi(k + n + 1)
    s0, s1 = term, term.mul(psi_k + psi_kn)
    for k in range(1, terms):
        term = term.mul(q).mul(1.0 / (k * (k + n)))
        psi_k += 1.0 / k
        psi_kn += 1.0 / (k + n)
        s0 = s0.add(term)
        s1 = s1.add(term.mul(psi_k + psi_kn))
    return s0, s1


def _hankel(x: Tensor, n: int, terms: int) -> tuple[Tensor, Tensor]:
    """(P, Q) of J_n = sqrt(2/(pi x)) (P cos c - Q sin c), c = x - (n/2 + 1/4) pi."""
    mu = 4.0 * n * n
    inv = x.reciprocal()
    p = x._const(1.0).expand(x.shape)
    q = None
    a = 1.0
    power = p
    for k in range(1, terms):
        a *= (mu - (2 * k - 1) ** 2) / (8.0 * k)
        power = power.mul(inv)
        sgn = -1.0 if (k // 2) % 2 else 1.0
        t = power.mul(a * sgn)
        if k % 2:
            q = t if q is None else q.add(t)
        else:
            p = p.add(t)
    assert q is not None
    return p, q


def _jy(x: Tensor, n: int, second: bool) -> Tensor:
    """J_n(x) (or Y_n(x) when ``second``) for x >= 0."""
    big = lt(_JY_SPLIT, x)
    xs = where(big, 1.0, x)
    s0, s1 = _sums(xs, n, -1.0, 48)
    half = xs.mul(0.5)
    j = s0.mul(half) if n else s0
    if second:
        lg = _log(half)
        ser = j.mul(lg).mul(2.0 / math.pi)
        ser = ser.add((s1.mul(half) if n else s1).mul(-1.0 / math.pi))
        if n:
            ser = ser.add(xs.reciprocal().mul(-2.0 / math.pi))
    else:
        ser = j
    xb = where(big, x, _JY_SPLIT)
    p, q = _hankel(xb, n, 16)
    c = xb.add(-(n / 2 + 0.25) * math.pi)
    cos, sin = c.add(math.pi / 2).sin(), c.sin()
    amp = xb.mul(math.pi / 2).sqrt().reciprocal()
    asym = p.mul(sin).add(q.mul(cos)) if second else p.mul(cos).add(q.mul(sin).mul(-1.0))
    out = where(big, asym.mul(amp), ser)
    return where(eq(x, math.inf), math.nan, out)  # as PyTorch (the limit would be 0)


def _k(x: Tensor, n: int, scaled: bool) -> Tensor:
    """K_n(x) (times e^x when ``scaled``) for x > 0."""
    big = lt(_K_SPLIT, x)
    xs = where(big, 1.0, x)
    s0, s1 = _sums(xs, n, 1.0, 40)
    half = xs.mul(0.5)
    lg = _log(half)
    if n:
        ser = s0.mul(half).mul(lg).add(s1.mul(half).mul(-0.5)).add(xs.reciprocal())
    else:
        ser = s0.mul(lg).mul(-1.0).add(s1.mul(0.5))
    if scaled:
        ser = ser.mul(_exp(xs))
    xb = where(big, x, _K_SPLIT)
    mu = 4.0 * n * n
    inv = xb.reciprocal()
    total = xb._const(1.0).expand(xb.shape)
    a, power = 1.0, total
    for k in range(1, 20):
        a *= (mu - (2 * k - 1) ** 2) / (8.0 * k)
        power = power.mul(inv)
        total = total.add(power.mul(a))
    asym = total.mul(xb.reciprocal().mul(math.pi / 2).sqrt())
    if not scaled:
        asym = asym.mul(_exp(neg(xb)))
    out = where(big, asym, ser)
    return where(eq(x, math.inf), 0.0, out)


def _signed(fn_pos: Tensor, x: Tensor, odd: bool) -> Tensor:
    return where(lt(x, 0.0), neg(fn_pos), fn_pos) if odd else fn_pos


def _j(n: int):  # noqa: ANN202
    def fn(x: Tensor) -> Tensor:
        out = _signed(_jy(abs(x), n, False), x, n == 1)
        return where(isnan(x), math.nan, out)

    return fn


def _y(n: int):  # noqa: ANN202
    def fn(x: Tensor) -> Tensor:
        out = _jy(where(lt(x, 0.0), 1.0, x), n, True)
        out = where(eq(x, 0.0), -math.inf, out)
        return where(lt(x, 0.0).logical_or(isnan(x)), math.nan, out)

    return fn


def _kfn(n: int, scaled: bool):  # noqa: ANN202
    def fn(x: Tensor) -> Tensor:
        out = _k(where(lt(x, 0.0), 1.0, x), n, scaled)
        out = where(eq(x, 0.0), math.inf, out)
        return where(lt(x, 0.0).logical_or(isnan(x)), math.nan, out)

    return fn


_AI0 = 0.355028053887817239260  # Ai(0)
_AIP0 = 0.258819403792806798405  # -Ai'(0)


def _airy(x: Tensor) -> Tensor:
    """Ai(x): Maclaurin series on [-7, 6], the decaying expansion above, the oscillating one
    below."""
    inside = lt(_AI_LO, x).logical_and(lt(x, _AI_HI)).logical_or(eq(x, _AI_LO))
    xs = where(inside, x, 0.0)
    x3 = xs.mul(xs).mul(xs)
    f = xs._const(1.0).expand(xs.shape)
    g = xs
    tf, tg = f, g
    for k in range(1, 32):  # terms ~ (|x|^3/9)^k / k!^2: 1e-18 at |x| = 7
        tf = tf.mul(x3).mul(1.0 / ((3 * k - 1) * 3 * k))
        tg = tg.mul(x3).mul(1.0 / (3 * k * (3 * k + 1)))
        f, g = f.add(tf), g.add(tg)
    ser = f.mul(_AI0).add(g.mul(-_AIP0))
    # A&S 10.4.58: u_k = Gamma(3k+1/2) / (54^k k! Gamma(k+1/2)), by its term ratio
    u = [1.0]
    for k in range(1, 24):
        u.append(u[-1] * (6 * k - 5) * (6 * k - 3) * (6 * k - 1) / (216.0 * k * (2 * k - 1)))
    pos = lt(_AI_HI, x).logical_or(eq(x, _AI_HI))
    xp = where(pos, x, _AI_HI)
    zp = xp.sqrt().mul(xp).mul(2.0 / 3.0)
    inv = zp.reciprocal()
    tot, power = zp._const(1.0).expand(zp.shape), None
    for k in range(1, 16):
        power = inv if power is None else power.mul(inv)
        tot = tot.add(power.mul(u[k] * (-1.0) ** k))
    hi = tot.mul(_exp(neg(zp))).mul(xp.sqrt().sqrt().mul(2.0 * math.sqrt(math.pi)).reciprocal())
    neg_side = lt(x, _AI_LO)
    xn = where(neg_side, neg(x), -_AI_LO)
    zn = xn.sqrt().mul(xn).mul(2.0 / 3.0)
    invn = zn.reciprocal()
    p = zn._const(1.0).expand(zn.shape)
    q = invn.mul(u[1])
    power = invn
    for k in range(2, 24):
        power = power.mul(invn)
        t = power.mul(u[k] * (-1.0) ** (k // 2))
        if k % 2:
            q = q.add(t)
        else:
            p = p.add(t)
    c = zn.add(math.pi / 4)
    lo = p.mul(c.sin()).add(q.mul(c.add(math.pi / 2).sin()).mul(-1.0))
    lo = lo.mul(xn.sqrt().sqrt().mul(math.sqrt(math.pi)).reciprocal())
    out = where(inside, ser, where(pos, hi, lo))
    return where(isnan(x).logical_or(eq(abs(x), math.inf)), math.nan, out)  # as PyTorch


def bessel_j0(input: Tensor) -> Tensor:  # noqa: A002
    return _f64(_j(0))(input)


def bessel_j1(input: Tensor) -> Tensor:  # noqa: A002
    return _f64(_j(1))(input)


def bessel_y0(input: Tensor) -> Tensor:  # noqa: A002
    return _f64(_y(0))(input)


def bessel_y1(input: Tensor) -> Tensor:  # noqa: A002
    return _f64(_y(1))(input)


def modified_bessel_k0(input: Tensor) -> Tensor:  # noqa: A002
    return _f64(_kfn(0, False))(input)


def modified_bessel_k1(input: Tensor) -> Tensor:  # noqa: A002
    return _f64(_kfn(1, False))(input)


def scaled_modified_bessel_k0(input: Tensor) -> Tensor:  # noqa: A002
    return _f64(_kfn(0, True))(input)


def scaled_modified_bessel_k1(input: Tensor) -> Tensor:  # noqa: A002
    return _f64(_kfn(1, True))(input)


def airy_ai(input: Tensor) -> Tensor:  # noqa: A002
    return _f64(_airy)(input)
