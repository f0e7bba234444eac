"""Bounds of symbolic expressions and what they prove: symbolic upper and lower bounds (an
index variable below its extent), ``prove_nonneg`` / ``prove_lt``, and the comparisons decided
by them (``lt``, ``eq``, ``minimum``, ``maximum``)."""

from __future__ import annotations

from .symbolic_expr import (
    _BUILDERS,
    Expr,
    _floordiv,
    _key,
    _mk,
    _split_multiples,
    add,
    mul,
    sint,
)
from .symbolic_text import ADD, DIV, EQ, LT, MAX, MIN, MOD, MUL, VAR


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
        return _floordiv(sym_upper(x.args[0]), x.args[1])
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
        return _floordiv(sym_lower(x.args[0]), x.args[1])
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
    out = _floordiv(sym_upper(f.args[0]), f.args[1] // c)
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


_BUILDERS.update({MIN: minimum, MAX: maximum, LT: lt, EQ: eq})
