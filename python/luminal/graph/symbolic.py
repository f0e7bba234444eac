"""Symbolic integer expressions for shapes, strides and index arithmetic.

An ``Expr`` is immutable and hash-consed: building the same expression twice gives the same
object, so ``is``/``==`` is structural equality and expressions are cheap dictionary keys.
Public combinators take and return ``sint`` (``int | Expr``): a result that simplifies to a
constant comes back as a plain ``int``, so concrete shapes stay ordinary Python ints.

Every expression carries integer interval bounds ``lo <= value <= hi``. Index variables also
carry a symbolic extent (``0 <= i < extent``) so that ``(i0 * seq + i1) // seq`` simplifies to
``i0`` even though ``seq`` is not a number.

Semantics: ``//`` and ``%`` are floor division and floor modulo (Python's), ``lt``/``eq``
give 0 or 1. Expressions render to C and serialize to the postfix programs of the plan format.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from math import gcd
from typing import Any

from .symbolic_text import (  # the kinds and writing expressions out
    ADD,
    DIV,
    EQ,
    LT,
    MAX,
    MIN,
    MOD,
    MUL,
    VAR,
    divmods,
    render,
    to_postfix,
)
from .symbolic_text import (
    evaluate as evaluate,
)
from .symbolic_text import (
    fingerprint as fingerprint,
)

DEFAULT_DIM_MAX = 2**31 - 1

_INTERN: dict[tuple, Expr] = {}


class Expr:
    """A non-constant symbolic integer expression. Build with the module's combinators."""

    __slots__ = ("kind", "args", "lo", "hi", "skey", "_hash", "_vars", "__weakref__")

    kind: str
    args: tuple
    lo: int
    hi: int
    skey: tuple
    _hash: int
    _vars: frozenset[Expr] | None

    def __new__(cls, kind: str, args: tuple, lo: int, hi: int) -> Expr:
        key = (kind, args)
        hit = _INTERN.get(key)
        if hit is not None:
            return hit
        self = object.__new__(cls)
        self.kind, self.args, self.lo, self.hi = kind, args, lo, hi
        self.skey = _sort_key(kind, args)
        self._vars = None
        self._hash = hash(key)
        _INTERN[key] = self
        return self

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple:
        return (_rebuild, (self.kind, self.args))

    def __bool__(self) -> bool:
        raise TypeError(f"the truth value of symbolic expression {self} is not known at build time")

    # arithmetic operators build expressions
    def __add__(self, o: sint) -> sint:
        return add(self, o)

    __radd__ = __add__

    def __sub__(self, o: sint) -> sint:
        return add(self, mul(o, -1))

    def __rsub__(self, o: sint) -> sint:
        return add(o, mul(self, -1))

    def __mul__(self, o: sint) -> sint:
        return mul(self, o)

    __rmul__ = __mul__

    def __neg__(self) -> sint:
        return mul(self, -1)

    def __floordiv__(self, o: sint) -> sint:
        return floordiv(self, o)

    def __rfloordiv__(self, o: sint) -> sint:
        return floordiv(o, self)

    def __mod__(self, o: sint) -> sint:
        return mod(self, o)

    def __rmod__(self, o: sint) -> sint:
        return mod(o, self)

    def __lt__(self, o: sint) -> sint:
        return lt(self, o)

    def __repr__(self) -> str:
        return render(self, lambda v: v.args[0], style="py")

    @property
    def name(self) -> str:
        if self.kind != VAR:
            raise TypeError(f"{self} is not a variable")
        return str(self.args[0])

    @property
    def extent(self) -> sint | None:
        """For index variables: the exclusive upper bound (``0 <= var < extent``)."""
        return self.args[3] if self.kind == VAR else None

    def vars(self) -> set[Expr]:
        return set(_vars_of(self))

    def to_postfix(self, dim_index: Mapping[str, int]) -> list[tuple[int, int]]:
        return to_postfix(self, dim_index)


sint = int | Expr


def _rebuild(kind: str, args: tuple) -> sint:
    return _BUILDERS[kind](*args) if kind != VAR else var(*args)


def _key(x: Any) -> tuple:
    if isinstance(x, Expr):
        return x.skey
    if isinstance(x, tuple):
        return (9, tuple(_key(a) for a in x))
    return (0, x) if isinstance(x, int) else (1, str(x))


_KIND_RANK = {VAR: 1, ADD: 2, MUL: 3, DIV: 4, MOD: 5, MIN: 6, MAX: 7, LT: 8, EQ: 9}


def _sort_key(kind: str, args: tuple) -> tuple:
    if kind == VAR:
        return (1, args[0], args[1], args[2])
    return (_KIND_RANK[kind], tuple(_key(a) for a in args))


def _vars_of(e: Any) -> frozenset[Expr]:
    """Variables of an expression, cached per node (expressions are DAGs: no re-walks)."""
    if isinstance(e, Expr):
        if e._vars is None:
            if e.kind == VAR:
                e._vars = frozenset({e}) | _vars_of(e.args[3])
            else:
                e._vars = frozenset().union(*(_vars_of(a) for a in e.args))
        return e._vars
    if isinstance(e, tuple):
        return frozenset().union(*(_vars_of(a) for a in e))
    return frozenset()


# ----------------------------------------------------------------------------- constructors


def var(name: str, lo: int = 0, hi: int = DEFAULT_DIM_MAX, extent: sint | None = None) -> Expr:
    """A named integer variable with bounds ``lo <= name <= hi``.

    ``extent`` marks an index variable: ``0 <= name < extent`` (``extent`` may be symbolic).
    """
    if lo > hi:
        raise ValueError(f"variable {name!r}: empty range [{lo}, {hi}]")
    return Expr(VAR, (name, int(lo), int(hi), extent), int(lo), int(hi))


def dim(name: str, min: int = 1, max: int = DEFAULT_DIM_MAX) -> Expr:  # noqa: A002
    """A symbolic dimension such as ``seq`` with its declared range (inclusive)."""
    if not name.isidentifier():
        raise ValueError(f"dim name must be an identifier, got {name!r}")
    if min < 0:
        raise ValueError(f"dim {name!r}: min must be >= 0, got {min}")
    return var(name, min, max)


def index_var(k: int, extent: sint) -> sint:
    """The k-th index variable of a loop over ``range(extent)``; 0 when the extent is 1."""
    if isinstance(extent, int):
        if extent <= 1:
            return 0
        return var(f"_i{k}", 0, extent - 1, extent)
    return var(f"_i{k}", 0, max(extent.hi - 1, 0), extent)


def _lin(x: sint) -> tuple[dict[Expr, int], int]:
    """Linear form of x: ({term: coef}, const)."""
    if isinstance(x, int):
        return {}, x
    if x.kind == ADD:
        return dict(x.args[0]), x.args[1]
    return {x: 1}, 0


def _fold_divmod(terms: dict[Expr, int]) -> int:
    """k*c*(x // c) + k*(x % c) == k*x: undo the split a reshape of a merged dim makes (and
    k*(x % c) + k*c*((x // c) % m) == k*(x % (c*m)) for the inner axes of a longer split).
    Folds in place, to a fixpoint (a fold can enable another: 9*(r//9) + 3*((r//3)%3) + r%3
    is 3*(r//3) + r%3, then r), and returns the constant to add. ``x // c`` is looked up as
    the simplifier builds it ((r//3)//3 is r//9); a symbolic c's term is the product c*(x//c)."""
    extra = 0
    changed = True
    while changed:
        changed = False
        for t in [t for t in terms if t.kind == MOD and terms.get(t, 0)]:
            x, c = t.args
            k = terms[t]
            if isinstance(c, int) and c > 0 and isinstance(x, Expr):
                # k*(x % c) - k*x == -k*c*(x // c): a dim padded up to a multiple of c,
                # n + (-n % c), is c times a whole number of blocks
                tx, cx = _lin(x)
                if all(terms.get(w) == -k * cw for w, cw in tx.items()):
                    del terms[t]
                    for w in tx:
                        del terms[w]
                    q = floordiv(x, c)
                    for w, cw in _lin(q)[0].items():
                        terms[w] = terms.get(w, 0) - k * c * cw
                        if terms[w] == 0:
                            del terms[w]
                    extra += k * cx - k * c * _lin(q)[1]
                    changed = True
                    break
            d: sint | None = _INTERN.get((DIV, (x, c)))
            quot = d
            if isinstance(c, Expr):
                # c*(x // c) as a term and its coefficient (64*s*(x//(64*s)): 64 on s*(x//..))
                cd = _lin(mul(c, d)) if d is not None else ({}, 1)
                one = len(cd[0]) == 1 and cd[1] == 0
                d, want = next(iter(cd[0].items())) if one else (None, 0)
                want *= k
            else:
                if d is None and isinstance(x, Expr) and x.kind == DIV:
                    d = floordiv(x, c)
                want = c * k
            if not isinstance(d, Expr):
                continue
            if terms.get(d) != want:
                # k*(x % c) + k*c*((x // c) % m) == k*(x % (c*m)): one axis of a split dim
                # merged back (a reshape round trip through more axes)
                if isinstance(c, int):
                    u = next((u for u in terms if u.kind == MOD and u.args[0] is d
                              and terms[u] == want), None)  # fmt: skip
                    m: sint = u.args[1] if u is not None else 0
                else:
                    u, m = _scaled_mod_of(terms, c, quot, k)
                if u is None:
                    continue
                del terms[t], terms[u]
                merged = mod(x, mul(c, m))
                for v, cv in _lin(merged)[0].items():
                    terms[v] = terms.get(v, 0) + cv * k
                    if terms[v] == 0:
                        del terms[v]
                extra += _lin(merged)[1] * k
                changed = True
                break
            del terms[t], terms[d]
            tx, cx = _lin(x)
            for u, cu in tx.items():
                terms[u] = terms.get(u, 0) + cu * k
                if terms[u] == 0:
                    del terms[u]
            extra += cx * k
            changed = True
            break
    return extra


def _scaled_mod_of(
    terms: dict[Expr, int], c: Expr, quot: sint | None, k: int
) -> tuple[Expr | None, sint]:
    """(u, m) for a term u of ``terms`` that is k*c*(quot % m) (a symbolic c), else None."""
    if not isinstance(quot, Expr):
        return None, 0
    for u, cu in terms.items():
        if u.kind != MUL or not cu:
            continue
        f = next((f for f in _factors(u) if f.kind == MOD and f.args[0] is quot), None)
        if f is not None and _lin(mul(c, f)) == ({u: cu // k}, 0) and cu % k == 0:
            return u, f.args[1]
    return None, 0


def _from_lin(terms: Mapping[Expr, int], const: int) -> sint:
    if any(t.kind == MOD for t in terms):
        terms = dict(terms)
        const += _fold_divmod(terms)
    items = tuple(sorted(((t, c) for t, c in terms.items() if c != 0), key=lambda tc: tc[0].skey))
    if not items:
        return const
    if const == 0 and len(items) == 1 and items[0][1] == 1:
        return items[0][0]
    lo = hi = const
    for t, c in items:
        a, b = t.lo * c, t.hi * c
        lo, hi = lo + min(a, b), hi + max(a, b)
    return Expr(ADD, (items, const), lo, hi)


# results of add and mul by their operands: expressions are interned and never change, and
# lowering and the search build the same sums and products many times (a model's layers).
# Cleared past MEMO_MAX entries.
MEMO_MAX = 1 << 20
_ADD: dict[tuple[sint, sint], sint] = {}
_MUL: dict[tuple[sint, sint], sint] = {}


def _memoized(table: dict[tuple[sint, sint], sint], fn: Callable[[sint, sint], sint],
              a: sint, b: sint) -> sint:  # fmt: skip
    hit = table.get((a, b))
    if hit is None:
        if len(table) > MEMO_MAX:
            table.clear()
        hit = table[(a, b)] = fn(a, b)
    return hit


def add(a: sint, b: sint) -> sint:
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    return _memoized(_ADD, _add, a, b)


def _add(a: sint, b: sint) -> sint:
    ta, ca = _lin(a)
    tb, cb = _lin(b)
    for t, c in tb.items():
        ta[t] = ta.get(t, 0) + c
    return _from_lin(ta, ca + cb)


def _factors(x: Expr) -> list[Expr]:
    return list(x.args) if x.kind == MUL else [x]


def _mul_terms(a: Expr, b: Expr) -> Expr:
    fs = sorted(_factors(a) + _factors(b), key=lambda f: f.skey)
    corners = []
    lo, hi = fs[0].lo, fs[0].hi
    for f in fs[1:]:
        corners = [lo * f.lo, lo * f.hi, hi * f.lo, hi * f.hi]
        lo, hi = min(corners), max(corners)
    return Expr(MUL, tuple(fs), lo, hi)


def mul(a: sint, b: sint) -> sint:
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    return _memoized(_MUL, _mul, a, b)


def _mul(a: sint, b: sint) -> sint:
    if isinstance(a, int):
        a, b = b, a
    assert isinstance(a, Expr)
    if isinstance(b, int):
        if b == 0:
            return 0
        ta, ca = _lin(a)
        return _from_lin({t: c * b for t, c in ta.items()}, ca * b)
    # distribute products of linear forms (expressions here are small)
    ta, ca = _lin(a)
    tb, cb = _lin(b)
    out: dict[Expr, int] = {}
    for t, c in ta.items():
        out[t] = out.get(t, 0) + c * cb
    for t, c in tb.items():
        out[t] = out.get(t, 0) + c * ca
    for t1, c1 in ta.items():
        for t2, c2 in tb.items():
            p = _mul_terms(t1, t2)
            out[p] = out.get(p, 0) + c1 * c2
    return _from_lin(out, ca * cb)


def _is_multiple_of(term: Expr, d: Expr) -> Expr | None:
    """term / d when the product ``term`` has ``d``'s factors among its own, else None."""
    tf, df = _factors(term), _factors(d)
    rest = list(tf)
    for f in df:
        if f in rest:
            rest.remove(f)
        else:
            return None
    if not rest:
        return None  # term == d: handled by the caller as coefficient
    out: sint = rest[0]
    for f in rest[1:]:
        out = mul(out, f)
    return out if isinstance(out, Expr) else None


def sym_upper(x: sint) -> sint:
    """A symbolic upper bound of x, using index variables' extents (``i < extent``)."""
    if isinstance(x, int):
        return x
    if x.kind == VAR:
        return x if x.args[3] is None else add(x.args[3], -1)
    if x.kind == ADD:
        out: sint = x.args[1]
        for t, c in x.args[0]:
            if c > 0 and (q := _floor_multiple(t, c)) is not None:
                out = add(out, mul(sym_upper(q[0]), q[1]))  # c*(y//d) <= (c/d)*y
            else:
                out = add(out, mul(sym_upper(t) if c > 0 else sym_lower(t), c))
        return out
    if x.kind == MUL and all(f.lo >= 0 for f in x.args):
        out = 1
        for f in x.args:
            out = mul(out, sym_upper(f))
        return out
    if x.kind == MOD and isinstance(x.args[1], Expr) and lower_bound(x.args[0]) >= 0:
        return add(x.args[1], -1)
    if x.kind == DIV and isinstance(x.args[1], int) and x.args[1] > 0:
        return floordiv(sym_upper(x.args[0]), x.args[1])
    if x.kind == DIV:
        # y // d <= upper(y) // d for a divisor d >= 1 (a quotient is evaluated only where its
        # divisor is nonzero): a group's channel, i // (4*s*s) with i < 32*s*s, is below 8
        whole, rest = _split_multiples(sym_upper(x.args[0]), x.args[1])
        if isinstance(rest, int) and rest < 0:
            return add(whole, -1)
        if isinstance(rest, int) and rest == 0:
            return whole
    return x.hi


def sym_lower(x: sint) -> sint:
    """A symbolic lower bound of x: index variables at 0, dims as themselves."""
    if isinstance(x, int):
        return x
    if x.kind == VAR:
        return x if x.args[3] is None else x.lo
    if x.kind == ADD:
        out: sint = x.args[1]
        for t, c in x.args[0]:
            if c < 0 and (q := _floor_multiple(t, c)) is not None:
                out = add(out, mul(sym_upper(q[0]), q[1]))  # -c*(y//d) >= -(c/d)*y
            elif c < -1 and (up := _floor_fraction(t, -c)) is not None:
                # c*(y//d) >= -(y//(d/-c)): a size halved twice against one halved once
                out = add(out, mul(up, -1))
            else:
                out = add(out, mul(sym_lower(t) if c > 0 else sym_upper(t), c))
        return out
    if x.kind == DIV and isinstance(x.args[1], int) and x.args[1] > 0:
        return floordiv(sym_lower(x.args[0]), x.args[1])
    if x.kind == MUL and all(f.lo >= 0 for f in x.args):
        out = 1
        for f in x.args:
            out = mul(out, sym_lower(f))
        return out
    return x.lo


def _floor_multiple(t: Expr, c: int) -> tuple[sint, int] | None:
    """(y, c // d) when the term ``c * t`` is ``c * (y // d)`` with d dividing c, else None."""
    if t.kind == DIV and isinstance(t.args[1], int) and t.args[1] > 0 and c % t.args[1] == 0:
        return t.args[0], c // t.args[1]
    return None


def _floor_fraction(t: Expr, c: int) -> sint | None:
    """An upper bound of ``c * t`` (c > 0) when ``t`` is ``y // d`` with c dividing d, or
    such a quotient times nonnegative factors: ``c * (y // d) <= y // (d // c)`` for every
    integer y, so ``c * t <= upper(y) // (d // c) * upper(the other factors)``."""
    factors = list(t.args) if t.kind == MUL else [t]
    # of several quotients, the one of the largest divisor (the size halved most often)
    fit = [(f.args[1], k) for k, f in enumerate(factors)
           if isinstance(f, Expr) and f.kind == DIV and isinstance(f.args[1], int)
           and f.args[1] > 0 and f.args[1] % c == 0]  # fmt: skip
    if not fit:
        return None
    k = max(fit)[1]
    f, rest = factors[k], factors[:k] + factors[k + 1 :]
    if any(isinstance(g, Expr) and g.lo < 0 for g in rest):
        return None
    out = floordiv(sym_upper(f.args[0]), f.args[1] // c)
    for g in rest:
        out = mul(out, sym_upper(g))
    return out


def lower_bound(x: sint) -> int:
    return x if isinstance(x, int) else x.lo


def upper_bound(x: sint) -> int:
    return x if isinstance(x, int) else x.hi


def prove_nonneg(x: sint) -> bool:
    """True when x >= 0 is provable (interval or symbolic bounds)."""
    if lower_bound(x) >= 0:
        return True
    return lower_bound(sym_lower(x)) >= 0


def prove_lt(a: sint, b: sint) -> bool:
    """True when a < b is provable for every value of the variables."""
    d = add(b, mul(a, -1))
    if lower_bound(d) >= 1:
        return True
    return prove_nonneg(add(add(b, mul(sym_upper(a), -1)), -1))


def _split_multiples(a: sint, d: sint) -> tuple[sint, sint]:
    """a == d * q + r, with as much as possible moved into q (exact, no bounds needed)."""
    terms, const = _lin(a)
    q: dict[Expr, int] = {}
    r: dict[Expr, int] = {}
    qc, rc = 0, const
    if isinstance(d, int):
        for t, c in terms.items():
            if c % d == 0:
                q[t] = c // d
            else:
                r[t] = c
        qc, rc = const // d, const % d
        return _from_lin(q, qc), _from_lin(r, rc)
    # d == dc * dm with dm a single monomial: a term k*t is a multiple when dc | k and dm | t
    dterms, dconst = _lin(d)
    if not dterms:
        return 0, a
    if dconst != 0 or len(dterms) > 1:
        return _split_poly(terms, const, dterms, dconst)
    ((dm, dc),) = dterms.items()
    for t, c in terms.items():
        if c % dc:
            r[t] = c
        elif t is dm:
            qc += c // dc
        elif (rest := _is_multiple_of(t, dm)) is not None:
            q[rest] = q.get(rest, 0) + c // dc
        else:
            r[t] = c
    return _from_lin(q, qc), _from_lin(r, rc)


def _split_poly(
    terms: dict[Expr, int], const: int, dterms: dict[Expr, int], dconst: int = 0
) -> tuple[sint, sint]:
    """a == d*q + r for a divisor with several terms (a merged symbolic extent such as
    pos + seq, or a KV cache's past + 1): whole multiples u*d whose every term appears in
    ``a`` with exactly the right coefficient move into q. 3*i*s*(p + s) + j over (p + s) gives
    q = 3*i*s; 32*h*p + 32*h + 32*j + k over 32*p + 32 gives q = h. A constant multiple k*d
    takes k*dconst from a's constant when it has that much."""
    rest = dict(terms)
    q: dict[Expr, int] = {}
    qc, rc = 0, const
    lead = min(dterms, key=lambda t: t.skey)
    c0 = dterms[lead]
    for t in sorted(terms, key=lambda t: t.skey):
        c = rest.get(t)
        if c is None or c % c0:
            continue
        u: Expr | None = None if t is lead else _is_multiple_of(t, lead)
        if u is None and t is not lead:
            continue
        k = c // c0
        if u is None and not 0 <= k * dconst <= rc:
            continue  # a's constant lacks k*dconst: r would go negative
        need: dict[Expr, int] = {}
        # the products u * (each term of d), and u * dconst when u is a term
        parts: list[tuple[sint, int]] = [
            (m if u is None else mul(u, m), cm) for m, cm in dterms.items()
        ]
        if dconst and u is not None:
            parts.append((u, dconst))
        for prod, cm in parts:
            pt, pc = _lin(prod)
            if pc != 0 or len(pt) != 1:
                break
            ((key, coef),) = pt.items()
            need[key] = need.get(key, 0) + coef * cm * k
        else:
            if all(rest.get(key) == v for key, v in need.items()):
                for key in need:
                    del rest[key]
                if u is None:
                    qc += k
                    rc -= k * dconst
                else:
                    q[u] = q.get(u, 0) + k
    return _from_lin(q, qc), _from_lin(rest, rc)


def _mk(kind: str, a: sint, b: sint, lo: int, hi: int) -> Expr:
    return Expr(kind, (a, b), lo, hi)


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


def minimum(a: sint, b: sint) -> sint:
    return _extremum(MIN, a, b)


def maximum(a: sint, b: sint) -> sint:
    return _extremum(MAX, a, b)


def _operands(kind: str, x: sint) -> list[sint]:
    return [o for a in x.args for o in _operands(kind, a)] if isinstance(x, Expr) and (
        x.kind == kind
    ) else [x]  # fmt: skip


def _extremum(kind: str, a: sint, b: sint) -> sint:
    """min or max of ``a`` and ``b`` with nested operands of the same kind flattened: repeats
    and operands another one provably dominates are dropped (a memory slot's size grown buffer
    by buffer stays as short as its distinct sizes, instead of nesting once per buffer)."""
    pick = min if kind == MIN else max
    if isinstance(a, int) and isinstance(b, int):
        return pick(a, b)
    if a is b:
        return a
    ops: list[sint] = []
    for o in (*_operands(kind, a), *_operands(kind, b)):
        if not any(o is k for k in ops):
            ops.append(o)
    ints = [o for o in ops if isinstance(o, int)]
    ops = [o for o in ops if not isinstance(o, int)] + ([pick(ints)] if ints else [])

    def beats(x: sint, y: sint) -> bool:  # x makes y redundant
        lo, hi = (x, y) if kind == MIN else (y, x)
        return upper_bound(lo) <= lower_bound(hi) or prove_nonneg(add(hi, mul(lo, -1)))

    kept: list[sint] = []
    for i, o in enumerate(ops):
        # of two operands that beat each other (equal values) the first is kept
        if not any(beats(p, o) and (j < i or not beats(o, p)) for j, p in enumerate(ops) if j != i):
            kept.append(o)
    kept.sort(key=_key)
    out = kept[0]
    for o in kept[1:]:
        los, his = (lower_bound(out), lower_bound(o)), (upper_bound(out), upper_bound(o))
        out = _mk(kind, out, o, pick(los), pick(his))
    return out


def lt(a: sint, b: sint) -> sint:
    """1 if a < b else 0."""
    if isinstance(a, int) and isinstance(b, int):
        return int(a < b)
    if prove_lt(a, b):
        return 1
    if prove_nonneg(add(a, mul(b, -1))):
        return 0
    return _mk(LT, a, b, 0, 1)


def eq(a: sint, b: sint) -> sint:
    """1 if a == b else 0."""
    if isinstance(a, int) and isinstance(b, int):
        return int(a == b)
    if a is b:
        return 1
    if prove_lt(a, b) or prove_lt(b, a):
        return 0
    a, b = sorted((a, b), key=_key)
    return _mk(EQ, a, b, 0, 1)


def ceildiv(a: sint, b: sint) -> sint:
    return floordiv(add(a, add(b, -1)), b)


def logical_and(a: sint, b: sint) -> sint:
    """Both 0/1 valued: 1 when both are 1."""
    return mul(a, b)


_BUILDERS: dict[str, Callable[..., sint]] = {
    ADD: lambda items, const: _from_lin(dict(items), const),
    MUL: lambda *fs: _prod(fs),
    DIV: floordiv,
    MOD: mod,
    MIN: minimum,
    MAX: maximum,
    LT: lt,
    EQ: eq,
}


def _prod(fs: Iterable[sint]) -> sint:
    out: sint = 1
    for f in fs:
        out = mul(out, f)
    return out


# ----------------------------------------------------------------------------- transforms


def substitute(x: sint, mapping: Mapping[str, sint], memo: dict[int, sint] | None = None) -> sint:
    """Replace variables by name and re-simplify. Shared subexpressions are substituted once
    (``memo``, keyed by id, may be shared across calls with the same mapping)."""
    if isinstance(x, int) or not mapping:
        return x
    if memo is None:
        memo = {}
    hit = memo.get(id(x))
    if hit is not None:
        return hit
    if x.kind == VAR:
        out: sint = mapping.get(x.args[0], x)
    elif x.kind == ADD:
        out = x.args[1]
        for t, c in x.args[0]:
            out = add(out, mul(substitute(t, mapping, memo), c))
    else:
        args = [substitute(a, mapping, memo) for a in x.args]
        out = _prod(args) if x.kind == MUL else _BUILDERS[x.kind](*args)
    memo[id(x)] = out
    return out


def var_names(e: object) -> set[str]:
    """Names of the variables ``e`` uses (none for a constant or a non-expression)."""
    return {v.name for v in e.vars()} if isinstance(e, Expr) else set()


def has_divmod(e: sint, name: str | None = None) -> bool:
    """Whether ``e`` holds a floor division or modulo (of a term naming variable ``name``,
    when given)."""
    return any(name is None or name in {v.name for v in x.vars()} for x in divmods(e))


def free_dims(xs: Iterable[sint]) -> set[Expr]:
    """Named (non-index) variables used by the expressions."""
    out: set[Expr] = set()
    for x in xs:
        if isinstance(x, Expr):
            out |= {v for v in x.vars() if v.args[3] is None}
    return out


def as_int(x: sint) -> int | None:
    return x if isinstance(x, int) else None
