"""Schedule rewrites on the kernel IR: loop structure changes that keep the value.

A kernel's schedule is explicit (``K.Schedule``: split factor, chunk, task order, jam); the search
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

Jamming an output dim (register blocking): when each element of a kernel runs a reduction whose
body has work that does not depend on an outer output dim (a weight's load and, for quantized
weights, its whole dequantization), ``jam`` elements along that dim are computed by one loop
of the reduction, with one accumulator each, and the shared work is done once for all of
them. ``jammed`` gives the renderers the copies of the value (one per element of a block)
and, for each reduction, its copy in each, so they can merge the loops. By default a kernel
whose shared work is a dequantization is jammed by ``DEFAULT_JAM``, or, where its jammed dim
may be longer, blocked by ``DEFAULT_QBLOCK`` rows and columns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

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
    """The largest split (inner extent a power of two up to ``DEFAULT_SPLIT_MAX``, else a
    constant the body divides the variable by) after which no index divides or takes a
    modulus of the inner variable; ``r`` itself when none helps. A convolution's taps summed
    as one axis (channel x kernel rows x kernel columns) split by the kernel width: the row
    and its padding test are computed once per row, not per tap."""
    for g in (g for g in (64, 32, 16, 8, 4, 2) if g <= DEFAULT_SPLIT_MAX):
        out = _split_by(r, g)
        if out is not None:
            return out
    found: set[int] = set()
    seen: set[int] = set()
    for e in _index_exprs(r.body):
        _divisors_of(e, r.var.name, found, seen)
    for g in sorted(found, reverse=True):
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


# _rebuild's answers per (tree, split), each held with its tree (so the id is not reused):
# the search applies a kernel's 30-50 schedules, which use a few splits
_REBUILT: dict[tuple[int, int], tuple[K.Value, K.Value]] = {}
REBUILT_KEPT = 1024


def _rebuilt(v: K.Value, split: int) -> K.Value:
    hit = _REBUILT.get((id(v), split))
    if hit is not None and hit[0] is v:
        return hit[1]
    if len(_REBUILT) >= REBUILT_KEPT:
        _REBUILT.clear()
    out = _REBUILT[(id(v), split)] = (v, _rebuild(v, {}, split))
    return out[1]


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
    chunk and jam (a jam that does not apply to ``k`` is dropped from it)."""
    if not isinstance(k, K.Kernel):
        return k
    if k.scheduled:  # rewritten already: a split is not split again
        if sched is not None and sched != k.schedule:
            raise ValueError(f"kernel {k.name} has schedule {k.schedule} applied, not {sched}")
        return k
    sched = sched or k.schedule or K.Schedule()
    value = _rebuilt(k.value, sched.split)
    done = replace(k, value=value)
    if sched.jam < 0:  # the default rule
        d = jam_dim(done)
        dequantizes = d is not None and shared_work(done, d) >= DEFAULT_JAM_SHARED
        jam = default_jam(done, d) if dequantizes and d is not None else 0
        sched = replace(sched, jam=jam, jam_dim=d or 0)
        if dequantizes and d is not None and _default_qblock(done, d):
            sched = replace(sched, jam=DEFAULT_QBLOCK[0], jam2=DEFAULT_QBLOCK[1])
        rows, cols = DEFAULT_BLOCK
        if not dequantizes and sched.jam2 == 0 and cols > 1 and _vector_products(done):
            sched = replace(sched, jam=rows if d is not None else 0, jam2=cols)
    if sched.jam > 1 and not jam_applies(done, sched.jam_dim):
        sched = replace(sched, jam=0, jam_dim=0)
    if sched.jam2 > 1 and not jam2_applies(done):
        sched = replace(sched, jam2=0)
    return replace(done, schedule=sched, scheduled=True)


def _written_out(r: K.Reduce) -> bool:
    """A reduction of 2-4 values that code generation writes out (no loop), unless split."""
    return isinstance(r.extent, int) and r.extent <= 4 and not isinstance(r.body, K.Reduce)


# The default jam, where the shared work is at least DEFAULT_JAM_SHARED nodes (a weight's
# dequantization: Q8_0's is 4, Q4_1's 10; an f32 weight's load is 1, and its products mostly
# go to the library). Set by bench/rowjam.py (1 thread, 8-lane vectors, 16 registers): with
# one named accumulator per row (the renderer's jammed form) a jam of 8 ran as fast as 4
# from 1 to 8 rows and 1.15-1.25x faster at 32 and 64 (Q4_1 1536 x 576: 1.51 against 1.81
# ms at 64 rows; Q8_0 12288 x 576: 15.2 against 19.3). The search measures 2, 4, 8, none
# and the target's 2-D blocks.
DEFAULT_JAM = 8
DEFAULT_JAM_SHARED = 4
# The default block (rows, columns) of products by a dequantized weight whose jammed dim may
# exceed a jam (a batched decode step's rows): a block of more rows than a target's registers
# hold runs its rows over the columns' weight dequantized once into a panel, up to
# DEFAULT_JAM rows in jams of ``default_jam`` (the same code as the default jam). Set by
# SmolLM2's batched decode step (1 thread, 8-lane vectors, 16 registers): 0.85x the step
# time of the default jam at 12-16 rows, 0.78x at 32, the same at 1-8.
DEFAULT_QBLOCK = (32, 2)
# The default jam is halved where a block's operand rows (its activations, read again for
# every output column) exceed JAM_ROW_BYTES, a 32 KiB L1 data cache. Set by bench/rowjam.py
# (Q4_1, 1 thread): at k = 1536 (6 KiB rows) a jam of 8 ran 1.35-1.4x slower than a jam of 4
# at 16-64 rows; at k = 4096 a jam of 4 ran as fast as 8 and 2 up to 16 rows, 1.35x faster
# than 2 at 64 (rows out of L1 either way: not halved twice).
JAM_ROW_BYTES = 32 << 10


def jam_row_bytes(k: K.Kernel, d: int) -> int:
    """Bytes one element of output dim ``d`` reads along its reductions (a jam of J reads J
    such rows of the operand that differs along ``d``)."""
    name = f"_i{d}"
    row = 0
    for r in _jam_reduces(k, d):
        n = 1
        for x in K.walk(r):
            if isinstance(x, K.Reduce):
                n *= sym.upper_bound(x.extent)
        row += n * sum(max(1, x.dtype.bits // 8) for x in _vector_loads(r.body, name))
    return row


def _default_qblock(k: K.Kernel, d: int) -> bool:
    """Whether the default gives dequantizing kernel ``k`` the block ``DEFAULT_QBLOCK``: its
    jammed dim ``d`` may hold more rows than ``DEFAULT_JAM`` and its innermost dim can be
    jammed too."""
    return sym.upper_bound(k.shape[d]) > DEFAULT_JAM and jam2_applies(k)


def default_jam(k: K.Kernel, d: int) -> int:
    """``DEFAULT_JAM``, halved once where ``DEFAULT_JAM`` rows of what each element of dim
    ``d`` reads along its reductions exceed ``JAM_ROW_BYTES``."""
    return DEFAULT_JAM if DEFAULT_JAM * jam_row_bytes(k, d) <= JAM_ROW_BYTES else DEFAULT_JAM // 2


# The default 2-D block (rows, columns) of products of plain float sums with unit-stride
# loads, so the library-call stage times the generated kernel blocked. Set by
# bench/tiles.py (f32, M 17-128 by BERT's and SmolLM2's K x N, 2 threads, 8-lane vectors):
# 3 x 3 was the fastest block at 8 of 12 sizes and 1.5-6x faster than no block at every one;
# its 9 accumulators and 6 loaded vectors fit 16 vector registers.
DEFAULT_BLOCK = (3, 3)


def top_reduces(v: K.Value) -> list[K.Reduce]:
    """The reductions every element evaluates in a loop of its own, outermost, in a fixed
    order: reached through ALU ops, casts and written-out reductions (each value of their
    variable substituted, as code generation does: a relu's padded max of two), but not
    under a mask or a gather, whose loads may be out of range where they do not run."""
    out: list[K.Reduce] = []
    seen: set[K.Value] = set()

    def visit(x: K.Value) -> None:
        if x in seen:
            return
        seen.add(x)
        if isinstance(x, K.Reduce) and _written_out(x):
            assert isinstance(x.extent, int)
            for i in range(x.extent):
                visit(K.substitute(x.body, {x.var.name: i}))
        elif isinstance(x, K.Reduce):
            out.append(x)
        elif isinstance(x, K.Alu):
            for s in x.srcs:
                visit(s)
        elif isinstance(x, K.Cast):
            visit(x.src)

    visit(v)
    return out


def _jam_positions(k: K.Kernel, dim: int, tops: list[K.Reduce]) -> list[int]:
    """Which of ``k``'s top reductions ``tops`` run a loop per element along output dim
    ``dim`` (their copies in a jammed block differ)."""
    memo: dict[int, frozenset[str]] = {}
    want = {f"_i{dim}", f"_i{len(k.shape) - 1}"}
    return [i for i, r in enumerate(tops) if want <= K.free_vars(r, memo)]


def _jam_reduces(k: K.Kernel, dim: int) -> list[K.Reduce]:
    tops = top_reduces(k.value)
    return [tops[i] for i in _jam_positions(k, dim, tops)]


def shared_work(k: K.Kernel, dim: int) -> int:
    """Nodes of the per-element reductions' bodies that a jam of output dim ``dim`` computes
    once per block: those that use the reduction's variables (the rest leaves the loop
    anyway) but not ``dim``'s index."""
    memo: dict[int, frozenset[str]] = {}
    name = f"_i{dim}"
    n = 0
    for r in _jam_reduces(k, dim):
        loop = {x.var.name for x in K.walk(r) if isinstance(x, K.Reduce)}
        # a gather's variable stands for its row: where the row depends on the dim, so does
        # what the body reads through it (a weight gathered by each row's expert is no load
        # the rows of a block share)
        per_dim = {name}
        for x in K.walk(r.body):
            if isinstance(x, K.Gather) and K.free_vars(x.row, memo) & per_dim:
                per_dim.add(x.var.name)
        for x in K.walk(r.body):
            if isinstance(x, (K.Const, K.IndexVal, K.Reduce)):
                continue
            fv = K.free_vars(x, memo)
            if fv & loop and not fv & per_dim:
                n += 1
    return n


def jam_applies(k: K.Kernel, dim: int) -> bool:
    """Whether output dim ``dim`` of ``k`` can be jammed: an outer dim (the innermost is the
    vector loop) of a kernel whose elements each run a reduction along it, that writes plain
    rows (no scatter) and does not read its own output (a block computes before it stores)."""
    n = len(k.shape)
    if k.scatter_row is None and 0 <= dim < n - 1:
        reads = {x.buf for x in K.walk(k.value) if isinstance(x, K.Load)}
        return k.out not in reads and bool(_jam_reduces(k, dim))
    return False


def jam2_applies(k: K.Kernel) -> bool:
    """Whether the innermost output dim of ``k`` can be jammed too (``K.Schedule.jam2``):
    each element runs a reduction along it whose body has work that does not depend on it
    (the other operand of a product: a row of activations), and ``k`` writes plain rows and
    does not read its own output."""
    n = len(k.shape)
    if k.scatter_row is not None or n == 0 or sym.upper_bound(k.shape[-1]) < 2:
        return False
    reads = {x.buf for x in K.walk(k.value) if isinstance(x, K.Load)}
    return k.out not in reads and shared_work(k, n - 1) > 0


def jam_dim(k: K.Kernel) -> int | None:
    """The outer output dim whose jam shares the most work (ties: the longer dim, then the
    outer one), or None when no dim of at least two indices shares any."""
    best: tuple[int, int, int] | None = None
    for d in range(len(k.shape) - 1):
        if sym.upper_bound(k.shape[d]) < 2 or not jam_applies(k, d):
            continue
        key = (shared_work(k, d), sym.upper_bound(k.shape[d]), -d)
        if key[0] > 0 and (best is None or key > best):
            best = key
    return None if best is None else -best[2]


@dataclass
class Jammed:
    """A kernel's values for the elements of a jammed block: ``values[a][b]`` has index
    variable ``rows[a]`` where the kernel has the jammed dim's and ``cols[b]`` where it has
    the innermost dim's (a dim that is not jammed keeps its own variable, as the single entry
    of its list). ``groups`` holds, for each top reduction that runs per element along every
    jammed dim, its copy in each value, ``[a][b]`` alike (the loops a renderer merges)."""

    rows: list[sym.Expr]
    cols: list[sym.Expr]
    values: list[list[K.Value]]
    groups: list[list[list[K.Reduce]]]


def _copies(dim: int, extent: sym.sint, size: int) -> tuple[sym.Expr, list[sym.Expr]]:
    ix = sym.index_var(dim, extent)
    assert isinstance(ix, sym.Expr)
    if size <= 1:
        return ix, [ix]
    _, lo, hi, ext = ix.args
    return ix, [sym.var(f"_i{dim}j{j}", lo, hi, ext) for j in range(size)]


def jammed(k: K.Kernel) -> Jammed:
    """``k``'s values for the elements of one full block of its schedule's jams."""
    sched = k.schedule
    assert sched is not None and (sched.jam > 1 or sched.jam2 > 1)
    n = len(k.shape)
    row_dim = sched.jam_dim if sched.jam > 1 else None
    col_ix, cols = _copies(n - 1, k.shape[-1], sched.jam2)
    if row_dim is None:
        row_ix, rows = None, [col_ix]  # a placeholder row: the kernel's own variables
    else:
        row_ix, rows = _copies(row_dim, k.shape[row_dim], sched.jam)
    tops = top_reduces(k.value)
    memo: dict[int, frozenset[str]] = {}
    want = {col_ix.name} | ({row_ix.name} if row_ix is not None else set())
    where = [i for i, r in enumerate(tops) if want <= K.free_vars(r, memo)]
    out = Jammed(rows if row_ix is not None else [], cols, [], [])
    out.groups = [[] for _ in where]
    for rv in rows:
        out.values.append([])
        for grp in out.groups:
            grp.append([])
        for cv in cols:
            mapping: dict[str, sym.sint] = {col_ix.name: cv} if cv is not col_ix else {}
            if row_ix is not None:
                mapping[row_ix.name] = rv
            value = K.substitute(k.value, mapping) if mapping else k.value
            out.values[-1].append(value)
            # the same walk over a renamed copy: the same reductions in the same order
            copies = top_reduces(value)
            assert len(copies) == len(tops)
            for grp, i in zip(out.groups, where, strict=True):
                grp[-1].append(copies[i])
    return out


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
    if 1 in space.orders and len(k.shape) >= 2 and reduces_per_element(k):
        # the other task order: worth it when an operand shared by every outer index (a
        # weight) is larger than a cache and the outer extent is small (a product of few rows)
        out += [K.Schedule(s, c, 1) for c in (0, *space.chunks) for s in (-1, *space.splits)]
    d = jam_dim(k) if space.jams or space.blocks or space.qblocks else None
    # where the default is DEFAULT_QBLOCK (rows that may exceed a jam), blocks of fewer rows
    # are not offered: up to a jam's rows they run the default's code or dequantize more
    # often, past it they dequantize more often, and the search measures at a few rows
    # (``representative_dims``), where it cannot tell (SmolLM2's batched step: jams of 4
    # picked at 6 rows ran the 16-row step 1.2x slower than the default)
    long = d is not None and shared_work(k, d) >= DEFAULT_JAM_SHARED and _default_qblock(k, d)
    if d is not None and space.jams:
        # register blocks of a few rows sharing each load (and dequantization) of a weight;
        # in order 1 a thread's blocks share a chunk of weight rows, for longer products
        jams = (0, *([] if long else space.jams))  # none too: the default may jam
        out += [K.Schedule(s, 0, 0, j, d) for j in jams for s in (-1, *space.splits)]
        if 1 in space.orders and not long:
            out += [K.Schedule(-1, 0, 1, j, d) for j in space.jams]
    blocks = space.blocks if _plain_sums(k) else space.qblocks if _split_sums(k) else ()
    if blocks and jam2_applies(k):
        # 2-D register blocks: R rows share each weight load (and dequantization), C columns
        # each row load
        # (a quantized weight's in either split of its blocks: Q8_0's by 32 ran 1.1-1.3x
        # faster than the default 16 in bench/rowjam.py's blocks)
        splits = (-1, *space.splits) if blocks is space.qblocks else (-1,)
        for r, c in blocks:
            if r > 1 and d is None or long and r < DEFAULT_QBLOCK[0]:
                continue
            out += [K.Schedule(s, 0, o, r if r > 1 else 0, d or 0, c)
                    for o in space.orders for s in splits]  # fmt: skip
    return out


def _vector_products(k: K.Kernel) -> bool:
    """Plain sums (``_plain_sums``) whose loads that vary along the sum are unit-stride in it:
    the products a 2-D block computes as vectors (a strided weight stays scalar)."""
    if not (_plain_sums(k) and jam2_applies(k)):
        return False
    for r in _jam_reduces(k, len(k.shape) - 1):
        for x in _vector_loads(r.body, r.var.name):
            step = sym.add(sym.substitute(x.index, {r.var.name: sym.add(r.var, 1)}),
                           sym.mul(x.index, -1))  # fmt: skip
            if step != 1:
                return False
    return True


def _plain_sums(k: K.Kernel) -> bool:
    """Whether every reduction each element runs along the innermost dim is a plain float
    sum (straight-line body, no block structure a default split would cut): a 2-D block holds
    one vector accumulator per element, which a split sum's several would overflow."""
    tops = _jam_reduces(k, len(k.shape) - 1)
    return bool(tops) and all(
        r.op is Op.SUM_REDUCE
        and r.dtype.is_float
        and not _has_divmod_of(r.body, r.var.name)
        and not any(
            isinstance(x, (K.Reduce, K.Gather, K.Masked, K.SoftmaxSum)) for x in K.walk(r.body)
        )
        for r in tops
    )


def _split_sums(k: K.Kernel) -> bool:
    """Whether every reduction each element runs along the innermost dim is a float sum over
    a block-structured operand (a quantized weight: the default split cuts it into blocks)
    with a straight-line body: the products ``ScheduleSpace.qblocks`` block."""
    tops = _jam_reduces(k, len(k.shape) - 1)
    return bool(tops) and all(
        r.op is Op.SUM_REDUCE
        and r.dtype.is_float
        and _has_divmod_of(r.body, r.var.name)
        and not any(
            isinstance(x, (K.Reduce, K.Gather, K.Masked, K.SoftmaxSum)) for x in K.walk(r.body)
        )
        for r in tops
    )


def reduces_per_element(k: K.Kernel) -> bool:
    """Whether each output element runs a reduction of its own (a dot product per element):
    the kernels whose tasks are chunks of a few elements, where the task order matters."""
    inner = f"_i{len(k.shape) - 1}"
    memo: dict[int, frozenset[str]] = {}
    return any(isinstance(x, K.Reduce) and inner in K.free_vars(x, memo) for x in K.walk(k.value))


def schedule(kernels: Sequence[Step]) -> list[Step]:
    """Every kernel with its schedule applied (its own, or the default rules)."""
    return [apply(k) for k in kernels]
