"""Schedule rewrites on the kernel IR: loop structure changes that keep the value.

``split_blocked_reductions``: a reduction whose body indexes memory with ``r // c`` or
``r % c`` (the block structure of quantized weights: a scale per 32 values, two nibbles per
byte) is split into ``r = g*ro + ri`` with the largest power-of-two ``g`` (up to 16) for
which the symbolic simplifier turns every such index into an affine function of ``ri`` (moving the
block-constant parts onto ``ro``), so the inner loop has unit-stride loads that vectorize
and the per-block scale is loaded once per block instead of once per element. When the two
halves of a split block read the same bytes (the two nibbles of 4-bit weights), they are
computed in one inner loop so each byte is loaded and unpacked once.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..graph import symbolic as sym
from ..graph.ops import Op
from . import kernel_ir as K

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


def _split(r: K.Reduce) -> K.Reduce:
    """The largest split (inner extent a power of two up to 16) after which no index divides
    or takes a modulus of the inner variable; ``r`` itself when none helps. 16 floats are one
    AVX-512 register; GCC 12 fails to vectorize int8 -> f32 loops of 32 (Q8_0 rows ran 1.6x
    slower split by 32)."""
    if not isinstance(r.extent, int) or not _has_divmod_of(r.body, r.var.name):
        return r
    for g in (16, 8, 4, 2):
        if r.extent % g or r.extent == g:
            continue
        outer = sym.var(r.var.name + "o", 0, r.extent // g - 1, r.extent // g)
        inner = sym.var(r.var.name + "i", 0, g - 1, g)
        body = K.substitute(r.body, {r.var.name: sym.add(sym.mul(outer, g), inner)})
        if not _has_divmod_of(body, inner.name):
            inner_r = K.Reduce(r.op, inner, g, body, r.dtype)
            return K.Reduce(r.op, outer, r.extent // g, inner_r, r.dtype)
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


def _rebuild(v: K.Value, memo: dict[int, K.Value]) -> K.Value:
    hit = memo.get(id(v))
    if hit is not None:
        return hit
    out: K.Value
    if isinstance(v, K.Alu):
        srcs = tuple(_rebuild(s, memo) for s in v.srcs)
        out = v if all(a is b for a, b in zip(srcs, v.srcs)) else K.Alu(v.op, srcs, v.dtype)
    elif isinstance(v, K.Cast):
        s = _rebuild(v.src, memo)
        out = v if s is v.src else K.Cast(s, v.dtype)
    elif isinstance(v, K.Masked):
        s = _rebuild(v.value, memo)
        out = v if s is v.value else K.Masked(v.valid, s, v.dtype)
    elif isinstance(v, K.Reduce):
        body = _rebuild(v.body, memo)
        r = v if body is v.body else K.Reduce(v.op, v.var, v.extent, body, v.dtype)
        out = _split(r)
        if out is not r:
            out = _jam_pairs(out)
    elif isinstance(v, K.Gather):
        row, body = _rebuild(v.row, memo), _rebuild(v.body, memo)
        same = row is v.row and body is v.body
        out = v if same else K.Gather(v.var, row, v.rows, body, v.dtype)
    else:
        out = v
    memo[id(v)] = out
    return out


def split_blocked_reductions(k: Step) -> Step:
    if not isinstance(k, K.Kernel):
        return k
    value = _rebuild(k.value, {})
    if value is k.value:
        return k
    return K.Kernel(k.name, k.shape, k.out, value, k.dtype, k.scatter_row, k.scatter_rows,
                    k.row_dims, k.reads)  # fmt: skip


# Kernel-level schedule passes, in order (each Kernel -> Kernel, value-preserving).
PASSES = (split_blocked_reductions,)


def schedule(kernels: Sequence[Step]) -> list[Step]:
    out = list(kernels)
    for p in PASSES:
        out = [p(k) for k in out]
    return out
