"""Reading symbolic expressions out: C or Python text for kernels, the plan format's postfix
programs, stable digests for on-disk caches, and values at bound dims (``evaluate``). Also
the expression kinds and the postfix opcodes (``symbolic.py`` builds on them: this module
reads expressions only by their fields ``kind``, ``args`` and ``lo``)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .symbolic import Expr, sint

# Postfix opcodes shared with the plan format (docs/plan-format.md) and the C++ evaluator.
OP_CONST, OP_DIM, OP_ADD, OP_SUB, OP_MUL, OP_FLOORDIV, OP_MOD, OP_MIN, OP_MAX, OP_LT, OP_EQ = range(
    11
)

# Expression kinds. ADD is a canonical linear form: sum(coef * term) + const.
VAR, ADD, MUL, DIV, MOD, MIN, MAX, LT, EQ = (
    "var",
    "add",
    "mul",
    "div",
    "mod",
    "min",
    "max",
    "lt",
    "eq",
)


def render(x: sint, name: Callable[[Expr], str], style: str = "c") -> str:
    """Render as C (``style='c'``; floor ops go through lm_fdiv/lm_fmod when a side may be
    negative) or as Python-like text (``style='py'``)."""
    if isinstance(x, int):
        return str(x) if style == "py" or -(2**31) < x < 2**31 else f"{x}LL"
    k = x.kind
    r = lambda e: render(e, name, style)  # noqa: E731
    if k == VAR:
        return name(x)
    if k == ADD:
        parts = []
        for t, c in x.args[0]:
            s = r(t)
            parts.append(s if c == 1 else f"-{s}" if c == -1 else f"{c}*{s}")
        if x.args[1]:
            parts.append(str(x.args[1]))
        return "(" + " + ".join(parts).replace("+ -", "- ") + ")"
    if k == MUL:
        return "(" + "*".join(r(f) for f in x.args) + ")"
    a, b = x.args
    if k in (DIV, MOD):
        op = "//" if k == DIV else "%"
        if style == "py":
            return f"({r(a)} {op} {r(b)})"
        if _lo(a) >= 0 and _lo(b) > 0:
            return f"({r(a)} {'/' if k == DIV else '%'} {r(b)})"
        return f"{'lm_fdiv' if k == DIV else 'lm_fmod'}({r(a)}, {r(b)})"
    if k in (MIN, MAX):
        return (
            f"{'lm_min' if k == MIN else 'lm_max'}({r(a)}, {r(b)})"
            if style == "c"
            else f"{k}({r(a)}, {r(b)})"
        )
    return f"({r(a)} {'<' if k == LT else '=='} {r(b)})"


def _lo(x: sint) -> int:
    return x if isinstance(x, int) else x.lo


def to_postfix(x: sint, dim_index: Mapping[str, int]) -> list[tuple[int, int]]:
    """The postfix program of the plan format; variables must be plan dims."""
    out: list[tuple[int, int]] = []
    _emit(x, dim_index, out)
    return out


def _emit(x: sint, dim_index: Mapping[str, int], out: list[tuple[int, int]]) -> None:
    if isinstance(x, int):
        out.append((OP_CONST, x))
        return
    k = x.kind
    if k == VAR:
        if x.args[0] not in dim_index:
            raise ValueError(f"expression {x} uses {x.args[0]!r}, which is not a plan dim")
        out.append((OP_DIM, dim_index[x.args[0]]))
    elif k == ADD:
        first = True
        for t, c in x.args[0]:
            _emit(t, dim_index, out)
            if c != 1:
                out += [(OP_CONST, c), (OP_MUL, 0)]
            if not first:
                out.append((OP_ADD, 0))
            first = False
        if x.args[1]:
            out += [(OP_CONST, x.args[1]), (OP_ADD, 0)]
    elif k == MUL:
        for i, f in enumerate(x.args):
            _emit(f, dim_index, out)
            if i:
                out.append((OP_MUL, 0))
    else:
        _emit(x.args[0], dim_index, out)
        _emit(x.args[1], dim_index, out)
        op = {DIV: OP_FLOORDIV, MOD: OP_MOD, MIN: OP_MIN, MAX: OP_MAX, LT: OP_LT, EQ: OP_EQ}[k]
        out.append((op, 0))


_FP: dict[int, str] = {}


def fingerprint(x: sint) -> str:
    """A stable structural digest (same across processes; shared subexpressions hashed once)."""
    if isinstance(x, int):
        return f"i{x}"
    hit = _FP.get(id(x))
    if hit is None:
        if x.kind == VAR:
            parts = [
                VAR,
                *map(str, x.args[:3]),
                fingerprint(x.args[3]) if x.args[3] is not None else "-",
            ]
        elif x.kind == ADD:
            parts = [ADD, str(x.args[1]), *(f"{fingerprint(t)}*{c}" for t, c in x.args[0])]
        else:
            parts = [x.kind, *(fingerprint(a) for a in x.args)]
        hit = _FP[id(x)] = hashlib.sha1("|".join(parts).encode()).hexdigest()[:16]
    return hit


def divmods(x: sint) -> Iterator[Expr]:
    """The floor divisions and modulos in ``x`` (a shared subexpression visited once)."""
    seen: set[int] = set()
    stack = [x] if not isinstance(x, int) else []
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if e.kind in (DIV, MOD):
            yield e
        if e.kind == ADD:
            stack += [t for t, _ in e.args[0]]
        elif e.kind != VAR:
            stack += [a for a in e.args if not isinstance(a, int)]


def evaluate(x: sint, env: Mapping[str, Any], memo: dict[int, Any] | None = None) -> Any:
    """Evaluate with variables bound to ints or numpy integer arrays (shared subexpressions
    once)."""
    if isinstance(x, int):
        return x
    if memo is None:
        memo = {}
    hit = memo.get(id(x))
    if hit is not None:
        return hit
    out = _evaluate(x, env, memo)
    memo[id(x)] = out
    return out


def _evaluate(x: Expr, env: Mapping[str, Any], memo: dict[int, Any]) -> Any:
    k = x.kind
    if k == VAR:
        try:
            return env[x.args[0]]
        except KeyError:
            raise ValueError(f"dim {x.args[0]!r} is not bound (bound: {sorted(env)})") from None
    if k == ADD:
        out = x.args[1]
        for t, c in x.args[0]:
            out = out + evaluate(t, env, memo) * c
        return out
    if k == MUL:
        out = 1
        for f in x.args:
            out = out * evaluate(f, env, memo)
        return out
    a, b = evaluate(x.args[0], env, memo), evaluate(x.args[1], env, memo)
    if k == DIV:
        return a // b
    if k == MOD:
        return a % b
    if k == MIN:
        return _np_or(min, "minimum", a, b)
    if k == MAX:
        return _np_or(max, "maximum", a, b)
    if k == LT:
        return _np_or(lambda p, q: int(p < q), "less", a, b, as_int=True)
    return _np_or(lambda p, q: int(p == q), "equal", a, b, as_int=True)


def _np_or(fn: Callable, np_name: str, a: Any, b: Any, as_int: bool = False) -> Any:
    if isinstance(a, int) and isinstance(b, int):
        return fn(a, b)
    import numpy as np

    r = getattr(np, np_name)(a, b)
    return r.astype(np.int64) if as_int else r
