"""A jammed kernel's tasks (``K.Schedule.jam``; ``compiler/schedule.py::jammed``): a task is a
block of ``jam`` indices of the jammed dim at one chunk of the innermost dim. For each element
of the chunk, every reduction along the jammed dim runs one loop for the whole block, one
accumulator per index, and what the copies of its body share (a weight's loads and
dequantization) is emitted once per iteration: the emitter's memo finds the equal subtrees.

The last block of a dim whose extent is not a multiple of ``jam`` runs its indices in
smaller blocks, one per binary digit of their count, except that a block of ``p`` takes the
rest when at least 3/4 of ``p`` is left (computing the missing rows again from the last
one, unstored): 7 rows of a jam of 8 run as one block of 8, 3 as one of 4, 5 as 4 and 1, so
a decode step's one row runs the plain kernel's code. A chunk's last columns past its last
full block of ``jam2`` run in that block the same way, the missing columns computed again
from the last one (a block per rest size: more C to compile, for one step of the chunk).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ...compiler import kernel_ir as K
from ...compiler.schedule import default_jam, jammed
from ...graph import dtypes as dt
from ...graph import symbolic as sym
from ...graph.ops import Op
from ...graph.symbolic import sint
from .panel import PANEL_MIN_ROWS, PANEL_SUB, panel_task
from .vector import (
    ACC_CHAINS,
    BLOCK_LANES,
    _accumulate,
    _digits,
    _flat,
    _shared_loads,
    _terms,
    _Unsupported,
    _Vec,
)

if TYPE_CHECKING:
    from ..cstyle import Emitter


def jam_reduce(em: Emitter, rs: list[K.Reduce], ind: str, vector: bool = False) -> list[str]:
    """The copies ``rs`` of one reduction (alike but for the jammed indices) in one loop; the
    C name of each result. ``vector``: plain float sums as explicit vectors (a 2-D block)."""
    from ..cstyle import _blocked_sum, _c_name, cexpr, ctype, reduce_init, reduce_update

    r0 = rs[0]
    if em.simd_reductions and _blocked_sum(r0) and len(rs) > 1:
        got = _split_sums(em, rs, ind)
        return got if got is not None else _blocked_scalar(em, rs, ind)
    if len(rs) == 1 or isinstance(r0.extent, int) and r0.extent <= 4:  # one, or written out
        return [em.emit(r, ind) for r in rs]
    if em.simd_reductions and vector:
        got = _vector_sums(em, rs, ind)
        if got is not None:
            return got
    for r in rs:
        em.hoist(r.body, frozenset({r.var.name}), ind)
    t = ctype(r0.dtype)
    accs = [em.tmp() for _ in rs]
    em.lines.append(f"{ind}{t} {', '.join(f'{a} = {reduce_init(r0.op, r0.dtype)}' for a in accs)};")
    rv = _c_name(r0.var)
    head = len(em.lines)
    em.lines.append(f"{ind}for ({em.index_type} {rv} = 0; {rv} < {cexpr(r0.extent)}; ++{rv}) {{")

    def body() -> None:
        xs = [em.emit(r.body, ind + "  ") for r in rs]
        for a, x in zip(accs, xs, strict=True):
            em.lines.append(f"{ind}  {a} = {reduce_update(r0.op, r0.dtype, a, x)};")

    em.block(body)
    em.lines.append(f"{ind}}}")
    if em.simd_reductions and r0.op is Op.SUM_REDUCE and r0.dtype.is_float:
        if not any("{" in ln or "}" in ln for ln in em.lines[head + 1 : -1]):
            # straight-line body: let the compiler reassociate these sums
            em.lines.insert(head, f"{ind}#pragma omp simd reduction(+:{','.join(accs)})")
    return accs


def _vector_sums(em: Emitter, rs: list[K.Reduce], ind: str) -> list[str] | None:
    """Plain float sums (straight-line bodies, loads unit-stride in the summed variable: a
    block of dot products) with one native vector accumulator per copy, the copies' shared
    vectors loaded once per step; the last ``extent % LM_VL`` steps in scalars. None (nothing
    emitted) when a body is not covered. GCC's own vectorization of a 2-D block's loop
    (``omp simd reduction``) reloaded the shared vectors at each use, or spilled."""
    from ..cstyle import _c_name, cexpr

    r0 = rs[0]
    if r0.op is not Op.SUM_REDUCE or r0.dtype is not dt.f32:
        return None
    if any(isinstance(x, (K.Reduce, K.Masked, K.SoftmaxSum)) for x in K.walk(r0.body)):
        return None
    if any(isinstance(x, K.Gather) and not _row_gather(x, r0.var.name, em.fv_memo)
           for x in K.walk(r0.body)):  # fmt: skip
        return None
    restore = em.checkpoint()
    for r in rs:
        em.hoist(r.body, frozenset({r.var.name}), ind)
    accs = [em.tmp() for _ in rs]
    rv, ext = _c_name(r0.var), cexpr(r0.extent)
    em.lines.append(f"{ind}lm_f32v {', '.join(f'{a} = {{0}}' for a in accs)};")
    em.lines.append(f"{ind}{em.index_type} {rv} = 0;")
    em.lines.append(f"{ind}for (; {rv} + LM_VL <= {ext}; {rv} += LM_VL) {{")
    ok = True

    def step() -> None:
        nonlocal ok
        vec = _GatherVec(em, r0.var, ind + "  ")
        try:
            xs = [vec.val(r.body) for r in rs]
        except _Unsupported:
            ok = False
            return
        if any(kind != "f" for _, kind in xs):
            ok = False
            return
        em.lines.extend(_kept(vec, [r.body for r in rs]))
        em.lines.extend(f"{ind}  {a} += {x};" for a, (x, _) in zip(accs, xs, strict=True))

    em.block(step)
    if not ok:
        restore()
        return None
    em.lines.append(f"{ind}}}")
    sums = [em.tmp() for _ in rs]
    em.lines.append(
        f"{ind}float {', '.join(f'{t} = lm_vsum_f32({a})' for t, a in zip(sums, accs))};"
    )
    em.lines.append(f"{ind}for (; {rv} < {ext}; ++{rv}) {{")

    def tail() -> None:
        xs = [em.emit(r.body, ind + "  ") for r in rs]
        em.lines.extend(f"{ind}  {t} += {x};" for t, x in zip(sums, xs, strict=True))

    em.block(tail)
    em.lines.append(f"{ind}}}")
    return sums


def _row_gather(g: K.Gather, var: str, memo: dict[int, frozenset[str]]) -> bool:
    """Whether gather ``g`` in the body of a sum over ``var`` picks one row for the whole sum
    (a mixture of experts' weight, by the row's expert): its row does not use ``var``, and it
    has a row 0 to read when the row is out of range (``_GatherVec``)."""
    return (
        g.dtype is dt.f32
        and var not in K.free_vars(g.row, memo)
        and sym.lower_bound(g.rows) >= 1
        and g.row.dtype.is_int
    )


class _GatherVec(_Vec):
    """The vector form of a block's sums whose bodies read a gathered operand whose row is
    the same at every step (``_row_gather``): the row is clamped into range once per step as
    the scalar emitter's ``_gather_clamped`` does (the same values), the body is read as
    vectors at that row and zeroed where the row is out of range. So a gathered expert's
    weight, affine in the columns and the sum given its row, is a unit-stride load."""

    def _val(self, v: K.Value) -> tuple[str, str]:
        from ..cstyle import cexpr

        if not isinstance(v, K.Gather):
            return super()._val(v)
        if not _row_gather(v, self.ri.name, self.em.fv_memo):
            raise _Unsupported
        row, kind = self.val(v.row)
        if kind != "s":
            raise _Unsupported
        em, it, at = self.em, self.em.index_type, self.em.tmp()
        self.lines += [
            f"{self.ind}const {it} {at}r = ({it})({row});",
            f"{self.ind}const uint32_t {at}m = 0u - (uint32_t)({at}r >= 0 && {at}r < {cexpr(v.rows)});",
            f"{self.ind}const {it} g{at} = {at}m ? {at}r : 0;",
        ]
        ub = max(sym.upper_bound(v.rows) - 1, 0)
        body = K.substitute(v.body, {v.var.name: sym.var(f"_g{at}", 0, ub, v.rows)})
        em.made.append(body)
        x = self._vector(self.val(body), "f")
        return f"(lm_f32v)((lm_u32v)({x}) & {at}m)", "f"


def _split_sums(em: Emitter, rs: list[K.Reduce], ind: str) -> list[str] | None:
    """The copies ``rs`` of a split float sum (``r = g*ro + ri``: a product by a block-
    quantized weight) in a register block: named native vector accumulators, not an array
    indexed by lane chunk (an array of ``copies x g / LM_VL`` spilled a jam of 8 on AVX2).
    A block of fewer than ``ACC_CHAINS`` copies gives each copy's addends (nibble halves)
    accumulators of their own, then unrolls the outer loop with more. Each step computes
    one addend for every copy before the next, so a weight block's dequantized vector is
    live while the block's rows use it, and each row's activation vector while the block's
    columns use it; each product is added as soon as it is made (an FMA while its operands
    are live). None (nothing emitted) when a body is not covered."""
    from ..cstyle import _c_name, cexpr

    r0 = rs[0]
    inner0 = r0.body
    assert isinstance(inner0, K.Reduce)
    g = inner0.extent
    if r0.dtype is not dt.f32 or not isinstance(g, int) or g % BLOCK_LANES or g > 4 * BLOCK_LANES:
        return None
    bodies0 = [r.body.body for r in rs]  # type: ignore[union-attr]
    lane = inner0.var.name
    terms = [_terms(b, 2) for b in bodies0]
    # an addend that is the same in every lane (a bias): the whole body in one accumulator
    terms = [ts if all(lane in K.free_vars(t, em.fv_memo) for t in ts) else [b]
             for ts, b in zip(terms, bodies0, strict=True)]  # fmt: skip
    nt = max(len(ts) for ts in terms)
    want = max(1, ACC_CHAINS // len(rs))  # chains per copy
    per = nt if nt <= want and all(len(ts) == nt for ts in terms) else 1
    unroll = next(u for u in (4, 2, 1) if u * per <= want and _divides(u, r0.extent))
    restore = em.checkpoint()
    for b in bodies0:
        em.hoist(b, frozenset({r0.var.name, inner0.var.name}), ind)
    accs = [[em.tmp() for _ in range(per * unroll)] for _ in rs]
    ro, ri = _c_name(r0.var), _c_name(inner0.var)
    em.lines.append(f"{ind}lm_f32v {', '.join(f'{a} = {{0}}' for row in accs for a in row)};")
    step_by = f"{ro} += {unroll}" if unroll > 1 else f"++{ro}"
    em.lines.append(f"{ind}for ({em.index_type} {ro} = 0; {ro} < {cexpr(r0.extent)}; {step_by}) {{")
    shared = _shared_loads(bodies0)
    ok = True

    def step(u: int) -> None:
        nonlocal ok
        shift = {r0.var.name: sym.add(r0.var, u)}
        at = [[K.substitute(t, shift) for t in ts] for ts in terms] if u else terms
        bodies = [K.substitute(b, shift) for b in bodies0] if u else bodies0
        em.made.extend(bodies)
        for b in bodies:
            em.hoist(b, frozenset({inner0.var.name}), ind + "  ")
        i2 = ind + "    "
        em.lines.append(f"{ind}  for ({em.index_type} {ri} = 0; {ri} < {g}; {ri} += LM_VL) {{")
        vec = _Vec(em, inner0.var, i2)
        try:
            _accumulate(em, vec, list(enumerate(at)),
                        lambda j, t: accs[j][u * per + (t if per > 1 else 0)], shared, i2)  # fmt: skip
        except _Unsupported:
            ok = False
            return
        em.lines.append(f"{ind}  }}")

    for u in range(unroll):
        if ok:
            em.block(lambda: step(u))  # noqa: B023 (called at once)
    if not ok:
        restore()
        return None
    em.lines.append(f"{ind}}}")
    out = []
    for row in accs:
        name = em.tmp()
        em.lines.append(f"{ind}const float {name} = lm_vsum_f32({' + '.join(row)});")
        out.append(name)
    return out


def _divides(u: int, extent: sym.sint) -> bool:
    return u == 1 or isinstance(extent, int) and extent % u == 0


# 2-D blocks (rows, columns) the search measures for products of plain sums, where they fit
# (``block_fits``). Few: each measured one costs a C compile at search time.
BLOCKS = ((4, 4), (3, 3), (4, 2), (2, 4))


def block_fits(rows: int, cols: int, registers: int) -> bool:
    """A block of ``rows`` x ``cols`` dot products holds one accumulator per element and the
    ``rows + cols`` vectors one step loads (held by ``LM_KEEP``), plus one register for an
    operand no other element shares. Set by GCC 12's AVX2 code (16 registers): 4 x 2, 2 x 4
    and 3 x 3 (16) ran without spills, 4 x 3 (20) spilled three accumulators every step."""
    return rows * cols + rows + cols + 1 <= registers


# Blocks of one row by C columns the search measures for products whose weight is gathered
# by the row (a mixture of experts' weights, by each token's expert: no two rows share a
# weight load, so no row jam or 2-D block applies; ``search/schedules.py::column_blocks``),
# where they fit (``columns_fit``). Set by the expert products of Mixtral's tiny config
# (x (rows, 128) by experts (4, 512, 128), x (rows, 256) by (4, 128, 256); 64 and 256 rows;
# 1 thread, CPU time, AVX-512, interleaved rounds; ``docs/cpu-kernels.md``): 1 x 2 and 1 x 4
# ran 1.23-1.41x faster than one dot per column, 1 x 8 1.22-1.28x; in task order 1 1.25-1.54,
# 1.36-1.65 and 1.26-1.56x (1 x 4 fastest at all four; 2 and 8 within 0.15x of it).
COLUMNS = (2, 4, 8)


def columns_fit(cols: int, registers: int) -> bool:
    """A block of one row by ``cols`` columns holds an accumulator and a loaded weight
    vector per column, the row's vector and the gathered row's mask."""
    return 2 * cols + 2 <= registers


# 2-D blocks (rows, columns) the search measures for products by block-quantized weights
# (split sums), where they fit (``qblock_fits``): register blocks, and panel blocks of
# ``PANEL_ROWS`` rows.
PANEL_ROWS = 32
QBLOCKS = ((4, 2), (8, 2), (4, 4), (PANEL_ROWS, 2), (PANEL_ROWS, 4))


def qblock_panel(rows: int, cols: int, registers: int) -> bool:
    """Whether a block of ``rows`` x ``cols`` products by a block-quantized weight runs over a
    dequantized panel (``panel.py``): its accumulators and dequantization temporaries do not
    fit the registers, and it has rows enough to share the panel (``PANEL_MIN_ROWS``). Each
    weight block is then dequantized once for the task's rows (up to ``rows``) instead of
    once per register block."""
    return rows * cols + 2 * cols + 3 > registers and rows >= PANEL_MIN_ROWS


def qblock_fits(rows: int, cols: int, registers: int) -> bool:
    """A block of ``rows`` x ``cols`` products by a block-quantized weight (``_split_sums``)
    holds an accumulator per element, and per column its dequantized vector and its block
    scale, plus a row's activation vector, the weight's bytes and a mask. Set by
    bench/rowjam.py (Q4_1 1536 x 576 and Q8_0 12288 x 576, 1 thread, AVX2's 16 registers):
    4 x 2 (15) ran as fast as a jam of 8 or faster at 4-16 rows; 5 x 2 (17), 6 x 2 (19),
    3 x 3 (18) and 2 x 4 (19) ran 1.1-1.6x slower than 4 x 2. A block of ``PANEL_ROWS``
    runs over a dequantized panel (``qblock_panel``), where the panel's register blocks
    (``panel.PANEL_SUB``) fit."""
    if rows * cols + 2 * cols + 3 <= registers:
        return True
    return rows >= PANEL_ROWS and block_fits(*PANEL_SUB, registers)


def vector_registers() -> int:
    """The vector registers of the machine kernels are compiled for (``-march=native``):
    32 with AVX-512, else 16 (AVX2, and the 16 of SSE and NEON's 32 counted low)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return 32 if " avx512f" in line else 16
    except OSError:
        pass
    return 16


# Holds a vector in a register: an empty asm that "changes" it, so the C compiler cannot
# reload it from memory at each use (GCC 12 rematerialized a block's shared loads as memory
# operands of its FMAs: 11 loads for 8 FMAs in a block of 4 x 2, 6 with this).
JAM_HELPERS = r"""
#if defined(__x86_64__) || defined(__i386__)
#define LM_KEEP(v) __asm__("" : "+v"(v))
#elif defined(__aarch64__)
#define LM_KEEP(v) __asm__("" : "+w"(v))
#else
#define LM_KEEP(v) (void)(v)
#endif
static inline void lm_vstore_f32(float *p, lm_f32v v) { memcpy(p, &v, sizeof v); }
"""


def _kept(vec: _Vec, bodies: list[K.Value]) -> list[str]:
    """``vec``'s lines, the vectors that two or more ``bodies`` load held in registers."""
    users: dict[str, int] = {}
    for body in bodies:
        for name in {
            vec.memo[x][0] for x in K.walk(body) if isinstance(x, K.Load) and x in vec.memo
        }:
            users[name] = users.get(name, 0) + 1
    out = []
    for line in vec.lines:
        head, _, _ = line.partition(" = ")
        name = head.rsplit(" ", 1)[-1]
        if users.get(name, 0) > 1 and head.lstrip().startswith("const lm_f32v "):
            out.append(line.replace("const lm_f32v ", "lm_f32v ", 1))
            out.append(f"{head[: len(head) - len(head.lstrip())]}LM_KEEP({name});")
        else:
            out.append(line)
    return out


def _blocked_scalar(em: Emitter, rs: list[K.Reduce], ind: str) -> list[str]:
    """Split float sums (a short inner sum per block) the vector form does not cover: one
    array of partial sums per copy across the outer loop, as ``Emitter._blocked_sum``."""
    from ..cstyle import _c_name, cexpr, ctype

    r0 = rs[0]
    inner0 = r0.body
    assert isinstance(inner0, K.Reduce)
    inners = [r.body for r in rs]
    t, g = ctype(r0.dtype), inner0.extent
    ro, ri = _c_name(r0.var), _c_name(inner0.var)
    for x in inners:
        assert isinstance(x, K.Reduce)
        em.hoist(x.body, frozenset({r0.var.name, inner0.var.name}), ind)
    accvs = [em.tmp() for _ in rs]
    for a in accvs:
        em.lines.append(f"{ind}{t} {a}[{g}] = {{0}};")
    em.lines.append(f"{ind}for ({em.index_type} {ro} = 0; {ro} < {cexpr(r0.extent)}; ++{ro}) {{")

    def outer() -> None:
        for x in inners:
            assert isinstance(x, K.Reduce)
            em.hoist(x.body, frozenset({inner0.var.name}), ind + "  ")
        em.lines.append(f"{ind}  #pragma omp simd")
        em.lines.append(f"{ind}  for ({em.index_type} {ri} = 0; {ri} < {g}; ++{ri}) {{")

        def body() -> None:
            xs = [em.emit(x.body, ind + "    ") for x in inners]  # type: ignore[union-attr]
            for a, x in zip(accvs, xs, strict=True):
                em.lines.append(f"{ind}    {a}[{ri}] += {x};")

        em.block(body)
        em.lines.append(f"{ind}  }}")

    em.block(outer)
    em.lines.append(f"{ind}}}")
    out = []
    for a in accvs:
        acc = em.tmp()
        em.lines.append(f"{ind}{t} {acc} = 0;")
        em.lines.append(f"{ind}for (int j = 0; j < {g}; ++j) {acc} += {a}[j];")
        out.append(acc)
    return out


# the most elements of a task whose sums are staged for a vector epilogue: a task of 32 rows of
# 256 floats stages 32 KiB on its stack
STAGE_SPAN = 256
_COSTLY = frozenset({Op.EXP2, Op.LOG2, Op.SIN, Op.SQRT, Op.RECIP})


def _costly_epilogue(v: K.Value) -> bool:
    """Whether ``v`` computes a costly op (exp2, log2, sin, sqrt, recip) outside its
    reductions."""
    inside = {y for r in K.walk(v) if isinstance(r, K.Reduce) for y in K.walk(r)}
    return any(isinstance(x, K.Alu) and x.op in _COSTLY and x not in inside for x in K.walk(v))


def jam_task(
    em: Emitter,
    k: K.Kernel,
    lo: str,
    hi: str,
    store: Callable[[sint, str, str], str],
    ind: str = "    ",
    span: int | None = None,
) -> list[str]:
    """The lines of one task of jammed kernel ``k``: block ``i<d>`` of the jammed dim ``d``
    (or index ``i<d>``, when only the innermost dim is jammed), elements ``lo .. hi`` of the
    innermost dim, in blocks of ``jam2`` of them. ``store(flat index, C value, indent)``
    writes one element. ``span``: the most elements ``hi - lo`` counts (None: unbounded)."""
    from ..cstyle import _c_name, cexpr

    sched = k.schedule
    assert sched is not None
    n = len(k.shape)
    iv = f"i{n - 1}"
    full = jammed(k)
    for row in full.values:
        em.made += row
    col_names = frozenset({f"_i{n - 1}"} | {v.name for v in full.cols})
    size, d = sched.jam, sched.jam_dim
    csize = sched.jam2 if full.cols and sched.jam2 > 1 else 1
    lines = [f"{ind}/* block {max(size, 1)}x{csize} of dims {d if size > 1 else '-'}, {n - 1} */"]

    def element(m: int, p: int, ei: str) -> None:
        """Block rows ``0 .. m - 1`` by columns ``0 .. p - 1`` at one step of the column loop."""
        em.lines = []
        for grp in full.groups:
            rs = [grp[a][b] for a in range(m) for b in range(p)]
            for r, name in zip(rs, jam_reduce(em, rs, ei, csize > 1), strict=True):
                em.scopes[-1][r] = name
        at: dict[int, sym.Expr] = {}
        for a in range(m):
            for b in range(p):
                if full.rows:
                    at[d] = full.rows[a]
                if csize > 1:
                    at[n - 1] = full.cols[b]
                x = em.emit(full.values[a][b], ei)
                lines.extend(em.lines)
                em.lines = []
                line = store(_flat(k.shape, at), x, ei)
                # a clamped block's rows past the rest, and columns past the chunk, are not
                # stored
                held = [f"{a} < lm_jv"] * (a > 0 and clamped) + [f"{b} < lm_cv"] * (b > 0)
                if held:
                    line = f"{ei}if ({' && '.join(held)}) {{ {line.strip()} }}"
                lines.append(line)

    # a costly epilogue (a SiLU's exp and reciprocal) of one column of rows is scalar code per
    # element: the task's sums are staged in a stack array and the epilogue runs row by row
    # along the columns, a loop the C compiler vectorizes, one copy for every block
    costly = (
        span is not None
        and span <= STAGE_SPAN
        and bool(full.groups)
        and _costly_epilogue(full.values[0][0])
    )
    staged = csize == 1 and costly

    # one column at a time where the block has columns (a panel block's few rows): the
    # values' first column is the loop's
    one_col = (
        f"const int64_t {_c_name(full.cols[0])} = {iv};"
        if full.cols[0].name != f"_i{n - 1}"
        else ""
    )

    # the staged sums of the task's rows (a block's rows past the rest write their last row's
    # sums again, in its place), then one epilogue loop for them all (``staged_epilogue``)
    stages = [False]

    def staged_columns(m: int, bi: str) -> None:
        stages[0] = True
        at = f"{iv} - ({lo})"
        lines.append(f"{bi}for (int64_t {iv} = {lo}; {iv} < {hi}; ++{iv}) {{")
        if one_col:
            lines.append(f"{bi}  {one_col}")

        def sums() -> None:
            em.lines = []
            for gi, grp in enumerate(full.groups):
                names = jam_reduce(em, [grp[a][0] for a in range(m)], bi + "  ")
                lines.extend(em.lines)
                em.lines = []
                for a, x in enumerate(names):
                    row = f"{_c_name(full.rows[a])} - lm_j0" if full.rows else "0"
                    lines.append(f"{bi}  lm_red[{gi}][{row}][{at}] = {x};")

        em.block(sums)
        lines.append(f"{bi}}}")

    def staged_epilogue(bi: str) -> None:
        """The staged sums' epilogue row by row of the task, a loop along the columns that
        the C compiler vectorizes (a SiLU's exp and reciprocal, scalar per element)."""
        row, ei = "0", bi
        if full.rows:
            lines.append(f"{bi}for (int64_t lm_r = 0; lm_r < lm_jn; ++lm_r) {{")
            lines.append(f"{bi}  const int64_t {_c_name(full.rows[0])} = lm_j0 + lm_r;")
            row, ei = "lm_r", bi + "  "
        lines.append(f"{ei}#pragma omp simd")
        lines.append(f"{ei}for (int64_t {iv} = {lo}; {iv} < {hi}; ++{iv}) {{")
        if one_col:
            lines.append(f"{ei}  {one_col}")

        def epilogue() -> None:
            for gi, grp in enumerate(full.groups):
                em.scopes[-1][grp[0][0]] = f"lm_red[{gi}][{row}][{iv} - ({lo})]"
            em.lines = []
            x = em.emit(full.values[0][0], ei + "  ")
            lines.extend(em.lines)
            em.lines = []
            rows = {d: full.rows[0]} if full.rows else {}
            lines.append(store(_flat(k.shape, rows), x, ei + "  "))

        em.block(epilogue)
        lines.append(f"{ei}}}")
        if full.rows:
            lines.append(f"{bi}}}")

    def finish() -> list[str]:
        """``lines`` with the staged sums' array and epilogue where sums were staged."""
        if stages[0]:
            rows = size if full.rows else 1
            lines.insert(1, f"{ind}float lm_red[{len(full.groups)}][{rows}][{span}];")
            em.block(lambda: staged_epilogue(ind))
        return lines

    def columns(m: int, bi: str) -> None:
        """The innermost dim's elements ``lo .. hi`` for block rows ``0 .. m - 1``."""
        if staged:
            staged_columns(m, bi)
            return
        if csize == 1:
            lines.append(f"{bi}for (int64_t {iv} = {lo}; {iv} < {hi}; ++{iv}) {{")
            if one_col:
                lines.append(f"{bi}  {one_col}")
            em.block(lambda: element(m, 1, bi + "  "))
            lines.append(f"{bi}}}")
            return

        # a chunk's last columns in the same code, its missing columns computed again from
        # its last one, unstored (a block per rest size: more C to compile, for one step)
        lines.append(f"{bi}for (int64_t {iv} = {lo}; {iv} < {hi}; {iv} += {csize}) {{")
        lines.append(f"{bi}  const int64_t lm_cv = lm_min({csize}, {hi} - {iv}); (void)lm_cv;")
        for b in range(csize):
            at = f" + lm_min({b}, lm_cv - 1)" if b else ""
            lines.append(f"{bi}  const int64_t {_c_name(full.cols[b])} = {iv}{at};")
        em.block(lambda: element(m, csize, bi + "  "))
        lines.append(f"{bi}}}")

    clamped = False

    def block(m: int, base: str, bi: str) -> None:
        """Indices ``base .. base + m - 1`` of the jammed dim (``clamped``: the first
        ``lm_jv`` of them; the others compute the last one's value again, unstored)."""
        for j in range(m):
            at = f"lm_min({j}, lm_jv - 1)" if clamped and j else str(j)
            lines.append(f"{bi}const int64_t {_c_name(full.rows[j])} = {base} + {at};")
        em.lines = []
        for a in range(m):
            for v in full.values[a][:csize]:
                em.hoist(v, col_names, bi)
        lines.extend(em.lines)
        columns(m, bi)

    if size <= 1:  # only the innermost dim is jammed
        em.lines = []
        for v in full.values[0]:
            em.hoist(v, col_names, ind)
        lines.extend(em.lines)
        em.block(lambda: columns(1, ind))
        return finish()
    lines.append(
        f"{ind}const int64_t lm_j0 = i{d} * {size}, "
        f"lm_jn = lm_min({size}, {cexpr(k.shape[d])} - lm_j0);"
    )
    lines.append(f"{ind}int64_t lm_jo = lm_j0, lm_jr = lm_jn;")
    sizes = (size, *_digits(size))
    rind = ind
    if csize > 1 and qblock_panel(size, csize, vector_registers()):
        em.lines = []
        got = panel_task(em, k, full, lo, hi, store, ind + "  ", csize, costly)
        if got is not None:  # else every row runs in register blocks
            stages[0] = stages[0] or costly
            lines.append(f"{ind}if (lm_jr >= {PANEL_MIN_ROWS}) {{")
            lines.extend(got)
            lines.append(f"{ind}}} else {{")
            rind = ind + "  "
        # fewer rows run in the default row jams, a column at a time: the panel's stores and
        # reloads cost more than a second dequantization up to 8 rows (SmolLM2's batched
        # step at 8 rows, 1 thread: 44.5 ms against 40.1), and at 1-2 rows a block of 2
        # columns streamed a weight larger than the caches 2-2.5x slower than one (Q8_0
        # 49152 x 576: 8.3 ms against 3.5 at 1 row)
        few = default_jam(k, d)
        sizes = (few, *_digits(few))
        csize, staged = 1, costly
    # the block's rows in blocks of the binary digits of their count, a block of p taking the
    # rest when at least 3/4 of p is left (its rows past the rest computed, not stored): in
    # blocks of the digits alone each weight was read and dequantized again per block (Q4_1
    # 1536 x 576, 1 thread, a jam of 8: 7 rows as 4, 2, 1 ran 1.3-1.75x slower than one
    # block of 7; a block for every rest size doubled the jammed kernels' compile time), and
    # fewer blocks cost more than they save (2 rows in a block of 4: 1.34x slower than in one
    # of 2)
    for i, p in enumerate(sizes):
        # a panel block's rows that do not take the panel run in register blocks, the first
        # size repeated while rows are left
        again = i == 0 and sizes[0] < size
        lines.append(f"{rind}{'while' if again else 'if'} (lm_jr >= {p - p // 4}) {{")
        lines.append(f"{rind}  const int64_t lm_jv = lm_min({p}, lm_jr); (void)lm_jv;")
        clamped = p // 4 > 0
        em.block(lambda: block(p, "lm_jo", rind + "  "))  # noqa: B023 (called at once)
        lines.append(f"{rind}  lm_jo += lm_jv;")
        lines.append(f"{rind}  lm_jr -= lm_jv;")
        lines.append(f"{rind}}}")
    if rind != ind:
        lines.append(f"{ind}}}")
    return finish()
