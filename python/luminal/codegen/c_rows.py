"""Row-wise forms of CPU kernels whose tasks each write a contiguous run of the output.

Two rewrites, both chosen from the shape of the kernel IR (no op is special-cased):

- **Cached row sums.** A kernel whose value holds a row reduction hoisted out of the inner
  loop (softmax's sum of exponentials, with its row max hoisted further out) evaluates the
  reduction's body once per element in the sum's loop and, when the same expression also
  appears in the element's value, again in the inner loop. When that body holds a costly op
  (exp2, log2, sin, sqrt, recip) the sum loop also writes each body value to a row buffer on
  the stack (L1-resident for rows up to ``ROW_CAP`` elements), and the inner loop reads it
  back instead of recomputing it.
- **Staged streaming stores.** A task computes its run into a stack buffer, then copies it
  out. When the whole output is large (``STREAM_BYTES``), the copy uses non-temporal stores:
  the output is written without first being read into the cache (a normal store's
  read-for-ownership makes a memory-bound kernel move 3 bytes per byte written instead of 2),
  and it does not evict the inputs. A smaller output is copied with ``memcpy`` and stays
  cached for the kernel that reads it next.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..compiler import kernel_ir as K
from ..graph import dtypes as dt
from ..graph import symbolic as sym
from ..graph.ops import Op
from ..graph.symbolic import sint

if TYPE_CHECKING:
    from .c import _Emitter

# stack buffers per row: 8192 f32 = 32 KiB, so a row and its cache stay in L1/L2
ROW_CAP = 8192
# outputs at least this large are written with non-temporal stores: larger than the caches
# a following kernel could read them from
STREAM_BYTES = 32 << 20

_COSTLY = frozenset({Op.EXP2, Op.LOG2, Op.SIN, Op.SQRT, Op.RECIP})

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
    if run <= 0 or run > ROW_CAP:
        return 0
    total: sint = k.dtype.bits // 8
    for s in k.shape:
        total = sym.mul(total, s)
    if sym.upper_bound(total) < STREAM_BYTES:
        return 0  # never large enough to stream: plain stores keep the output cached
    return run


def stream_flag(k: K.Kernel) -> str:
    """C expression: whether this call's output is large enough to stream."""
    from .c import cexpr

    total: sint = k.dtype.bits // 8
    for s in k.shape:
        total = sym.mul(total, s)
    return f"(int)(({cexpr(total)}) >= {STREAM_BYTES}LL)"


def row_caches(k: K.Kernel, inner: sym.Expr, em: _Emitter) -> dict[K.Reduce, K.Value]:
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
