"""torch symbolic sizes (sympy expressions over ``s0, s1, ...``) as luminal dims and sints.

Dynamo names each dynamic size with a sympy symbol and records its range in the ShapeEnv. The
same name becomes a luminal dim with the same range, so one plan serves every value dynamo's
guards allow; at run time the dims are read off the top-level inputs' shapes.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import sympy
import torch
from torch.utils._sympy import functions as tf

from ..graph import symbolic as sym
from ..graph.symbolic import sint


class Unsupported(Exception):
    """This node cannot be converted; the partitioner leaves it to eager PyTorch."""


class Dims:
    """torch symbol -> luminal dim, with ranges from the ShapeEnv when one is known. A symbol
    dynamo's guards hold to multiples of ``m`` (``multiples``) becomes ``m`` times a dim of its
    own (``quotient_name``), so sizes such as a window count ``(s + (-s % 4)) // 4`` divide out
    exactly as they do for every value the guards let through."""

    def __init__(self, shape_env: Any = None, multiples: dict[str, int] | None = None) -> None:
        self.shape_env = shape_env
        self.multiples = multiples or {}
        self.dims: dict[str, sint] = {}
        self.guard_bounds: dict[str, tuple[int, int]] | None = None  # read on first use
        # (a, b, what): the graph is exact only where b divides a (a view to a size a // b);
        # each call checks it (Env.bind), as eager's view would refuse the sizes otherwise
        self.divides: list[tuple[sint, sint, str]] = []
        # (e, what): the graph is exact only where e >= 0 (an as_strided read inside its base
        # that the bounds cannot prove); each call checks it (Env.bind)
        self.nonneg: list[tuple[sint, str]] = []

    def symbol(self, s: sympy.Symbol) -> sint:
        name = s.name
        d = self.dims.get(name)
        if d is None:
            if name.startswith("u"):  # unbacked: a data-dependent size
                raise Unsupported(f"data-dependent size {name}")
            lo, hi = 1, sym.DEFAULT_DIM_MAX
            vr = getattr(self.shape_env, "var_to_range", {}).get(s)
            if vr is not None:
                # an int argument (a cache position) ranges over all integers: 0 is a value
                # the plan must take; a negative one Env.bind sends to eager
                lo = max(int(vr.lower), 0) if _finite(vr.lower) else 0
                if _finite(vr.upper):
                    hi = min(int(vr.upper), sym.DEFAULT_DIM_MAX)
            if self.guard_bounds is None:
                self.guard_bounds = guard_ranges(self.shape_env)
            glo, ghi = self.guard_bounds.get(name, (lo, hi))
            lo, hi = max(lo, glo), min(hi, ghi)
            m = self.multiples.get(name, 1)
            if -(-lo // m) == hi // m:  # the guards admit one value (a scan's depth pins it)
                d = self.dims[name] = m * (hi // m)
            elif m > 1:
                q = sym.dim(quotient_name(name, m), -(-lo // m), max(hi // m, 1))
                prod = sym.mul(m, q)
                assert isinstance(prod, sym.Expr)  # m > 1 times a dim
                d = self.dims[name] = prod
            else:
                d = self.dims[name] = sym.dim(name, lo, hi)
        return d

    def expr(self, e: Any) -> sint:
        """A sympy expression (or int / SymInt) as a luminal sint."""
        if isinstance(e, bool):
            return int(e)
        if isinstance(e, int):
            return e
        if isinstance(e, torch.SymInt):
            return self.expr(e.node.expr)
        if not isinstance(e, sympy.Basic):
            raise Unsupported(f"not an integer size: {e!r}")
        if e.is_Integer:
            return int(e)
        if e.is_Symbol:
            return self.symbol(e)
        args = [self.expr(a) for a in e.args]
        if isinstance(e, sympy.Add):
            out: sint = 0
            for a in args:
                out = sym.add(out, a)
            return out
        if isinstance(e, sympy.Mul):
            out = 1
            for a in args:
                out = sym.mul(out, a)
            return out
        if isinstance(e, (tf.FloorDiv, tf.CleanDiv)):
            return sym.floordiv(args[0], args[1])
        if isinstance(e, tf.CeilDiv):
            return sym.ceildiv(args[0], args[1])
        if isinstance(e, (tf.PythonMod, tf.Mod, sympy.Mod)):
            return sym.mod(args[0], args[1])
        if isinstance(e, tf.ModularIndexing):
            return sym.mod(sym.floordiv(args[0], args[1]), args[2])
        if isinstance(e, (tf.Max, sympy.Max)):
            return _fold(sym.maximum, args)
        if isinstance(e, (tf.Min, sympy.Min)):
            return _fold(sym.minimum, args)
        if isinstance(e, (tf.PowByNatural, sympy.Pow)) and isinstance(args[1], int):
            out = 1
            for _ in range(args[1]):
                out = sym.mul(out, args[0])
            return out
        raise Unsupported(f"symbolic size {e} ({type(e).__name__})")

    def shape(self, t: torch.Tensor) -> tuple[sint, ...]:
        return tuple(self.expr(s) for s in t.shape)

    def hint(self, e: sint) -> int | None:
        """``e`` at the sizes the graph was traced with; None when a dim has no such value.
        Dynamo's guards hold the outcome of every comparison torch made on those sizes (a
        slice bound's sign among them), so the graph only runs where that outcome stays."""
        if isinstance(e, int):
            return e
        env: dict[str, int] = {}
        for s, v in _hints(self.shape_env).items():
            m = self.multiples.get(s.name, 1)
            env[quotient_name(s.name, m) if m > 1 else s.name] = int(v) // m
        try:
            return int(sym.evaluate(e, env))
        except (ValueError, TypeError):
            return None

    def negative(self, v: sint, what: str) -> bool:
        """Whether torch's index or slice bound ``v`` counts from the end. A symbolic one of
        unprovable sign takes the sign it had at the traced sizes (torch compared it with 0,
        so dynamo guards that sign); without such a value it is refused: ``-s`` and ``s`` name
        different elements."""
        if isinstance(v, int):
            return v < 0
        if sym.prove_nonneg(v):
            return False
        if sym.prove_lt(v, 0):
            return True
        h = self.hint(v)
        if h is None:
            raise Unsupported(f"{what} at a symbolic position {v} whose sign is not known")
        return h < 0

    def position(self, v: sint, n: sint, what: str) -> sint:
        """``v`` along an axis of extent ``n``, a negative one counted from the end."""
        return sym.add(n, v) if self.negative(v, what) else v


def dense_order(val: torch.Tensor, size: tuple, stride: tuple) -> list[int] | None:
    """The dim order in which ``val`` is laid out contiguously (its elements fill a block of
    storage, largest stride first), or None if it is not dense; ``size`` and ``stride`` are
    ``val``'s as sints, equal for every value of the dims, the order is read at the hints."""
    hints = [_hint(s) for s in val.stride()]
    perm = sorted(range(val.dim()), key=lambda d: -hints[d])  # stable: ties keep logical order
    expect: sint = 1
    for d in reversed(perm):
        if not (isinstance(size[d], int) and size[d] == 1) and stride[d] is not expect and \
                stride[d] != expect:  # fmt: skip
            return None
        expect = sym.mul(expect, size[d])
    return perm


def _hint(s: Any) -> int:
    return int(s.node.hint) if isinstance(s, torch.SymInt) else int(s)


def _hints(shape_env: Any) -> dict[Any, Any]:
    """Symbol -> its value at the traced sizes."""
    hints = getattr(shape_env, "backed_var_to_val", None)
    if hints is None:  # PyTorch before backed_var_to_val
        hints = getattr(shape_env, "var_to_val", {})
    return hints


_PIECEWISE = (tf.Max, tf.Min, sympy.Max, sympy.Min)
_RELATIONS = (sympy.Eq, sympy.Le, sympy.Lt, sympy.Ge, sympy.Gt)
# a guard with more operations than this is not solved (solveset's time grows fast with size)
GUARD_SOLVE_MAX_OPS = 40


def guard_ranges(shape_env: Any) -> dict[str, tuple[int, int]]:
    """Symbol name -> (lo, hi) that a guard over that one symbol implies beyond its ShapeEnv
    range: a relation through max / min, which dynamo keeps as a guard without narrowing the
    range (MPT's ALiBi slice ``[max(0, 2048 - s):]`` added to scores of length ``s`` guards
    ``2048 - max(0, 2048 - s) == s``, that is ``s <= 2048``). A guard whose solutions form one
    interval holding the traced value narrows the range to it: compiled code only ever sees
    values the guards admit."""
    if shape_env is None:
        return {}
    hints = _hints(shape_env)
    ranges = getattr(shape_env, "var_to_range", {})
    out: dict[str, tuple[int, int]] = {}
    for g in getattr(shape_env, "guards", ()):
        e = getattr(g, "expr", None)
        if (
            not isinstance(e, _RELATIONS)
            or len(e.free_symbols) != 1
            or not e.has(*_PIECEWISE)
            or sympy.count_ops(e) > GUARD_SOLVE_MAX_OPS
        ):
            continue
        (s,) = e.free_symbols
        hint, vr = hints.get(s), ranges.get(s)
        if hint is None:
            continue
        lo = int(vr.lower) if vr is not None and _finite(vr.lower) else 0
        hi = int(vr.upper) if vr is not None and _finite(vr.upper) else sympy.oo
        parts = _solve(e.subs(s, _X), lo, hi)
        # one interval holding the traced value; where the guard admits values apart from it,
        # the dim keeps its range (a plan must not refuse a value dynamo lets through)
        if len(parts) != 1 or parts[0].contains(int(hint)) is not sympy.true:
            continue
        part = parts[0]
        a, b = out.get(s.name, (0, sym.DEFAULT_DIM_MAX))
        if _finite(part.inf):
            a = max(a, int(sympy.ceiling(part.inf)))
        if _finite(part.sup):
            b = min(b, int(sympy.floor(part.sup)))
        out[s.name] = (a, b)
    return out


_X = sympy.Symbol("x", integer=True)


@functools.lru_cache(maxsize=256)
def _solve(rel: Any, lo: int, hi: Any) -> list[Any]:
    """The intervals of x in [lo, hi] where ``rel`` holds (layers repeat one guard)."""
    plain = rel.replace(tf.Max, sympy.Max).replace(tf.Min, sympy.Min)
    try:
        sol = sympy.solveset(plain, _X, sympy.Interval(lo, hi))
    except Exception:  # sympy cannot solve it: the guard narrows nothing here
        return []
    if isinstance(sol, sympy.Interval):
        return [sol]
    if isinstance(sol, sympy.Union) and all(isinstance(a, sympy.Interval) for a in sol.args):
        return list(sol.args)
    return []


def _finite(v: Any) -> bool:
    return isinstance(v, (int, sympy.Integer)) and not isinstance(v, bool)  # not int_oo / oo


def _fold(fn: Any, args: list[sint]) -> sint:
    out = args[0]
    for a in args[1:]:
        out = fn(out, a)
    return out


def bare_symbol(s: Any) -> str | None:
    """The symbol's name when a size is exactly one symbol (so a run binds it), else None."""
    e = s.node.expr if isinstance(s, torch.SymInt) else None
    return e.name if isinstance(e, sympy.Symbol) else None


def quotient_name(name: str, m: int) -> str:
    """The luminal dim standing for ``name // m`` where guards hold ``name`` to multiples of m."""
    return f"{name}_div{m}"


_DIVISIONS = (tf.Mod, tf.PythonMod, sympy.Mod, tf.FloorDiv, tf.CleanDiv, tf.ModularIndexing)


def guard_multiples(shape_env: Any) -> dict[str, int]:
    """Symbol name -> m > 1 for each symbol every value of which that dynamo's guards admit is
    a multiple of m (a guard such as ``Eq(Mod(s, 4), 0)``, or a padded size dynamo assumed
    unpadded). Compiled code only ever sees values its guards admit, so the symbol may be
    written as m times a new dim.

    Only guards over one symbol are read: leaving a guard out admits more values, which can
    only make m smaller. m is the gcd of the admitted values from the symbol's lower bound up
    to past twice the period of any constant the guards hold (a value whose guards do not
    evaluate to a definite False counts as admitted)."""
    if shape_env is None:
        return {}
    hints = _hints(shape_env)
    ranges = getattr(shape_env, "var_to_range", {})
    per: dict[Any, list[Any]] = {}
    for g in getattr(shape_env, "guards", ()):
        e = getattr(g, "expr", None)
        if not isinstance(e, sympy.Basic) or len(e.free_symbols) != 1:
            continue
        per.setdefault(next(iter(e.free_symbols)), []).append(e)
    out: dict[str, int] = {}
    for s, guards in per.items():
        hint = hints.get(s)
        if not any(e.has(*_DIVISIONS) for e in guards) or hint is None or int(hint) < 2:
            continue
        h = int(hint)
        srcs = sorted((p for p in (_python(e, s) for e in guards) if p is not None), key=len)
        tests = [eval(f"lambda v: {p}") for p in srcs]  # short guards reject most values first
        consts = [abs(int(a)) for e in guards for a in e.atoms(sympy.Integer)]
        span = min(max([h, *consts]), 1 << 16)
        vr = ranges.get(s)
        lo = max(int(vr.lower), 1) if vr is not None and _finite(vr.lower) else 1
        m = h
        for v in range(lo, h + 2 * span + 1):
            if v % m and _admits(tests, v):
                m = math.gcd(m, v)
                if m == 1:
                    break
        if m > 1:
            out[s.name] = m
    return out


def _admits(tests: list[Any], v: int) -> bool:
    for t in tests:
        try:
            if not t(v):
                return False
        except (ZeroDivisionError, ValueError, OverflowError):
            continue  # undefined at v: not a definite no
    return True


_REL = {sympy.Eq: "==", sympy.Ne: "!=", sympy.Lt: "<", sympy.Le: "<=", sympy.Gt: ">",
        sympy.Ge: ">="}  # fmt: skip


def _python(e: Any, s: Any) -> str | None:
    """``e`` over the one symbol ``s`` as Python source in ``v`` (None where a node is not
    integer arithmetic or a comparison: that guard is then left out)."""
    if e == s:
        return "v"
    if isinstance(e, sympy.Integer):
        return str(int(e))
    if e is sympy.true or e is sympy.false:
        return str(bool(e))
    a = [_python(x, s) for x in e.args]
    if any(x is None for x in a):
        return None
    if isinstance(e, sympy.Add):
        return "(" + " + ".join(a) + ")"  # type: ignore[arg-type]
    if isinstance(e, sympy.Mul):
        return "(" + " * ".join(a) + ")"  # type: ignore[arg-type]
    if isinstance(e, (tf.FloorDiv, tf.CleanDiv)):
        return f"({a[0]} // {a[1]})"
    if isinstance(e, (tf.Mod, tf.PythonMod, sympy.Mod)):
        return f"({a[0]} % {a[1]})"
    if isinstance(e, (tf.PowByNatural, sympy.Pow)) and isinstance(e.args[1], sympy.Integer) \
            and int(e.args[1]) >= 0:  # fmt: skip
        return f"({a[0]} ** {a[1]})"
    if isinstance(e, (tf.Max, sympy.Max)):
        return f"max({', '.join(a)})"  # type: ignore[arg-type]
    if isinstance(e, (tf.Min, sympy.Min)):
        return f"min({', '.join(a)})"  # type: ignore[arg-type]
    rel = _REL.get(type(e))
    if rel is not None:
        return f"({a[0]} {rel} {a[1]})"
    if isinstance(e, sympy.And):
        return "(" + " and ".join(a) + ")"  # type: ignore[arg-type]
    if isinstance(e, sympy.Or):
        return "(" + " or ".join(a) + ")"  # type: ignore[arg-type]
    if isinstance(e, sympy.Not):
        return f"(not {a[0]})"
    return None
