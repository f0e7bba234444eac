"""torch symbolic sizes (sympy expressions over ``s0, s1, ...``) as luminal dims and sints.

Dynamo names each dynamic size with a sympy symbol and records its range in the ShapeEnv. The
same name becomes a luminal dim with the same range, so one plan serves every value dynamo's
guards allow; at run time the dims are read off the top-level inputs' shapes.
"""

from __future__ import annotations

from typing import Any

import sympy
import torch
from torch.utils._sympy import functions as tf

from ..graph import symbolic as sym
from ..graph.symbolic import sint


class Unsupported(Exception):
    """This node cannot be converted; the partitioner leaves it to eager PyTorch."""


class Dims:
    """torch symbol -> luminal dim, with ranges from the ShapeEnv when one is known."""

    def __init__(self, shape_env: Any = None) -> None:
        self.shape_env = shape_env
        self.dims: dict[str, sym.Expr] = {}

    def symbol(self, s: sympy.Symbol) -> sym.Expr:
        name = s.name
        d = self.dims.get(name)
        if d is None:
            if name.startswith("u"):  # unbacked: a data-dependent size
                raise Unsupported(f"data-dependent size {name}")
            lo, hi = 1, sym.DEFAULT_DIM_MAX
            vr = getattr(self.shape_env, "var_to_range", {}).get(s)
            if vr is not None:
                if _finite(vr.lower):
                    lo = max(int(vr.lower), 0)
                if _finite(vr.upper):
                    hi = min(int(vr.upper), sym.DEFAULT_DIM_MAX)
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
