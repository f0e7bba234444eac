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

This module gathers the package's symbolic algebra (import it, not the parts): nodes, sums
and products in ``symbolic_expr.py``, bounds and comparisons in ``symbolic_bounds.py``, floor
division and modulo in ``symbolic_divmod.py``, text and postfix in ``symbolic_text.py``;
substitution and the queries over variables are here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from .symbolic_bounds import (
    eq,
    lower_bound,
    lt,
    maximum,
    minimum,
    prove_lt,
    prove_nonneg,
    sym_lower,
    sym_upper,
    upper_bound,
)
from .symbolic_divmod import ceildiv, floordiv, mod
from .symbolic_expr import (
    _BUILDERS,
    DEFAULT_DIM_MAX,
    MEMO_MAX,
    Expr,
    _factors,
    _from_lin,
    _lin,
    _prod,
    _split_multiples,
    add,
    dim,
    index_var,
    mul,
    sint,
    var,
)
from .symbolic_text import (
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
    evaluate,
    fingerprint,
    render,
    to_postfix,
)

__all__ = [
    "ADD", "DEFAULT_DIM_MAX", "DIV", "EQ", "LT", "MAX", "MEMO_MAX", "MIN", "MOD", "MUL", "VAR",
    "Expr", "add", "as_int", "ceildiv", "dim", "divmods", "eq", "evaluate", "fingerprint",
    "floordiv", "free_dims", "has_divmod", "index_var", "logical_and", "lower_bound", "lt",
    "maximum", "minimum", "mod", "mul", "prove_lt", "prove_nonneg", "render", "sint",
    "substitute", "sym_lower", "sym_upper", "to_postfix", "upper_bound", "var", "var_names",
    # the linear forms and builders the compiler's index arithmetic takes apart and rebuilds
    "_BUILDERS", "_factors", "_from_lin", "_lin", "_prod", "_split_multiples",
]  # fmt: skip


def logical_and(a: sint, b: sint) -> sint:
    """Both 0/1 valued: 1 when both are 1."""
    return mul(a, b)


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
