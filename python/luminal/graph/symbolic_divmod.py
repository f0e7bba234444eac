"""Floor division and floor modulo of symbolic expressions, simplified: whole multiples of
the divisor leave the quotient, a remainder proven within one multiple is dropped, and a
divisor that is a product or a merged dim is taken apart so a reshape's index stays affine."""

from __future__ import annotations

from math import gcd

from .symbolic_bounds import lower_bound, prove_lt, prove_nonneg, upper_bound
from .symbolic_expr import (
    _BUILDERS,
    Expr,
    _from_lin,
    _is_multiple_of,
    _lin,
    _mk,
    _split_multiples,
    add,
    mul,
    sint,
)
from .symbolic_text import ADD, DIV, MOD, divmods


def floordiv(a: sint, b: sint) -> sint:
    if isinstance(b, int):
        if b == 0:
            raise ZeroDivisionError(f"symbolic floor division of {a} by zero")
        if isinstance(a, int):
            return a // b
        if b == 1:
            return a
        if b < 0:
            return floordiv(mul(a, -1), -b)
    # a symbolic divisor whose range includes 0 is allowed (sizes of empty tensors); the
    # runtime's checked evaluator reports an actual division by zero
    if isinstance(a, int) and a == 0:
        return 0
    if isinstance(b, Expr) and a is b:
        return 1
    q, r = _split_multiples(a, b)
    if isinstance(b, int):
        # cancel a common factor: (g*x) // (g*c) == x // c
        rt, rconst = _lin(r)
        g = gcd(b, rconst, *rt.values())
        if g > 1:
            r = _from_lin({t: c // g for t, c in rt.items()}, rconst // g)
            b = b // g
            if b == 1:
                return add(q, r)
    if prove_nonneg(r) and prove_lt(r, b):
        return q
    if (k := _one_multiple(r, b)) is not None:
        return add(q, k)
    if (peel := _peel_small(r, b)) is not None:
        big, _, gp = peel  # r == gp*big + small, 0 <= small < gp, gp | b
        return add(q, floordiv(big, _exact_div(b, gp)))
    if isinstance(r, Expr) and isinstance(b, int) and r.kind == DIV and isinstance(r.args[1], int):
        return add(q, floordiv(r.args[0], r.args[1] * b))
    if (nested := _nested_div(r, b)) is not None:
        return add(q, nested)
    if isinstance(r, int):
        return add(q, r // b) if isinstance(b, int) else add(q, _div_raw(r, b))
    if (split := _by_coefficient(r, b)) is not None:
        return add(q, floordiv(split[0], split[1]))
    if (factor := _by_poly_factor(r, b)) is not None:
        return add(q, floordiv(factor[0], factor[2]))
    return add(q, _div_raw(r, b))


def _nested_div(r: sint, b: sint) -> sint | None:
    """(x // c + k) // b as (x + k*c) // (c*b) (positive int divisors): strided windows'
    output sizes nest so, ((s + 3) // 4 + 1) // 2, and torch writes the same size as
    (s + 7) // 8, which must compare equal."""
    if not isinstance(r, Expr) or not isinstance(b, int) or r.kind != ADD:
        return None
    terms, k = _lin(r)
    if len(terms) != 1:
        return None
    ((t, coef),) = terms.items()
    if coef != 1 or t.kind != DIV or not isinstance(t.args[1], int) or t.args[1] <= 0:
        return None
    c = t.args[1]
    return floordiv(add(t.args[0], k * c), c * b)


def _one_multiple(r: sint, b: sint) -> int | None:
    """k when ``k*b <= r < (k+1)*b`` everywhere (b a positive int): the split keeps a
    constant's remainder in r, so 32*h + k - 16 over 128 is (32*h + k + 112) // 128 - 1,
    which is 0 when 16 <= k."""
    if not isinstance(b, int) or b <= 0 or isinstance(r, int):
        return None
    k = r.lo // b
    return k if r.hi // b == k else None


def _by_coefficient(r: sint, b: sint) -> tuple[sint, sint] | None:
    """(r // c, m) when ``b`` is a monomial c*m (c > 1 an int, m >= 1) and r // c simplifies
    (no division left at its top): r // (c*m) == (r // c) // m for positive divisors. A
    reshape of (b, s, d) to (b*s, d) with symbolic s reads (1024*i + j) // (1024*s), which is
    i // s when j < 1024."""
    if not isinstance(b, Expr):
        return None
    bterms, bconst = _lin(b)
    if bconst != 0 or len(bterms) != 1:
        return None
    ((m, c),) = bterms.items()
    if c <= 1 or m.lo < 1:
        return None
    inner = floordiv(r, c)
    if isinstance(inner, Expr) and inner.kind == DIV:
        return None
    return inner, m


def _by_poly_factor(r: sint, b: sint) -> tuple[sint, sint, int] | None:
    """(r // p, p, e) when ``b`` is a polynomial e*p (e > 1 an int dividing all of b's
    coefficients and constant, p >= 1) and r // p simplifies (no division left in it):
    r // (e*p) == (r // p) // e. Grouped-query attention reads its KV cache of past + 1
    positions at (32*(p + 1)*h + j) // (64*(p + 1)), which is h // 2 when j < 32*(p + 1)."""
    if not isinstance(b, Expr) or b.lo < 1:
        return None
    bterms, bconst = _lin(b)
    if len(bterms) + (bconst != 0) < 2:
        return None  # a monomial: _by_coefficient
    g = gcd(bconst, *bterms.values())
    for e in range(2, g + 1):
        if g % e:
            continue
        p = _from_lin({t: c // e for t, c in bterms.items()}, bconst // e)
        inner = floordiv(r, p)
        if not _divides_by(inner, p):
            return inner, p, e
    return None


def _divides_by(e: sint, d: sint) -> bool:
    """Whether ``e`` holds a floor division or modulo by ``d``."""
    return any(x.args[1] == d for x in divmods(e))


def _peel_small(r: sint, b: sint) -> tuple[sint, sint, sint] | None:
    """r == g*big + small with g | b and 0 <= small < g: then r // b == big // (b/g) and
    r % b == g*(big % (b/g)) + small. This makes a split loop index affine again:
    (16*ro + ri) // 32 == ro // 2 when 0 <= ri < 16. ``b`` is an int or a monomial c*m (a
    merged symbolic dim: (64*s*h + 64*i + d) // (192*s) == h // 3 when 64*i + d < 64*s)."""
    terms, const = _lin(r)
    if len(terms) < 2:
        return None
    if isinstance(b, int):
        if b <= 1:
            return None
        bc, bm = b, None
    else:
        bterms, bconst = _lin(b)
        if bconst != 0 or len(bterms) != 1:
            return None
        ((bm, bc),) = bterms.items()
        if bc <= 0:
            return None
    # per term: (the term divided by the divisor's monomial part, coefficient) where it is a
    # multiple of that part
    over: dict[Expr, tuple[sint, int]] = {}
    for t, c in terms.items():
        if bm is None:
            over[t] = (t, c)
        elif t is bm:
            over[t] = (1, c)
        elif (rest := _is_multiple_of(t, bm)) is not None:
            over[t] = (rest, c)
    for gc in sorted({gcd(c, bc) for _, c in over.values()}, reverse=True):
        if bm is None and gc in (1, bc):
            continue  # g must be a proper divisor of an int b (g == b: nothing to peel)
        big_t = {t: (x, c // gc) for t, (x, c) in over.items() if c % gc == 0}
        if not big_t or len(big_t) == len(terms):
            continue
        g: sint = gc if bm is None else mul(bm, gc)
        small_c = const % gc if bm is None else const
        big_c = const // gc if bm is None else 0
        small = _from_lin({t: c for t, c in terms.items() if t not in big_t}, small_c)
        if prove_nonneg(small) and prove_lt(small, g):
            big: sint = big_c
            for x, c in big_t.values():
                big = add(big, mul(x, c))
            return big, small, g
    if bm is not None:
        # an int part g of a monomial divisor: (512*w + 32*i + j) // (2048*s*s) is
        # w // (4*s*s) when 32*i + j < 512 (a window partition's row over symbolic windows)
        for gc in sorted({gcd(c, bc) for c in terms.values()} - {1}, reverse=True):
            big_i = {t: c // gc for t, c in terms.items() if c % gc == 0}
            if not big_i or len(big_i) == len(terms):
                continue
            small = _from_lin({t: c for t, c in terms.items() if t not in big_i}, const % gc)
            if prove_nonneg(small) and prove_lt(small, gc):
                return _from_lin(big_i, const // gc), small, gc
    return None


def _exact_div(b: sint, g: sint) -> sint:
    """b / g for a divisor g that _peel_small took from b (an int, or g = m*gc or an int gc
    for b = m*bc)."""
    if isinstance(b, int) and isinstance(g, int):
        return b // g
    if isinstance(g, int):  # an int part of a monomial: b / g is a monomial again
        ((bm, bc),) = _lin(b)[0].items()
        return mul(bm, bc // g)
    ((_, bc),) = _lin(b)[0].items()
    gt, _ = _lin(g)
    ((_, gc),) = gt.items()
    return bc // gc


def _div_raw(a: sint, b: sint) -> sint:
    bl, bh = lower_bound(b), upper_bound(b)
    al, ah = lower_bound(a), upper_bound(a)
    if bl > 0:
        c = [al // bl, al // bh, ah // bl, ah // bh]
        lo, hi = min(c), max(c)
    elif bl == 0 and al >= 0:
        lo, hi = 0, ah  # the quotient exists only for a divisor of at least 1
    else:
        m = max(abs(al), abs(ah))
        lo, hi = -m, m
    if lo == hi:
        return lo
    return _mk(DIV, a, b, lo, hi)


def mod(a: sint, b: sint) -> sint:
    if isinstance(b, int):
        if b == 0:
            raise ZeroDivisionError(f"symbolic modulo of {a} by zero")
        if isinstance(a, int):
            return a % b
        if b == 1:
            return 0
    if isinstance(a, Expr) and a is b:
        return 0
    _, r = _split_multiples(a, b)
    if prove_nonneg(r) and prove_lt(r, b):
        return r
    if (k := _one_multiple(r, b)) is not None:
        return add(r, -k * b)
    if isinstance(r, int):
        return r % b if isinstance(b, int) else _mod_raw(r, b)
    if (peel := _peel_small(r, b)) is not None:
        big, small, g = peel
        return add(mul(mod(big, _exact_div(b, g)), g), small)
    if isinstance(b, int) and isinstance(r, Expr):
        # (k*(y % m) + z) % b == (k*y + z) % b where b divides m: (-(n % 4)) % 4, a pad up
        # to a multiple, is (-n) % 4, which n + (-n) % 4 then folds into a multiple of 4
        rt, rc = _lin(r)
        mods = {t for t in rt if t.kind == MOD and isinstance(t.args[1], int)
                and t.args[1] % b == 0}  # fmt: skip
        if mods:
            whole: sint = rc
            for t, c in rt.items():
                whole = add(whole, mul(t.args[0] if t in mods else t, c))
            return mod(whole, b)
    if (split := _by_coefficient(r, b)) is not None:
        # r % (c*m) == c*((r // c) % m) + r % c
        cb = _exact_div(b, split[1])
        return add(mul(mod(split[0], split[1]), cb), mod(r, cb))
    if (factor := _by_poly_factor(r, b)) is not None:
        # r % (e*p) == p*((r // p) % e) + r % p
        inner, p, e = factor
        return add(mul(mod(inner, e), p), mod(r, p))
    return _mod_raw(r, b)


def _mod_raw(a: sint, b: sint) -> sint:
    bl, bh = lower_bound(b), upper_bound(b)
    return _mk(MOD, a, b, min(0, bl + 1), max(0, bh - 1))


def ceildiv(a: sint, b: sint) -> sint:
    return floordiv(add(a, add(b, -1)), b)


_BUILDERS.update({DIV: floordiv, MOD: mod})
