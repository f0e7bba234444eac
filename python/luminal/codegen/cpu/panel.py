"""Panel blocks of products by block-quantized weights (``jam.qblock_panel``: a
``ScheduleSpace.qblocks`` block of more rows than the registers hold). A task is up to ``jam``
rows by a chunk of columns. Where ``PANEL_MIN_ROWS`` or more rows are left, for each ``jam2``
columns of the chunk the columns' weight rows are dequantized once into an f32 panel on the
task's stack, then every row's products run over the panel in register blocks of
``PANEL_SUB`` (the last rows in blocks of 2 and 1): a weight block is dequantized once for
the task's rows, where a row jam or a register block dequantizes it once per 4-8 rows.
Fewer rows run jam.py's default row jams.

A chunk's last columns run in the same code as the others, the block's missing columns
computed again from its last one, unstored, and each register block is a loop over the
panel's columns: a copy of the loops per rest size of columns and per block of columns
made most of a panel block's C and of its -O3 compile, which the search pays for every
candidate it measures.

What the panel holds is found from the IR, no format named: the largest subtrees of each
reduction's body that vary along the lanes but not along the rows (``_row_free``: a weight
block's dequantized values; a pair of nibbles gives two per step). The rows' products read
them back as the vectors they were.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from ...compiler import kernel_ir as K
from ...compiler.schedule import Jammed, jam_row_bytes
from ...graph import dtypes as dt
from ...graph import symbolic as sym
from ...graph.symbolic import sint
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

# A panel block runs its rows over the panel when at least this many are left; fewer run in
# the default row jams (``schedule.default_jam``: up to 8 rows dequantize each weight block
# once, without the panel's stores and reloads).
PANEL_MIN_ROWS = 9
# The register block (rows, columns) of products over the f32 panel: its 8 accumulators and
# the 6 vectors a step loads fit AVX2's 16 registers (``jam.block_fits``).
PANEL_SUB = (4, 2)
# The most bytes of panel a task holds on its stack, with the rows of one register block
# (their operand rows, read again for every column block): both stay in the L1 data cache.
# Set by the batched step of SmolLM2 (16 rows, 1 thread): its down projection (k = 1536: 12
# KiB of panel and 24 KiB of rows) ran 1.25x slower over a panel than in row jams of 4.
PANEL_BYTES = 32 << 10
# Column blocks ahead whose weight bytes a fill prefetches.
PANEL_AHEAD = 2


def _row_free(v: K.Value, row: str, lane: str, memo: dict[int, frozenset[str]]) -> list[K.Value]:
    """The largest subtrees of ``v`` that vary along the lanes ``lane`` but not along the
    jammed dim's index ``row``: a weight's dequantized values, which the panel holds."""
    fv = K.free_vars(v, memo)
    if lane not in fv:
        return []
    if row not in fv:
        return [v]
    if isinstance(v, K.Alu):
        return [w for s in v.srcs for w in _row_free(s, row, lane, memo)]
    if isinstance(v, K.Cast):
        return _row_free(v.src, row, lane, memo)
    return []


@dataclass
class _Group:
    """One reduction of the block's elements (``Jammed.groups``): its copies, the outer and
    inner loops of its split, and per column the values the panel holds (``ws[b]``)."""

    copies: list[list[K.Reduce]]
    outer: K.Reduce
    inner: K.Reduce
    ws: list[list[K.Value]]

    @property
    def floats(self) -> int:
        """Floats of the panel per column."""
        assert isinstance(self.outer.extent, int) and isinstance(self.inner.extent, int)
        return self.outer.extent * self.inner.extent * len(self.ws[0])

    def at(self, ro: str, j: int, ri: str) -> str:
        """The panel offset of value ``j`` of outer step ``ro`` at lane ``ri``."""
        return f"({ro} * {len(self.ws[0])} + {j}) * {self.inner.extent} + {ri}"


def _inner(r: K.Reduce) -> K.Reduce:
    assert isinstance(r.body, K.Reduce)
    return r.body


def _groups(em: Emitter, full: Jammed, csize: int) -> list[_Group] | None:
    """The block's reductions as panel groups; None when one is not a split float sum with
    lanes the vector form takes, or a column's panel values differ in count."""
    from ..cstyle import _blocked_sum

    row = full.rows[0].name
    out = []
    for copies in full.groups:
        r0 = copies[0][0]
        if not (em.simd_reductions and _blocked_sum(r0)) or r0.dtype is not dt.f32:
            return None
        inner = _inner(r0)
        g = inner.extent
        if not isinstance(g, int) or g % BLOCK_LANES or g > 4 * BLOCK_LANES:
            return None
        if not isinstance(r0.extent, int):
            return None
        lane = inner.var.name
        ws = [_row_free(_inner(copies[0][b]).body, row, lane, em.fv_memo) for b in range(csize)]
        if not ws[0] or any(len(w) != len(ws[0]) for w in ws):
            return None
        out.append(_Group(copies, r0, inner, ws))
    return out


class _Panel:
    """Writes one panel task (``panel_task``) into ``out``."""

    def __init__(
        self,
        em: Emitter,
        k: K.Kernel,
        full: Jammed,
        groups: list[_Group],
        store: Callable[[sint, str, str], str],
    ) -> None:
        self.em, self.k, self.full, self.groups, self.store = em, k, full, groups, store
        assert k.schedule is not None
        self.d, self.n = k.schedule.jam_dim, len(k.shape)
        self.csize = len(full.cols)
        self.iv = f"i{self.n - 1}"  # the first column of the task's current panel
        self.staged: str | None = None  # the task's first column, where sums are staged
        self.out: list[str] = []
        self.ok = True  # cleared where the vector form does not cover a value

    def loops(self, grp: _Group, bi: str) -> tuple[str, str, str]:
        """Opens the outer loop of ``grp``'s split; its C variables and the inner loop's
        head (opened by the caller inside the outer loop's scope)."""
        from ..cstyle import _c_name, cexpr

        em = self.em
        ro, ri = _c_name(grp.outer.var), _c_name(grp.inner.var)
        em.lines.append(f"{bi}for ({em.index_type} {ro} = 0; {ro} < {cexpr(grp.outer.extent)}; ++{ro}) {{")  # fmt: skip
        head = f"{bi}  for ({em.index_type} {ri} = 0; {ri} < {grp.inner.extent}; {ri} += LM_VL) {{"
        return ro, ri, head

    def fill(self, bi: str) -> None:
        """Dequantize the block's columns into every group's panel."""
        em, cols = self.em, range(self.csize)
        for gi, grp in enumerate(self.groups):
            em.lines = []
            for w in [w for b in cols for w in grp.ws[b]]:
                em.hoist(w, frozenset({grp.outer.var.name, grp.inner.var.name}), bi)
            ro, ri, head = self.loops(grp, bi)
            em.block(partial(self._fill_step, gi, grp, ro, ri, head, bi))
            em.lines.append(f"{bi}}}")
            self.out.extend(em.lines)
        em.lines = []

    def _fill_step(self, gi: int, grp: _Group, ro: str, ri: str, head: str, bi: str) -> None:
        from ..cstyle import cexpr

        em, cols = self.em, range(self.csize)
        for w in [w for b in cols for w in grp.ws[b]]:
            em.hoist(w, frozenset({grp.inner.var.name}), bi + "  ")
        # the weight's bytes of the columns PANEL_AHEAD blocks on: a task's rows compute
        # between two fills, so without it each fill waited on memory
        lane = grp.inner.var.name
        seen: set[str] = set()
        for b in cols:
            col = self.full.cols[b]
            ahead = {col.name: sym.add(col, PANEL_AHEAD * self.csize)}
            for x in K.walk(grp.copies[0][b].body):
                if isinstance(x, K.Load) and isinstance(x.index, sym.Expr):
                    names = {v.name for v in x.index.vars()}
                    if lane in names and col.name in names:
                        at = sym.substitute(sym.substitute(x.index, ahead), {lane: 0})
                        line = f"{bi}  __builtin_prefetch(&{em.ptr_of(x.buf)}[{cexpr(at)}]);"
                        if line not in seen:
                            seen.add(line)
                            em.lines.append(line)
        i2 = bi + "    "
        em.lines.append(head)
        vec = _Vec(em, grp.inner.var, i2)
        try:
            for b in cols:
                for j, w in enumerate(grp.ws[b]):
                    x, kind = vec.val(w)
                    if kind != "f":
                        raise _Unsupported
                    em.lines.extend(vec.lines)
                    vec.lines = []
                    em.lines.append(
                        f"{i2}lm_vstore_f32(&lm_pw{gi}[{b}][{grp.at(ro, j, ri)}], {x});"
                    )
        except _Unsupported:
            self.ok = False
        em.lines.append(f"{bi}  }}")

    def products(self, m: int, slots: list[str], bi: str) -> None:
        """The sums of rows ``0 .. m - 1`` by the block's first ``len(slots)`` columns, read
        from the panel's columns ``slots``, named in the emitter's current scope."""
        em = self.em
        for gi, grp in enumerate(self.groups):
            em.lines = []
            cells = [(a, b) for a in range(m) for b in range(len(slots))]
            bodies = {c: _inner(grp.copies[c[0]][c[1]]).body for c in cells}
            lane = grp.inner.var.name
            terms = {c: _terms(x, 2) for c, x in bodies.items()}
            # an addend that is the same in every lane (a bias): the whole body in one sum
            terms = {c: ts if all(lane in K.free_vars(t, em.fv_memo) for t in ts) else [bodies[c]]
                     for c, ts in terms.items()}  # fmt: skip
            nt = max(len(ts) for ts in terms.values())
            per = nt if len(cells) * nt <= ACC_CHAINS else 1  # chains per element
            accs = {c: [em.tmp() for _ in range(per)] for c in cells}
            for x in bodies.values():
                em.hoist(x, frozenset({grp.outer.var.name, lane}), bi)
            em.lines.append(
                f"{bi}lm_f32v {', '.join(f'{a} = {{0}}' for c in cells for a in accs[c])};"
            )
            ro, ri, head = self.loops(grp, bi)
            em.block(
                partial(
                    self._products_step, gi, grp, m, slots, bodies, terms, accs, ro, ri, head, bi
                )
            )
            em.lines.append(f"{bi}}}")
            for c in cells:
                name = em.tmp()
                em.lines.append(f"{bi}const float {name} = lm_vsum_f32({' + '.join(accs[c])});")
                em.scopes[-1][grp.copies[c[0]][c[1]]] = name
            self.out.extend(em.lines)
        em.lines = []

    def _products_step(
        self,
        gi: int,
        grp: _Group,
        m: int,
        slots: list[str],
        bodies: dict[tuple[int, int], K.Value],
        terms: dict[tuple[int, int], list[K.Value]],
        accs: dict[tuple[int, int], list[str]],
        ro: str,
        ri: str,
        head: str,
        bi: str,
    ) -> None:
        em = self.em
        for x in bodies.values():
            em.hoist(x, frozenset({grp.inner.var.name}), bi + "  ")
        i2 = bi + "    "
        em.lines.append(head)
        vec = _Vec(em, grp.inner.var, i2)
        # the panel's vectors of this step, read by every row of the block: held in registers
        for b, slot in enumerate(slots):
            for j, w in enumerate(grp.ws[b]):
                name = em.tmp()
                em.lines.append(f"{i2}lm_f32v {name} = lm_vload_f32(&lm_pw{gi}[{slot}][{grp.at(ro, j, ri)}]);")  # fmt: skip
                if m > 1:
                    em.lines.append(f"{i2}LM_KEEP({name});")
                vec.memo[w] = (name, "f")
        shared = _shared_loads(list(bodies.values()))
        try:
            _accumulate(em, vec, list(terms.items()),
                        lambda c, t: accs[c][t if len(accs[c]) > 1 else 0], shared, i2)  # fmt: skip
        except _Unsupported:
            self.ok = False
        em.lines.append(f"{bi}  }}")

    def rows(self, m: int, bi: str) -> None:
        """A register block of rows ``lm_jo .. lm_jo + m - 1`` by the panel's columns, stored:
        a loop over the panel's columns in blocks of ``PANEL_SUB[1]``, a block past the last
        column computing that column again in its place, unstored."""
        from ..cstyle import _c_name

        full, pc = self.full, min(PANEL_SUB[1], self.csize)
        for a in range(m):
            self.out.append(f"{bi}const int64_t {_c_name(full.rows[a])} = lm_jo + {a};")
        self.out.append(f"{bi}for (int64_t lm_b = 0; lm_b < lm_cv; lm_b += {pc}) {{")
        ci = bi + "  "
        slots = ["lm_b"] + [f"lm_s{b}" for b in range(1, pc)]
        for b in range(1, pc):
            self.out.append(f"{ci}const int64_t lm_s{b} = lm_min(lm_b + {b}, lm_cv - 1);")
        for b, slot in enumerate(slots):
            self.out.append(f"{ci}const int64_t {_c_name(full.cols[b])} = {self.iv} + {slot};")
        self.em.block(partial(self._cells, m, slots, ci))
        self.out.append(f"{bi}}}")

    def _cells(self, m: int, slots: list[str], bi: str) -> None:
        from ..cstyle import _c_name

        em, full = self.em, self.full
        self.products(m, slots, bi)
        if self.staged is not None:  # the sums wait for the caller's epilogue
            for gi, grp in enumerate(self.groups):
                for a in range(m):
                    for b in range(len(slots)):
                        # a repeated column writes its own sums again, in its place
                        row, col = _c_name(full.rows[a]), _c_name(full.cols[b])
                        cell = f"[{row} - lm_j0][{col} - ({self.staged})]"
                        name = em.scopes[-1][grp.copies[a][b]]
                        self.out.append(f"{bi}lm_red[{gi}]{cell} = {name};")
            return
        for a in range(m):
            for b in range(len(slots)):
                x = em.emit(full.values[a][b], bi)
                self.out.extend(em.lines)
                em.lines = []
                at = {self.d: full.rows[a], self.n - 1: full.cols[b]}
                line = self.store(_flat(self.k.shape, at), x, bi)
                if b:  # a repeated column is not stored
                    line = f"{bi}if (lm_b + {b} < lm_cv) {{ {line.strip()} }}"
                self.out.append(line)

    def columns(self, hi: str, bi: str) -> None:
        """Columns ``iv .. iv + csize - 1`` (those before ``hi``): their panel, then every
        row of the task over it in register blocks, each a loop over the panel's columns.
        Columns past ``hi`` (a chunk's last block) repeat the last one, unstored."""
        from ..cstyle import _c_name

        iv, sub = self.iv, PANEL_SUB[0]
        self.out.append(f"{bi}const int64_t lm_cv = lm_min({self.csize}, {hi} - {iv});")
        # the fill's columns in one loop body, a copy per column: a loop over the columns
        # ran 16 rows of 32 x 4 1.02-1.03x slower (1536 x 576 Q4_1, 1 thread)
        self.out.append(f"{bi}{{")
        for b in range(self.csize):
            at = f" + lm_min({b}, lm_cv - 1)" if b else ""
            self.out.append(f"{bi}  const int64_t {_c_name(self.full.cols[b])} = {iv}{at};")
        self.em.block(lambda: self.fill(bi + "  "))
        self.out.append(f"{bi}}}")
        # the rows in register blocks, the last in blocks of the binary digits of their
        # count: a block of 4 clamped to the last 1-3 rows ran 9 rows 1.18x slower, and the
        # last 2-3 rows one by one ran 10-11 rows 1.05-1.14x slower (1536 x 576 Q4_1, 1 thread)
        self.out.append(f"{bi}int64_t lm_jo = lm_j0, lm_jr = lm_jn;")
        self.out.append(f"{bi}for (; lm_jr >= {sub}; lm_jo += {sub}, lm_jr -= {sub}) {{")
        self.em.block(lambda: self.rows(sub, bi + "  "))
        self.out.append(f"{bi}}}")
        for q in _digits(sub):
            self.out.append(f"{bi}if (lm_jr & {q}) {{")
            self.em.block(partial(self.rows, q, bi + "  "))
            self.out.append(f"{bi}  lm_jo += {q};")
            self.out.append(f"{bi}}}")


def panel_task(
    em: Emitter,
    k: K.Kernel,
    full: Jammed,
    lo: str,
    hi: str,
    store: Callable[[sint, str, str], str],
    ind: str,
    csize: int,
    staged: bool = False,
) -> list[str] | None:
    """The lines of a panel block's task over rows ``lm_j0 .. lm_j0 + lm_jn - 1`` and
    columns ``lo .. hi``; ``store(flat index, C value, indent)`` writes one element.
    ``staged``: the sums are written to the caller's ``lm_red[group][row - lm_j0][column -
    lo]`` for a costly epilogue it runs (else each element is computed and stored as its
    sums are made). None (nothing emitted) when a reduction is not a split sum the vector
    form covers, or the panel and a register block's rows exceed ``PANEL_BYTES``."""
    groups = _groups(em, full, csize)
    if groups is None:
        return None
    floats = csize * sum(g.floats for g in groups)
    assert k.schedule is not None
    if 4 * floats + PANEL_SUB[0] * jam_row_bytes(k, k.schedule.jam_dim) > PANEL_BYTES:
        return None
    restore = em.checkpoint()
    w = _Panel(em, k, full, groups, store)
    for gi, grp in enumerate(groups):
        w.out.append(f"{ind}float lm_pw{gi}[{csize}][{grp.floats}] __attribute__((aligned(64)));")
    if staged:
        w.staged = lo
    iv = w.iv
    w.out.append(f"{ind}for (int64_t {iv} = {lo}; {iv} < {hi}; {iv} += {csize}) {{")
    em.block(lambda: w.columns(hi, ind + "  "))
    w.out.append(f"{ind}}}")
    em.lines = []
    if not w.ok:
        restore()
        return None
    return w.out
