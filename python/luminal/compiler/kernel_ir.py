"""The backend-neutral kernel IR.

A ``Kernel`` computes one buffer. It iterates over an output space (index variables ``_i0..``),
and for each point stores a ``Value``: an expression tree of loads (through symbolic index
and validity expressions), ALU ops named by the primitive ``Op`` enum, casts, constants,
reductions over an extra variable, and gathers (a load whose row is a runtime value).
Renderers (codegen/) turn kernels into C, CUDA or MSL; nothing here names a backend.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..graph import symbolic as sym
from ..graph.dtypes import DType
from ..graph.ops import BINARY, REDUCE, UNARY, Op
from ..graph.symbolic import sint


@dataclass(frozen=True)
class Load:
    """buf[index] where ``valid`` (0/1) is true, else 0."""

    buf: int
    index: sint
    valid: sint
    dtype: DType


@dataclass(frozen=True)
class Const:
    value: float | int | bool
    dtype: DType


@dataclass(frozen=True)
class IndexVal:
    """An integer computed from index variables and dims (IOTA, symbolic constants)."""

    expr: sint
    dtype: DType


@dataclass(frozen=True)
class Alu:
    op: Op
    srcs: tuple[Value, ...]
    dtype: DType


@dataclass(frozen=True)
class Cast:
    src: Value
    dtype: DType


@dataclass(frozen=True)
class Masked:
    """``value`` where ``valid`` holds, else 0 (reads of padding)."""

    valid: sint
    value: Value
    dtype: DType


@dataclass(frozen=True)
class Reduce:
    """Fold ``body`` over ``var`` in [0, extent) with SUM_REDUCE or MAX_REDUCE."""

    op: Op
    var: sym.Expr
    extent: sint
    body: Value
    dtype: DType


@dataclass(frozen=True)
class Gather:
    """``body`` evaluated with variable ``var`` bound to the runtime integer ``row``;
    0 when ``row`` is outside [0, rows)."""

    var: sym.Expr
    row: Value
    rows: sint
    body: Value
    dtype: DType


Value = Load | Const | IndexVal | Alu | Cast | Masked | Reduce | Gather


@dataclass
class Kernel:
    """out[store index] = value for every point of ``shape``.

    ``scatter_row`` (optional): the store goes to row ``scatter_row`` (a runtime value) of an
    output with ``scatter_rows`` rows; the last ``len(shape) - row_dims`` index vars address
    within the row. Rows outside [0, scatter_rows) are skipped.
    """

    name: str
    shape: tuple[sint, ...]
    out: int
    value: Value
    dtype: DType
    scatter_row: Value | None = None
    scatter_rows: sint = 0
    row_dims: int = 0
    reads: list[int] = field(default_factory=list)

    def verify(self) -> None:
        """Check dtypes and variable scoping of the value tree."""
        allowed = {f"_i{k}" for k in range(len(self.shape))}
        _verify(self.value, allowed, self.name)
        if self.scatter_row is not None:
            _verify(self.scatter_row, allowed, self.name)
        if self.value.dtype is not self.dtype:
            raise ValueError(
                f"kernel {self.name}: stores {self.value.dtype.name} into {self.dtype.name}"
            )


def _verify(v: Value, scope: set[str], kname: str) -> None:
    def check_expr(e: sint) -> None:
        if isinstance(e, sym.Expr):
            for x in e.vars():
                if x.extent is not None and x.name not in scope:
                    raise ValueError(
                        f"kernel {kname}: variable {x.name} used outside its loop in {e}"
                    )

    if isinstance(v, Load):
        check_expr(v.index)
        check_expr(v.valid)
    elif isinstance(v, IndexVal):
        check_expr(v.expr)
    elif isinstance(v, Alu):
        if v.op in UNARY and len(v.srcs) != 1 or v.op in BINARY and len(v.srcs) != 2:
            raise ValueError(f"kernel {kname}: {v.op.name} with {len(v.srcs)} operands")
        for s in v.srcs:
            _verify(s, scope, kname)
    elif isinstance(v, (Cast,)):
        _verify(v.src, scope, kname)
    elif isinstance(v, Masked):
        check_expr(v.valid)
        _verify(v.value, scope, kname)
    elif isinstance(v, Reduce):
        if v.op not in REDUCE:
            raise ValueError(f"kernel {kname}: Reduce with {v.op.name}")
        _verify(v.body, scope | {v.var.name}, kname)
    elif isinstance(v, Gather):
        _verify(v.row, scope, kname)
        _verify(v.body, scope | {v.var.name}, kname)


def walk(v: Value):  # type: ignore[no-untyped-def]
    """Every value in the tree, parents first."""
    yield v
    if isinstance(v, Alu):
        for s in v.srcs:
            yield from walk(s)
    elif isinstance(v, Cast):
        yield from walk(v.src)
    elif isinstance(v, Masked):
        yield from walk(v.value)
    elif isinstance(v, Reduce):
        yield from walk(v.body)
    elif isinstance(v, Gather):
        yield from walk(v.row)
        yield from walk(v.body)


def substitute(v: Value, mapping: dict[str, sint]) -> Value:
    """Rename index variables throughout a value tree (used to inline through views)."""
    s = lambda e: sym.substitute(e, mapping)  # noqa: E731
    if isinstance(v, Load):
        return Load(v.buf, s(v.index), s(v.valid), v.dtype)
    if isinstance(v, Const):
        return v
    if isinstance(v, IndexVal):
        return IndexVal(s(v.expr), v.dtype)
    if isinstance(v, Alu):
        return Alu(v.op, tuple(substitute(x, mapping) for x in v.srcs), v.dtype)
    if isinstance(v, Cast):
        return Cast(substitute(v.src, mapping), v.dtype)
    if isinstance(v, Masked):
        valid = s(v.valid)
        return (
            Const(0, v.dtype)
            if valid == 0
            else Masked(valid, substitute(v.value, mapping), v.dtype)
        )
    if isinstance(v, Reduce):
        inner = {k: e for k, e in mapping.items() if k != v.var.name}
        return Reduce(v.op, v.var, s(v.extent), substitute(v.body, inner), v.dtype)
    inner = {k: e for k, e in mapping.items() if k != v.var.name}
    return Gather(v.var, substitute(v.row, mapping), s(v.rows), substitute(v.body, inner), v.dtype)


def _expr_vars(e: sint) -> frozenset[str]:
    if not isinstance(e, sym.Expr):
        return frozenset()
    return frozenset(x.name for x in e.vars() if x.extent is not None)


def free_vars(v: Value, memo: dict[int, frozenset[str]]) -> frozenset[str]:
    """Loop variables (index, reduce and gather vars) a value depends on; ``memo`` is keyed by
    ``id`` and must live no longer than the tree."""
    hit = memo.get(id(v))
    if hit is not None:
        return hit
    if isinstance(v, Load):
        out = _expr_vars(v.index) | _expr_vars(v.valid)
    elif isinstance(v, IndexVal):
        out = _expr_vars(v.expr)
    elif isinstance(v, Const):
        out = frozenset()
    elif isinstance(v, Alu):
        out = frozenset().union(*(free_vars(s, memo) for s in v.srcs))
    elif isinstance(v, Cast):
        out = free_vars(v.src, memo)
    elif isinstance(v, Masked):
        out = _expr_vars(v.valid) | free_vars(v.value, memo)
    elif isinstance(v, Reduce):
        out = (free_vars(v.body, memo) | _expr_vars(v.extent)) - {v.var.name}
    else:
        out = (free_vars(v.row, memo) | free_vars(v.body, memo) | _expr_vars(v.rows)) - {v.var.name}
    memo[id(v)] = out
    return out


def invariant_parts(v: Value, inner: frozenset[str], memo: dict[int, frozenset[str]]) -> list[Value]:
    """Maximal subtrees of ``v`` that use none of the loop variables in ``inner`` (the loop being
    entered and any loop nested in it) and are evaluated unconditionally (not under a mask or
    a gather bound check): safe to compute once, before the loop."""
    if not free_vars(v, memo) & inner:
        return [] if isinstance(v, (Const, IndexVal)) else [v]
    if isinstance(v, Alu):
        return [p for s in v.srcs for p in invariant_parts(s, inner, memo)]
    if isinstance(v, Cast):
        return invariant_parts(v.src, inner, memo)
    if isinstance(v, Reduce):
        return invariant_parts(v.body, inner | {v.var.name}, memo)
    if isinstance(v, Gather):
        return invariant_parts(v.row, inner, memo)
    return []
