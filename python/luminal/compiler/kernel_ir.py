"""The backend-neutral kernel IR.

A ``Kernel`` computes one buffer. It iterates over an output space (index variables ``_i0..``),
and for each point stores a ``Value``: an expression tree of loads (through symbolic index
and validity expressions), ALU ops named by the primitive ``Op`` enum, casts, constants,
reductions over an extra variable, and gathers (a load whose row is a runtime value).
Renderers in codegen/ turn kernels into source for each target; nothing here names one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..graph import symbolic as sym
from ..graph.dtypes import DType
from ..graph.ops import BINARY, REDUCE, UNARY, Op
from ..graph.symbolic import sint


def _cached_hash(self: object) -> int:
    # value trees are DAGs: hashing them field by field on every lookup is exponential
    h = self.__dict__.get("_hash")
    if h is None:
        h = hash((type(self).__name__, *(getattr(self, f) for f in self.__dataclass_fields__)))  # type: ignore[attr-defined]
        object.__setattr__(self, "_hash", h)
    return h


@dataclass(frozen=True)
class Load:
    __hash__ = _cached_hash

    """buf[index] where ``valid`` (0/1) is true, else 0."""

    buf: int
    index: sint
    valid: sint
    dtype: DType


@dataclass(frozen=True)
class Const:
    __hash__ = _cached_hash

    value: float | int | bool
    dtype: DType


@dataclass(frozen=True)
class IndexVal:
    __hash__ = _cached_hash

    """An integer computed from index variables and dims (IOTA, symbolic constants)."""

    expr: sint
    dtype: DType


@dataclass(frozen=True)
class Alu:
    __hash__ = _cached_hash

    op: Op
    srcs: tuple[Value, ...]
    dtype: DType


@dataclass(frozen=True)
class Cast:
    __hash__ = _cached_hash

    src: Value
    dtype: DType


@dataclass(frozen=True)
class Masked:
    __hash__ = _cached_hash

    """``value`` where ``valid`` holds, else 0 (reads of padding)."""

    valid: sint
    value: Value
    dtype: DType


@dataclass(frozen=True)
class Reduce:
    __hash__ = _cached_hash

    """Fold ``body`` over ``var`` in [0, extent) with SUM_REDUCE or MAX_REDUCE."""

    op: Op
    var: sym.Expr
    extent: sint
    body: Value
    dtype: DType


@dataclass(frozen=True)
class Gather:
    __hash__ = _cached_hash

    """``body`` evaluated with variable ``var`` bound to the runtime integer ``row``;
    0 when ``row`` is outside [0, rows)."""

    var: sym.Expr
    row: Value
    rows: sint
    body: Value
    dtype: DType


@dataclass(frozen=True)
class SoftmaxSum:
    __hash__ = _cached_hash

    """A softmax-weighted sum over ``var`` in [0, extent): with m = max_j score_j,
    sum_j 2^(score_j - m) * weight_j / sum_j 2^(score_j - m). ``score`` is in log2 units.
    The online-softmax form of attention: computable in one pass (running max, rescaled
    partial sums), so the scores are never stored."""

    var: sym.Expr
    extent: sint
    score: Value
    weight: Value
    dtype: DType


Value = Load | Const | IndexVal | Alu | Cast | Masked | Reduce | Gather | SoftmaxSum

# A step's condition ``(dims, lo, hi)``: it runs only where lo <= the product of the dims
# <= hi. A product, not one dim: a batch of sequences has batch x seq rows, and which program
# is faster follows the rows.
When = tuple[tuple[str, ...], int, int]


def when_label(when: When) -> str:
    """``when`` as part of an identifier: ``seq27``, ``batch_seq27``."""
    return f"{'_'.join(when[0])}{when[1]}"


def part_of(steps: Sequence[Kernel | LibCall]) -> When | None:
    """The condition every one of ``steps`` runs under, or None (none, or not all the same)."""
    whens = {s.when for s in steps}
    return whens.pop() if len(whens) == 1 else None


@dataclass(frozen=True)
class Schedule:
    """Explicit loop-structure parameters of a kernel, chosen by the search (compiler/schedule.py
    applies them; a kernel without one gets the default rules).

    ``split``: the inner extent reductions are split by (``r = split*ro + ri``); 0 splits
    nothing; -1 is the default rule (blocked reductions only, largest power of two up to 16).
    ``chunk``: elements of the innermost output dim per task; 0 is the code generator's
    default.
    ``order``: the order tasks walk the output. 0: the chunks of the innermost dim vary
    fastest (one thread's tasks share the outer indices: a row's operands stay in cache);
    1: the outer indices vary fastest (one thread's tasks share a chunk of the innermost dim:
    the operands of those columns, a weight's rows, stay in cache across every outer index,
    which suits a product of few rows by a large weight).
    ``jam``: output indices of dim ``jam_dim`` (an outer dim) computed together, register
    blocking: one loop of each reduction computes ``jam`` elements, and what their bodies
    share (what does not depend on that dim: a weight, dequantized) is computed once for
    all of them; 0 or 1: one element at a time; -1: the default rule (schedule.py). A dim
    whose extent is not a multiple runs its last indices in smaller blocks (the binary
    digits of the rest, except that a block takes the rest when 3/4 of it is left: its
    extra indices repeat the last real one and are not stored).
    ``jam2``: indices of the innermost output dim computed together as well, so a block is
    ``jam`` x ``jam2`` elements (with ``jam`` 0 or 1: 1 x ``jam2``): what their bodies share
    along that dim (the other operand's load) is computed once per ``jam2`` columns, and a
    block loads ``jam + jam2`` operand values for ``jam * jam2`` products; 0 or 1: none.
    Columns past the last full block of a task run in blocks of the binary digits of the
    rest."""

    split: int = -1
    chunk: int = 0
    order: int = 0
    jam: int = -1
    jam_dim: int = 0
    jam2: int = 0

    def label(self) -> str:
        split = "default" if self.split < 0 else str(self.split)
        return (f"split={split}" + (f",chunk={self.chunk}" if self.chunk else "")
                + (f",order={self.order}" if self.order else "")
                + (f",jam={self.jam}@{self.jam_dim}" if self.jam > 1 else "")
                + (",jam=0" if 0 <= self.jam <= 1 and self.jam2 <= 1 else "")
                + (f",jam2={self.jam2}" if self.jam2 > 1 else ""))  # fmt: skip


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
    # set by the search (compiler/search/schedules.py); None: the default schedule rules
    schedule: Schedule | None = None
    # the value holds the schedule's loop rewrites already (compiler/schedule.py::apply, which
    # code generation calls too: a cut-out program is measured as the plan will run it)
    scheduled: bool = False
    # runs only where its condition holds (the search kept another program for the rest of
    # the range, compiler/search/select.py); None: always
    when: When | None = None

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


def _verify(v: Value, scope: set[str], kname: str, seen: set[int] | None = None) -> None:
    seen = set() if seen is None else seen
    if id(v) in seen:
        return
    seen.add(id(v))

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
            _verify(s, scope, kname, seen)
    elif isinstance(v, (Cast,)):
        _verify(v.src, scope, kname, seen)
    elif isinstance(v, Masked):
        check_expr(v.valid)
        _verify(v.value, scope, kname, seen)
    elif isinstance(v, Reduce):
        if v.op not in REDUCE:
            raise ValueError(f"kernel {kname}: Reduce with {v.op.name}")
        _verify(v.body, scope | {v.var.name}, kname)
    elif isinstance(v, Gather):
        _verify(v.row, scope, kname, seen)
        _verify(v.body, scope | {v.var.name}, kname)
    elif isinstance(v, SoftmaxSum):
        check_expr(v.extent)
        if not v.dtype.is_float or v.score.dtype is not v.dtype or v.weight.dtype is not v.dtype:
            raise ValueError(f"kernel {kname}: SoftmaxSum needs float score/weight of its dtype")
        _verify(v.score, scope | {v.var.name}, kname)
        _verify(v.weight, scope | {v.var.name}, kname)


def walk(v: Value):
    """Every distinct value in the tree (shared subtrees once), parents first."""
    seen: set[int] = set()
    stack = [v]
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        yield x
        if isinstance(x, Alu):
            stack.extend(reversed(x.srcs))
        elif isinstance(x, Cast):
            stack.append(x.src)
        elif isinstance(x, Masked):
            stack.append(x.value)
        elif isinstance(x, Reduce):
            stack.append(x.body)
        elif isinstance(x, Gather):
            stack += [x.body, x.row]
        elif isinstance(x, SoftmaxSum):
            stack += [x.weight, x.score]


def substitute(v: Value, mapping: dict[str, sint], memo: dict[Any, Any] | None = None) -> Value:
    """Rename index variables throughout a value tree (used to inline through views). Shared
    subtrees are rewritten once, also under reductions (each scope that hides a variable has
    its own memo); a subtree that does not change is returned as it is."""
    if not mapping:
        return v
    memo = {} if memo is None else memo
    hit = memo.get(id(v))
    if hit is not None:
        return hit
    out = _substitute(v, mapping, memo)
    memo[id(v)] = out
    return out


def _scope(mapping: dict[str, sint], memo: dict[Any, Any], name: str) -> tuple[dict, dict]:
    """The mapping and memo inside a loop over ``name`` (which hides a mapping of it)."""
    if name not in mapping:
        return mapping, memo
    key = ("scope", name)
    inner = memo.get(key)
    if inner is None:
        inner = memo[key] = {"mapping": {k: e for k, e in mapping.items() if k != name}}
    return inner["mapping"], inner


def _substitute(v: Value, mapping: dict[str, sint], memo: dict[Any, Any]) -> Value:
    emem: dict[int, sint] = memo.setdefault(-1, {})
    s = lambda e: sym.substitute(e, mapping, emem)  # noqa: E731
    if isinstance(v, Load):
        valid = s(v.valid)
        if valid == 0:
            return Const(0, v.dtype)
        index = s(v.index)
        return v if index is v.index and valid is v.valid else Load(v.buf, index, valid, v.dtype)
    if isinstance(v, Const):
        return v
    if isinstance(v, IndexVal):
        e = s(v.expr)
        return v if e is v.expr else IndexVal(e, v.dtype)
    if isinstance(v, Alu):
        srcs = tuple(substitute(x, mapping, memo) for x in v.srcs)
        same = all(a is b for a, b in zip(srcs, v.srcs, strict=True))
        return v if same else Alu(v.op, srcs, v.dtype)
    if isinstance(v, Cast):
        src = substitute(v.src, mapping, memo)
        return v if src is v.src else Cast(src, v.dtype)
    if isinstance(v, Masked):
        valid = s(v.valid)
        if valid == 0:
            return Const(0, v.dtype)
        inner_v = substitute(v.value, mapping, memo)
        if valid == 1:
            return inner_v
        return v if valid is v.valid and inner_v is v.value else Masked(valid, inner_v, v.dtype)
    extent = s(v.rows) if isinstance(v, Gather) else s(v.extent)
    imap, imemo = _scope(mapping, memo, v.var.name)
    if isinstance(v, Reduce):
        body = substitute(v.body, imap, imemo)
        same = extent is v.extent and body is v.body
        return v if same else Reduce(v.op, v.var, extent, body, v.dtype)
    if isinstance(v, SoftmaxSum):
        score, weight = substitute(v.score, imap, imemo), substitute(v.weight, imap, imemo)
        same = extent is v.extent and score is v.score and weight is v.weight
        return v if same else SoftmaxSum(v.var, extent, score, weight, v.dtype)
    row = substitute(v.row, mapping, memo)
    body = substitute(v.body, imap, imemo)
    same = row is v.row and extent is v.rows and body is v.body
    return v if same else Gather(v.var, row, extent, body, v.dtype)


def two_way_gather(var: sym.Expr, row: Value, rows: sint, body: Value, dtype: DType) -> Value:
    """A gather whose row is ``b + d * c`` (``b``, ``d`` index values, ``c`` a 0/1 cast of a
    bool: an exact float ``where`` reading one of two sides of a concatenation) as a gather
    over the two choices: ``body`` at ``b`` or at ``b + d``, each substituted statically, so
    their loads keep plain index expressions instead of dividing a runtime row. Any other
    gather is returned as it is."""
    plain = Gather(var, row, rows, body, dtype)
    if not (isinstance(row, Alu) and row.op is Op.ADD):
        return plain
    for base, step in (row.srcs, row.srcs[::-1]):
        if not (isinstance(base, IndexVal) and isinstance(step, Alu) and step.op is Op.MUL):
            continue
        for d, c in (step.srcs, step.srcs[::-1]):
            if not (isinstance(d, IndexVal) and isinstance(c, Cast) and c.src.dtype.name == "bool"):
                continue
            b, other = base.expr, sym.add(base.expr, d.expr)
            # both choices must be rows the gather reads (else it would give 0 there)
            if not all(sym.prove_nonneg(e) and sym.prove_lt(e, rows) for e in (b, other)):
                return plain
            pick = sym.var(var.name + "w", 0, 1, 2)
            sides = [Masked(v, substitute(body, {var.name: e}), dtype)
                     for v, e in ((sym.lt(pick, 1), b), (sym.lt(0, pick), other))]  # fmt: skip
            return Gather(pick, Cast(c.src, c.dtype), 2, Alu(Op.ADD, tuple(sides), dtype), dtype)
    return plain


def _two_way_sides(g: Gather) -> list[Value]:
    """The two sides of a gather made by ``two_way_gather``, else []."""
    b = g.body
    if g.rows != 2 or not (isinstance(b, Alu) and b.op is Op.ADD and len(b.srcs) == 2):
        return []
    want = (sym.lt(g.var, 1), sym.lt(0, g.var))
    if not all(isinstance(m, Masked) and m.valid == w for m, w in zip(b.srcs, want, strict=True)):
        return []
    return [m.value for m in b.srcs if isinstance(m, Masked)]


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
    elif isinstance(v, SoftmaxSum):
        body = free_vars(v.score, memo) | free_vars(v.weight, memo)
        out = (body | _expr_vars(v.extent)) - {v.var.name}
    else:
        out = (free_vars(v.row, memo) | free_vars(v.body, memo) | _expr_vars(v.rows)) - {v.var.name}
    memo[id(v)] = out
    return out


# relative width of one rounding of each float dtype a range is kept for (unit roundoff,
# doubled): a computed bound is widened by it so the range stays conservative; and the
# largest finite value, past which a bound could round to infinity
_ROUNDING = {"f32": 2.0**-23, "f64": 2.0**-52, "f16": 2.0**-10, "bf16": 2.0**-7}
_FINITE = {"f32": 3.4e38, "f64": 1.7e308, "f16": 65504.0, "bf16": 3.38e38}
Range = tuple[float, float]


def _dtype_range(d: DType) -> Range | None:
    if d.kind == "bool":
        return (0, 1)
    if d.kind == "uint":
        return (0, 2**d.bits - 1)
    if d.kind == "int":
        return (-(2 ** (d.bits - 1)), 2 ** (d.bits - 1) - 1)
    return None


def _fit(r: Range | None, d: DType) -> Range | None:
    """``r`` as a range of dtype ``d``: None where an integer could wrap or a float could
    round to infinity; float bounds widened by one rounding."""
    if r is None:
        return None
    lo, hi = r
    if d.is_int or d.kind == "bool":
        dr = _dtype_range(d)
        return r if dr is not None and dr[0] <= lo and hi <= dr[1] else None
    eps = _ROUNDING.get(d.name)
    if eps is None or max(abs(lo), abs(hi)) * (1 + eps) >= _FINITE[d.name]:
        return None
    return (lo - abs(lo) * eps, hi + abs(hi) * eps)


def value_range(v: Value, memo: dict[int, Range | None] | None = None) -> Range | None:
    """Bounds [lo, hi] of every value ``v`` takes, or None when unknown (float loads and
    transcendentals are not tracked, so a tracked float is finite and never NaN). Interval
    arithmetic: loose where operands are correlated, never too narrow. Renderers drop a
    gather's range check when its row provably lies in range (a byte-coded table lookup)."""
    memo = {} if memo is None else memo
    key = id(v)
    if key in memo:
        return memo[key]
    out: Range | None = None
    if isinstance(v, Load):
        out = _dtype_range(v.dtype)
    elif isinstance(v, Const):
        x = float(v.value)
        out = _fit((x, x), v.dtype) if x == x else None
    elif isinstance(v, IndexVal):
        out = _fit((sym.lower_bound(v.expr), sym.upper_bound(v.expr)), v.dtype)
    elif isinstance(v, Masked):
        r = value_range(v.value, memo)
        out = None if r is None else (min(r[0], 0), max(r[1], 0))
    elif isinstance(v, Cast):
        r = value_range(v.src, memo)
        if v.dtype.kind == "bool":
            out = (0, 1)
        elif r is not None and v.dtype.is_int and not v.src.dtype.is_int:
            out = _fit((int(r[0]), int(r[1])), v.dtype)  # C truncates toward zero
        else:
            out = _fit(r, v.dtype)
    elif isinstance(v, Alu) and v.op is Op.LESS_THAN:
        out = (0, 1)
    elif isinstance(v, Alu) and v.op in (Op.ADD, Op.MUL, Op.MOD):
        a, b = (value_range(s, memo) for s in v.srcs)
        if a is not None and b is not None:
            if v.op is Op.ADD:
                out = _fit((a[0] + b[0], a[1] + b[1]), v.dtype)
            elif v.op is Op.MUL:
                ps = [x * y for x in a for y in b]
                out = _fit((min(ps), max(ps)), v.dtype)
            elif b[0] == b[1] != 0:  # fmod by a constant: the dividend's sign, |r| < |b|
                m = abs(b[1]) - (1 if v.dtype.is_int else 0)
                out = (max(a[0], -m) if a[0] < 0 else 0, min(a[1], m) if a[1] > 0 else 0)
    elif isinstance(v, Gather):
        r = value_range(v.body, memo)
        out = None if r is None else (min(r[0], 0), max(r[1], 0))
    memo[key] = out
    return out


def invariant_parts(
    v: Value, inner: frozenset[str], memo: dict[int, frozenset[str]], anywhere: bool = False
) -> list[Value]:
    """Maximal subtrees of ``v`` that use none of the loop variables in ``inner`` (the loop being
    entered and any loop nested in it) and are evaluated unconditionally (not under a mask or
    a gather bound check): safe to compute once, before the loop. With ``anywhere`` (``inner``
    holds every loop variable of ``v``) the parts under masks and gathers count too: a value
    of no loop variable reads one fixed element of a buffer the kernel reads at some point."""
    if not free_vars(v, memo) & inner:
        return [] if isinstance(v, (Const, IndexVal)) else [v]
    rec = lambda x, extra=frozenset(): invariant_parts(x, inner | extra, memo, anywhere)  # noqa: E731
    if isinstance(v, Alu):
        return [p for s in v.srcs for p in rec(s)]
    if isinstance(v, Cast):
        return rec(v.src)
    if isinstance(v, Reduce):
        return rec(v.body, {v.var.name})
    if isinstance(v, Masked):
        return rec(v.value) if anywhere else []
    if isinstance(v, Gather):
        parts = rec(v.row)
        if anywhere:
            return parts + rec(v.body, {v.var.name})
        # both sides of a two-way gather are valid at every point (two_way_gather): what
        # they compute outside ``inner`` (a softmax's row max) is safe to compute first
        for side in _two_way_sides(v):
            parts += rec(side, {v.var.name})
        return parts
    if isinstance(v, SoftmaxSum):
        return rec(v.score, {v.var.name}) + rec(v.weight, {v.var.name})
    return []


@dataclass
class LibCall:
    """A named library routine (e.g. ``gemm``) with a descriptor of named fields; each target
    maps it to a library of its own. ``args`` are buffer ids in the routine's order; ``out``
    is written."""

    name: str
    func: str
    fields: dict[str, sint | float]
    args: list[int]
    out: int
    when: When | None = None  # as Kernel.when

    def verify(self) -> None:
        if self.out not in self.args:
            raise ValueError(f"library call {self.name}: output buffer not among its arguments")


def remap_buffers(v: Value, ids: dict[int, int], memo: dict[int, Value] | None = None) -> Value:
    """The same tree with buffer ids renamed (used to cut kernels out into small plans). Shared
    subtrees are renamed once; a subtree whose buffers keep their ids is returned as it is."""
    memo = {} if memo is None else memo
    hit = memo.get(id(v))
    if hit is not None:
        return hit
    rec = lambda x: remap_buffers(x, ids, memo)  # noqa: E731
    out: Value = v
    if isinstance(v, Load):
        buf = ids[v.buf]
        out = v if buf == v.buf else Load(buf, v.index, v.valid, v.dtype)
    elif isinstance(v, Alu):
        srcs = tuple(rec(s) for s in v.srcs)
        if any(a is not b for a, b in zip(srcs, v.srcs, strict=True)):
            out = Alu(v.op, srcs, v.dtype)
    elif isinstance(v, Cast):
        src = rec(v.src)
        out = v if src is v.src else Cast(src, v.dtype)
    elif isinstance(v, Masked):
        val = rec(v.value)
        out = v if val is v.value else Masked(v.valid, val, v.dtype)
    elif isinstance(v, Reduce):
        body = rec(v.body)
        out = v if body is v.body else Reduce(v.op, v.var, v.extent, body, v.dtype)
    elif isinstance(v, Gather):
        row, body = rec(v.row), rec(v.body)
        same = row is v.row and body is v.body
        out = v if same else Gather(v.var, row, v.rows, body, v.dtype)
    elif isinstance(v, SoftmaxSum):
        sc, w = rec(v.score), rec(v.weight)
        same = sc is v.score and w is v.weight
        out = v if same else SoftmaxSum(v.var, v.extent, sc, w, v.dtype)
    memo[id(v)] = out
    return out


def step_buffers(step: Kernel | LibCall) -> tuple[list[int], list[int]]:
    """(written, read) buffer ids of a kernel or library call."""
    if isinstance(step, LibCall):
        return [step.out], [a for a in step.args if a != step.out]
    reads = {x.buf for x in walk(step.value) if isinstance(x, Load)}
    if step.scatter_row is not None:
        reads |= {x.buf for x in walk(step.scatter_row) if isinstance(x, Load)}
    return [step.out], sorted(reads - {step.out})


def fingerprint(steps: list[Kernel | LibCall]) -> str:
    """A stable digest of kernels and library calls (DAG-aware), for on-disk caches."""

    def fp_val(v: Value) -> str:
        # a node's digest is kept on it (nodes are immutable): the search digests the same
        # trees many times (every candidate of a kernel shares its value)
        hit = v.__dict__.get("_fp")
        if hit is not None:
            return hit
        parts: list[str] = [type(v).__name__, v.dtype.name]
        if isinstance(v, Load):
            parts += [str(v.buf), sym.fingerprint(v.index), sym.fingerprint(v.valid)]
        elif isinstance(v, Const):
            parts.append(repr(v.value))
        elif isinstance(v, IndexVal):
            parts.append(sym.fingerprint(v.expr))
        elif isinstance(v, Alu):
            parts += [v.op.name, *(fp_val(s) for s in v.srcs)]
        elif isinstance(v, Cast):
            parts.append(fp_val(v.src))
        elif isinstance(v, Masked):
            parts += [sym.fingerprint(v.valid), fp_val(v.value)]
        elif isinstance(v, Reduce):
            parts += [v.op.name, sym.fingerprint(v.var), sym.fingerprint(v.extent), fp_val(v.body)]
        elif isinstance(v, SoftmaxSum):
            parts += [sym.fingerprint(v.var), sym.fingerprint(v.extent), fp_val(v.score),
                      fp_val(v.weight)]  # fmt: skip
        else:
            parts += [
                sym.fingerprint(v.var),
                fp_val(v.row),
                sym.fingerprint(v.rows),
                fp_val(v.body),
            ]
        out = hashlib.sha1("|".join(parts).encode()).hexdigest()[:16]
        object.__setattr__(v, "_fp", out)
        return out

    parts = []
    for s in steps:
        if isinstance(s, LibCall):
            fields = ",".join(
                f"{k}={sym.fingerprint(v) if not isinstance(v, float) else v}"
                for k, v in sorted(s.fields.items())
            )
            parts.append(f"lib:{s.func}:{fields}:{s.args}:{s.out}")
        else:
            row = fp_val(s.scatter_row) if s.scatter_row is not None else "-"
            shape = ",".join(sym.fingerprint(x) for x in s.shape)
            parts.append(
                f"k:{shape}:{s.out}:{s.dtype.name}:{fp_val(s.value)}:{row}:{sym.fingerprint(s.scatter_rows)}:{s.row_dims}"
            )
            if s.schedule is not None:  # absent by default, so older digests stay valid
                parts[-1] += f":{s.schedule.split},{s.schedule.chunk}"
                if s.schedule.order:
                    parts[-1] += f",o{s.schedule.order}"
                if s.schedule.jam != -1:
                    parts[-1] += f",j{s.schedule.jam}@{s.schedule.jam_dim}"
                if s.schedule.jam2 > 1:
                    parts[-1] += f",c{s.schedule.jam2}"
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]
