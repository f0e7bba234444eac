"""Schedule rewrites on the kernel IR: loop structure changes that keep the value.

A kernel's schedule is explicit (``K.Schedule``: split factor, chunk); the search
(compiler/search/schedules.py) picks one per kernel by measurement, and a kernel without one
gets the default rules below.

Splitting reductions: a reduction whose body indexes memory with ``r // c`` or ``r % c`` (the
block structure of quantized weights: a scale per 32 values, two nibbles per byte) is split
into ``r = g*ro + ri`` so that the symbolic simplifier turns every such index into an affine
function of ``ri`` (moving the block-constant parts onto ``ro``): the inner loop has
unit-stride loads that vectorize and the per-block scale is loaded once per block instead of
once per element. By default ``g`` is the largest power of two up to 16 that does this. An
explicit split ``g`` also splits plain float sums with a short straight-line body (a GEMV
row): the code generator keeps a vector of ``g`` partial sums across the outer loop. When the
two halves of a split block read the same bytes (the two nibbles of 4-bit weights), they are
computed in one inner loop so each byte is loaded and unpacked once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ..graph import symbolic as sym
from ..graph.ops import Op
from . import kernel_ir as K
from .target import ScheduleSpace

Step = K.Kernel | K.LibCall


def _divisors_of(e: sym.sint, name: str, out: set[int], seen: set[int]) -> None:
    """Constant divisors c of every ``x // c`` / ``x % c`` in ``e`` whose ``x`` uses ``name``."""
    if not isinstance(e, sym.Expr) or id(e) in seen:
        return
    seen.add(id(e))
    if e.kind in (sym.DIV, sym.MOD):
        a, b = e.args
        if isinstance(b, int) and isinstance(a, sym.Expr) and any(v.name == name for v in a.vars()):
            out.add(b)
    if e.kind == sym.ADD:
        for t, _ in e.args[0]:
            _divisors_of(t, name, out, seen)
    elif e.kind != sym.VAR:
        for a in e.args:
            _divisors_of(a, name, out, seen)


def _index_exprs(v: K.Value):
    for x in K.walk(v):
        if isinstance(x, K.Load):
            yield x.index
            yield x.valid
        elif isinstance(x, K.IndexVal):
            yield x.expr
        elif isinstance(x, K.Masked):
            yield x.valid


def _has_divmod_of(v: K.Value, name: str) -> bool:
    found: set[int] = set()
    seen: set[int] = set()
    for e in _index_exprs(v):
        _divisors_of(e, name, found, seen)
        if found:
            return True
    return False


def _split_by(r: K.Reduce, g: int) -> K.Reduce | None:
    """``r`` as Reduce(ro, Reduce(ri, body[r = g*ro + ri])), or None when ``g`` does not divide
    the extent or leaves an index that divides or takes a modulus of ``ri``."""
    if not isinstance(r.extent, int) or g < 2 or r.extent % g or r.extent == g:
        return None
    outer = sym.var(r.var.name + "o", 0, r.extent // g - 1, r.extent // g)
    inner = sym.var(r.var.name + "i", 0, g - 1, g)
    body = K.substitute(r.body, {r.var.name: sym.add(sym.mul(outer, g), inner)})
    if _has_divmod_of(body, inner.name):
        return None
    return K.Reduce(r.op, outer, r.extent // g, K.Reduce(r.op, inner, g, body, r.dtype), r.dtype)


# The default split's largest inner extent. Set by measurement: Q8_0 rows split by 32 ran
# 1.6x slower than by 16 (the compiler failed to vectorize their int8 -> f32 loops of 32).
DEFAULT_SPLIT_MAX = 16


def _default_split(r: K.Reduce) -> K.Reduce:
    """The largest split (inner extent a power of two up to ``DEFAULT_SPLIT_MAX``) after
    which no index divides or takes a modulus of the inner variable; ``r`` itself when none
    helps."""
    for g in (g for g in (64, 32, 16, 8, 4, 2) if g <= DEFAULT_SPLIT_MAX):
        out = _split_by(r, g)
        if out is not None:
            return out
    return r


def _plain_sum(r: K.Reduce) -> bool:
    """A float sum whose body is straight-line code: split, it becomes a vector of partial sums
    (codegen's blocked sum), an alternative to the compiler's vectorized reduction."""
    return (
        r.op is Op.SUM_REDUCE
        and r.dtype.is_float
        and isinstance(r.extent, int)
        and not any(
            isinstance(x, (K.Reduce, K.Gather, K.Masked, K.SoftmaxSum)) for x in K.walk(r.body)
        )
    )


def _split(r: K.Reduce, split: int) -> K.Reduce:
    """``r`` split as the schedule's ``split`` says (see ``K.Schedule``)."""
    if split == 0 or not isinstance(r.extent, int):
        return r
    if _has_divmod_of(r.body, r.var.name):
        return (_split_by(r, split) if split > 0 else None) or _default_split(r)
    if split > 0 and _plain_sum(r):
        return _split_by(r, split) or r
    return r


def _vector_loads(v: K.Value, name: str) -> set[K.Load]:
    """Loads in ``v`` whose index uses loop variable ``name``."""
    out = set()
    for x in K.walk(v):
        if isinstance(x, K.Load) and isinstance(x.index, sym.Expr):
            if any(y.name == name for y in x.index.vars()):
                out.add(x)
    return out


def _jam_pairs(r: K.Reduce) -> K.Reduce:
    """Reduce(ro, Reduce(ri, body)) -> Reduce(rb, Reduce(ri, body[ro=2rb] + body[ro=2rb+1]))
    when the two copies load the same memory in the inner loop (both nibbles of a byte):
    each byte is then read and unpacked once."""
    inner = r.body
    if not (
        isinstance(inner, K.Reduce)
        and r.op is Op.SUM_REDUCE
        and inner.op is Op.SUM_REDUCE
        and isinstance(r.extent, int)
        and r.extent % 2 == 0
        and r.extent > 2
    ):
        return r
    rb = sym.var(r.var.name + "b", 0, r.extent // 2 - 1, r.extent // 2)
    copies = [K.substitute(inner.body, {r.var.name: sym.add(sym.mul(rb, 2), h)}) for h in (0, 1)]
    if not _vector_loads(copies[0], inner.var.name) & _vector_loads(copies[1], inner.var.name):
        return r
    body = K.Alu(Op.ADD, (copies[0], copies[1]), r.dtype)
    return K.Reduce(
        r.op, rb, r.extent // 2, K.Reduce(r.op, inner.var, inner.extent, body, r.dtype), r.dtype
    )


def _rebuild(v: K.Value, memo: dict[int, K.Value], split: int) -> K.Value:
    hit = memo.get(id(v))
    if hit is not None:
        return hit
    out: K.Value
    if isinstance(v, K.Alu):
        srcs = tuple(_rebuild(s, memo, split) for s in v.srcs)
        out = v if all(a is b for a, b in zip(srcs, v.srcs)) else K.Alu(v.op, srcs, v.dtype)
    elif isinstance(v, K.Cast):
        s = _rebuild(v.src, memo, split)
        out = v if s is v.src else K.Cast(s, v.dtype)
    elif isinstance(v, K.Masked):
        s = _rebuild(v.value, memo, split)
        out = v if s is v.value else K.Masked(v.valid, s, v.dtype)
    elif isinstance(v, K.Reduce):
        body = _rebuild(v.body, memo, split)
        r = v if body is v.body else K.Reduce(v.op, v.var, v.extent, body, v.dtype)
        out = _split(r, split)
        if out is not r:
            out = _jam_pairs(out)
    elif isinstance(v, K.Gather):
        row, body = _rebuild(v.row, memo, split), _rebuild(v.body, memo, split)
        same = row is v.row and body is v.body
        out = v if same else K.Gather(v.var, row, v.rows, body, v.dtype)
    else:
        out = v
    memo[id(v)] = out
    return out


def apply(k: Step, sched: K.Schedule | None = None) -> Step:
    """``k`` with the loop structure of ``sched`` (default: the kernel's own schedule, else
    the default rules). The result keeps the schedule, so code generation can read its
    chunk."""
    if not isinstance(k, K.Kernel):
        return k
    sched = sched or k.schedule or K.Schedule()
    value = _rebuild(k.value, {}, sched.split)
    if value is k.value and sched == k.schedule:
        return k
    return replace(k, value=value, schedule=sched)


def alternatives(k: Step, space: ScheduleSpace | None = None) -> list[K.Schedule]:
    """Schedules of the target's ``space`` worth comparing for ``k``, the default first; []
    when ``k`` has no reduction a schedule changes (the search then leaves it alone).
    Schedules that give the same loops are removed by the caller (it compares generated
    code)."""
    space = space or ScheduleSpace()
    if not isinstance(k, K.Kernel) or k.scatter_row is not None or not space.splits:
        return []
    reduces = [x for x in K.walk(k.value) if isinstance(x, K.Reduce)]
    if not any(isinstance(r.extent, int) and r.extent >= 2 * min(space.splits) for r in reduces):
        return []
    splits = (-1, 0, *space.splits)
    out = [K.Schedule(s, c) for c in (0, *space.chunks) for s in splits]
    if 1 in space.orders and len(k.shape) >= 2 and _reduces_per_element(k):
        # the other task order: worth it when an operand shared by every outer index (a
        # weight) is larger than a cache and the outer extent is small (a product of few rows)
        out += [K.Schedule(s, c, 1) for c in (0, *space.chunks) for s in (-1, *space.splits)]
    return out


def _reduces_per_element(k: K.Kernel) -> bool:
    """Whether each output element runs a reduction of its own (a dot product per element):
    the kernels whose tasks are chunks of a few elements, where the task order matters."""
    inner = f"_i{len(k.shape) - 1}"
    memo: dict[int, frozenset[str]] = {}
    return any(isinstance(x, K.Reduce) and inner in K.free_vars(x, memo) for x in K.walk(k.value))


def schedule(kernels: Sequence[Step]) -> list[Step]:
    """Every kernel with its schedule applied (its own, or the default rules)."""
    return [apply(k) for k in kernels]
