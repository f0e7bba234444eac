"""Row-wise forms of CPU kernels whose tasks each write a contiguous run of the output.

Two rewrites, both chosen from the shape of the kernel IR (no op is special-cased):

- **Cached row sums.** A kernel whose value holds a row reduction hoisted out of the inner
  loop (softmax's sum of exponentials, with its row max hoisted further out) evaluates the
  reduction's body once per element in the sum's loop and, when the same expression also
  appears in the element's value, again in the inner loop. When that body holds a costly op
  (exp2, log2, sin, sqrt, recip) the sum loop also writes each body value to a row buffer on
  the stack (L1-resident for rows up to ``ROW_CAP`` elements), and the inner loop reads it
  back instead of recomputing it.
- **Next-row prefetch.** A row kernel's first pass streams its row in from memory while the
  core mostly waits; the later passes (softmax's exp, layer norm's squares) compute from L1
  while memory idles. The first later pass over the row is cut into strips of ``STRIP``
  elements, each preceded by prefetches of the same strip of the next task's row, so the next
  first pass finds its row in cache (softmax 4096x4096, 1 thread: 14 -> 11 ms). Where that
  pass is an explicit vector loop (softmax's exponentials) it is one pass over the row instead,
  each vector step prefetching its line of the next row. A prefetch never faults, so a row
  past the end costs nothing but a wasted request.
- **Staged streaming stores.** A task computes its run into a stack buffer, then copies it
  out. When the whole output is large (``STREAM_BYTES``), the copy uses non-temporal stores:
  the output is written without first being read into the cache (a normal store's
  read-for-ownership makes a memory-bound kernel move 3 bytes per byte written instead of 2),
  and it does not evict the inputs. A smaller output is copied with ``memcpy`` and stays
  cached for the kernel that reads it next. Where the element loop has a vector form
  (``vector.py``'s ``vector_loop``), its vectors are stored (streamed) straight to the output
  and only the scalar rest goes through the buffer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ...compiler import kernel_ir as K
from ...graph import dtypes as dt
from ...graph import symbolic as sym
from ...graph.ops import Op
from ...graph.symbolic import sint

if TYPE_CHECKING:
    from ..cstyle import Emitter

# stack buffers per row: 8192 f32 = 32 KiB, so a row and its cache stay in L1/L2
ROW_CAP = 8192
# outputs at least this large are written with non-temporal stores: larger than the caches
# a following kernel could read them from
STREAM_BYTES = 32 << 20

# elements of the shortest run worth staging: streamed stores pay off on whole 64-byte lines
# (16 f32); a shorter run (an im2col row of 3 or 7 taps) is stored as it is, one masked
# vector store, rather than copied out through the buffer
STREAM_MIN_RUN = 16

_COSTLY = frozenset({Op.EXP2, Op.LOG2, Op.SIN, Op.SQRT, Op.RECIP})

# elements per strip of the pass that prefetches the next row: 1 KiB of f32, 16 cache lines
STRIP = 256

# the CPU prelude's copy-out; the fence makes streamed stores visible before the kernel returns
ROW_HELPERS = r"""
static inline void lm_copy_out(void *restrict dst, const void *restrict src, int64_t bytes, int nt) {
#if defined(__AVX512F__)
  if (nt) {
    char *d = (char *)dst; const char *s = (const char *)src;
    int64_t head = (int64_t)((64 - ((uintptr_t)d & 63)) & 63);
    if (head > bytes) head = bytes;
    memcpy(d, s, (size_t)head);
    int64_t k = head;
    for (; k + 64 <= bytes; k += 64)
      _mm512_stream_si512((__m512i *)(d + k), _mm512_loadu_si512((const void *)(s + k)));
    memcpy(d + k, s + k, (size_t)(bytes - k));
    return;
  }
#endif
  (void)nt;
  memcpy(dst, src, (size_t)bytes);
}
static inline void lm_stream_fence(int nt) {
#if defined(__AVX512F__)
  if (nt) _mm_sfence();
#endif
  (void)nt;
}
"""


def stageable(k: K.Kernel, chunk: int, per_element_reduce: bool) -> int:
    """Elements of the stack buffer a task of ``k`` stages its output run in, or 0 when the
    kernel keeps plain stores: scatters, packed or converted stores (they compute in another
    type than they store), GEMV-like kernels (each element runs a loop: compute-bound, small
    outputs), and runs longer than ``ROW_CAP``."""
    if k.scatter_row is not None or not k.shape or per_element_reduce:
        return 0
    if k.dtype not in (dt.f32, dt.i32, dt.f64, dt.i64):
        return 0
    run = min(sym.upper_bound(k.shape[-1]), chunk)
    if run < STREAM_MIN_RUN or run > ROW_CAP:
        return 0
    total: sint = k.dtype.bits // 8
    for s in k.shape:
        total = sym.mul(total, s)
    if sym.upper_bound(total) < STREAM_BYTES:
        return 0  # never large enough to stream: plain stores keep the output cached
    return run


def stream_flag(k: K.Kernel) -> str:
    """C expression: whether this call's output is large enough to stream."""
    from ..cstyle import cexpr

    total: sint = k.dtype.bits // 8
    for s in k.shape:
        total = sym.mul(total, s)
    return f"(int)(({cexpr(total)}) >= {STREAM_BYTES}LL)"


def row_caches(k: K.Kernel, inner: sym.Expr, em: Emitter) -> dict[K.Reduce, K.Value]:
    """Row sums hoisted out of the inner loop whose body, with the sum's variable renamed to
    the inner index, is also a subtree of the element's value and holds a costly op:
    reduction -> that subtree."""
    hoisted = K.invariant_parts(k.value, frozenset({inner.name}), em.fv_memo)
    per_elem = set(K.walk(k.value)) - {x for h in hoisted for x in K.walk(h)}
    out: dict[K.Reduce, K.Value] = {}
    for h in hoisted:
        for x in K.walk(h):
            if not (
                isinstance(x, K.Reduce)
                and x.op is Op.SUM_REDUCE
                and x.dtype.is_float
                and x.extent == k.shape[-1]
                and any(isinstance(y, K.Alu) and y.op in _COSTLY for y in K.walk(x.body))
            ):
                continue
            body = K.substitute(x.body, {x.var.name: inner})
            if body in per_elem:
                em.made.append(body)
                out[x] = body
    return out


@dataclass
class RowPrefetch:
    """Prefetch of the next task's row, carried by the second row loop of a task (the first
    streams the row in)."""

    indent: str  # indent of the task-level loops (the row passes)
    targets: list[tuple[str, int]]  # C address of the next row's first element, its bytes
    seen: int = 0  # row loops emitted so far in this task
    done: bool = False
    lines: list[str] = field(default_factory=list)  # per-task setup, before the first pass
    opened: tuple[list[str], str, str] | None = None  # the strip loop's lines, extent, variable

    def note(self, ind: str) -> None:
        """A row loop that cannot carry the prefetch (a max, a blocked sum) is emitted."""
        if ind == self.indent:
            self.seen += 1

    def take(self, ind: str) -> bool:
        """Whether the row loop about to be emitted at ``ind`` carries the prefetch."""
        if self.done or ind != self.indent:
            return False
        self.seen += 1
        if self.seen < 2:
            return False
        self.done = True
        return True

    def strip(self, var: str, extent: str, ind: str, index_type: str) -> tuple[list[str], str, str]:
        """Lines opening the strip loop (the prefetches included) and the bounds of the loop
        over ``var`` inside it; the caller closes both. The strip's length is a C constant
        so that a vector loop over it can make it one pass (``inline``)."""
        sb = f"{var}_s"
        lines = [f"{ind}const int64_t {sb}l = {STRIP};",
                 f"{ind}for ({index_type} {sb} = 0; {sb} < {extent}; {sb} += {sb}l) {{"]  # fmt: skip
        hi = f"lm_min({extent}, {sb} + {sb}l)"
        for j, (_, size) in enumerate(self.targets):
            lines.append(f"{ind}  if (lm_pf) for (int64_t lm_k = {sb} * {size}; lm_k < {hi} * {size}; "
                         f"lm_k += 64) __builtin_prefetch(lm_nx{j} + lm_k, 0, 3);")  # fmt: skip
        self.opened = (lines, extent, sb)
        return lines, sb, hi

    def step_prefetch(self, var: str, lo: str, ind: str) -> list[str] | None:
        """The prefetches a vector loop over ``var`` from ``lo`` makes at each step instead of
        the strip's (one line of the next row per 64 bytes), or None when it is not the loop
        of the strip just opened. The loop's emitter then calls ``inline``."""
        if self.opened is None or lo != self.opened[2]:
            return None
        return [f"{ind}if (lm_pf) __builtin_prefetch(lm_nx{j} + {var} * {size}, 0, 3);"
                for j, (_, size) in enumerate(self.targets)]  # fmt: skip

    def inline(self, em: Emitter) -> None:
        """Turns the open strip loop into one pass over the row without its prefetch lines (a
        vector loop in it prefetches per step, ``step_prefetch``): the strips' prefetch bursts
        and per-strip sums had cost a softmax row (4096 wide, L1-resident, 1 thread) 1.38 ->
        1.23 us."""
        assert self.opened is not None
        lines, extent, _ = self.opened
        self.opened = None
        n = len(lines)
        at = next(i for i in range(len(em.lines) - n, -1, -1) if em.lines[i : i + n] == lines)
        em.lines[at : at + n] = [lines[0].replace(f"= {STRIP};", f"= {extent};"), lines[1]]


def row_prefetch(k: K.Kernel, em: Emitter, indent: str) -> RowPrefetch | None:
    """The next row's addresses for a kernel with one task per row: each unit-stride load of
    a row reduction hoisted to the task, with the reduction's index at 0 and the last outer
    index one further (the next task's row; where that wraps, a harmless wrong address)."""
    from ..cstyle import cexpr

    n = len(k.shape)
    if n < 2:
        return None
    inner = sym.index_var(n - 1, k.shape[-1])
    row = sym.index_var(n - 2, k.shape[-2])
    if not isinstance(inner, sym.Expr) or not isinstance(row, sym.Expr):
        return None
    hoisted = K.invariant_parts(k.value, frozenset({inner.name}), em.fv_memo)
    targets: dict[str, int] = {}
    for h in hoisted:
        for x in K.walk(h):
            if not isinstance(x, K.Reduce):
                continue
            for ld in K.walk(x.body):
                if not isinstance(ld, K.Load) or ld.dtype.packed or ld.dtype.bits < 8:
                    continue
                idx = ld.index
                if not isinstance(idx, sym.Expr) or x.var not in idx.vars():
                    continue
                step = sym.add(
                    sym.substitute(idx, {x.var.name: sym.add(x.var, 1)}), sym.mul(idx, -1)
                )
                if step != 1 or row not in idx.vars():
                    continue
                # the row's first element: every reduction index at 0 (a split sum has two)
                at0: dict[str, sint] = {w.name: 0 for w in idx.vars() if w.name.startswith("_r")}
                nxt = sym.substitute(idx, {**at0, row.name: sym.add(row, 1)})
                if isinstance(nxt, sym.Expr) and any(
                    not w.name.startswith("_i") for w in nxt.vars() if w.name.startswith("_")
                ):
                    continue  # a gather's index: no address before the row runs
                ptr = f"(const char *)&{em.ptr_of(ld.buf)}[{cexpr(nxt)}]"
                targets.setdefault(ptr, ld.dtype.bits // 8)
    if not targets:
        return None
    pf = RowPrefetch(indent, list(targets.items()))
    pf.lines = [f"{indent}const int lm_pf = t + 1 < end; (void)lm_pf;"]
    pf.lines += [f"{indent}const char *lm_nx{j} = {p}; (void)lm_nx{j};"
                 for j, p in enumerate(targets)]  # fmt: skip
    return pf
