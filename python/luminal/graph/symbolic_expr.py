"""Symbolic expressions as interned nodes, and their sums and products.

An ``ADD`` node is a canonical linear form (sum of coefficient * term, plus a constant) and a
``MUL`` node a sorted product of factors, so equal sums and products are the same node. A sum
folds the terms a reshape splits a dim into back together (``_fold_divmod``). Floor division,
modulo and comparisons are built in ``symbolic_divmod.py`` and ``symbolic_bounds.py`` on top of
this module; ``symbolic.py`` gathers them all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
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
    render,
    to_postfix,
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
        return _floordiv(self, o)

    def __rfloordiv__(self, o: sint) -> sint:
        return _floordiv(o, self)

    def __mod__(self, o: sint) -> sint:
        return _mod(self, o)

    def __rmod__(self, o: sint) -> sint:
        return _mod(o, self)

    def __lt__(self, o: sint) -> sint:
        return _BUILDERS[LT](self, o)

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
                    q = _floordiv(x, c)
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
                    d = _floordiv(x, c)
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
                merged = _mod(x, mul(c, m))
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


def _prod(fs: Iterable[sint]) -> sint:
    out: sint = 1
    for f in fs:
        out = mul(out, f)
    return out


# Floor division, modulo and the comparisons simplify by proving bounds, and bounds divide in
# turn, so they live in modules built on this one (symbolic_bounds.py, symbolic_divmod.py),
# which enter their builders here when imported. Operators, sums and bounds call them through
# this table; unpickling rebuilds every kind through it.
_BUILDERS: dict[str, Callable[..., sint]] = {
    ADD: lambda items, const: _from_lin(dict(items), const),
    MUL: lambda *fs: _prod(fs),
}


def _floordiv(a: sint, b: sint) -> sint:
    return _BUILDERS[DIV](a, b)


def _mod(a: sint, b: sint) -> sint:
    return _BUILDERS[MOD](a, b)
