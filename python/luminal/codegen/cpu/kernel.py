"""Render kernel IR as C for the CPU target.

Every kernel has the CPU ABI of the plan format::

    void NAME(void *const *args, const int64_t *dims, int64_t begin, int64_t end);

``args`` are the kernel's buffers (output first, then what it reads), ``dims`` the bound plan
dims, ``[begin, end)`` the tasks this call runs. A task is one index of the outer dims (all but
the innermost); the innermost dim is a plain loop the C compiler vectorizes. Low-precision
floats compute in f32 and round once, at the store. Each kernel carries a guarded prelude so
a plan's kernels concatenate into one translation unit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ...compiler import kernel_ir as K
from ...compiler.kfold import folded
from ...compiler.schedule import apply, jam_applies, reduces_per_element
from ...graph import dtypes as dt
from ...graph import symbolic as sym
from ...graph.symbolic import sint
from ...graph.view import contiguous_strides
from ..cstyle import (
    Emitter,
    _c_name,
    _per_element_reduce,
    cexpr,
    ctype,
    storage_ctype,
    store_stmt,
)
from ..prelude import SHARED_HELPERS
from .attention import _render_softmax_rows, _softmax_rows
from .jam import JAM_HELPERS, jam_task
from .rows import (
    ROW_CAP,
    ROW_HELPERS,
    row_caches,
    row_prefetch,
    stageable,
    stream_flag,
)
from .vector import (
    _flat,
    blocked_sum,
    lane_sums,
    mask_window,
    vector_loop,
)
from .vector_prelude import VECTOR_HELPERS

# the C head: what SHARED_HELPERS expect a backend to define
_C_HEAD = r"""
#include <math.h>
#include <stdint.h>
#include <string.h>
#define LM_FN static inline
static inline float lm_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t lm_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
#if defined(__F16C__)
#include <immintrin.h>
/* F16C's conversion writes its whole register; _Float16's (AVX512-FP16 vcvtsh2ss) merges into
   the old value, a false dependency that chained the iterations of quantized-weight loops */
static inline float lm_f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }
#else
static inline float lm_f16_to_f32(uint16_t h) { _Float16 v; memcpy(&v, &h, 2); return (float)v; }
#endif
static inline uint16_t lm_f32_to_f16(float f) { _Float16 v = (_Float16)f; uint16_t h; memcpy(&h, &v, 2); return h; }
/* max(a, b) propagating NaN, without branches (the select of lm_maxf stays a branch): b when
   it is larger, NaN, or +0 against a's -0, as the larger order-preserving integer key of the
   bits would pick. A select on a compare mask: GCC makes it a compare and a blend per vector. */
static inline float lm_max2f(float a, float b) {
  uint32_t m = -(uint32_t)((b > a) | (b != b) | ((b == a) & (int)(lm_f32_bits(a) >> 31)));
  return lm_bits_f32((lm_f32_bits(b) & m) | (lm_f32_bits(a) & ~m));
}
/* the same when c is a constant, neither NaN nor -0 (>=: +0 beats -0); a NaN a stays */
static inline float lm_maxcf(float a, float c) {
  uint32_t m = -(uint32_t)(c >= a);
  return lm_bits_f32((lm_f32_bits(c) & m) | (lm_f32_bits(a) & ~m));
}
/* 2^x without branches, so loops calling it vectorize (libm's exp2f is a scalar call, 7x
   slower). x is clamped to [-151, 129] through bit masks (NaN passes); n = rint(x) by the
   1.5 * 2^23 trick, whose low bits also give n << 23; 2^x = p(x - n) * 2^n, p a degree-6
   minimax polynomial of 2^f on [-0.5, 0.5]; 2^n is applied as two normal factors so results
   down to the subnormals round once; inf, -inf and NaN behave as in exp2f. At most 0.952 ulp
   from f64 exp2 on every float in [-152, 130] (measured, as for lm_vexp2f, the AVX-512 form).
   About 22 vector instructions as GCC vectorizes it. */
#define LM_EXP2_C6 1.5353361959569156e-04f
#define LM_EXP2_C5 1.3398875016719103e-03f
#define LM_EXP2_C4 9.6184369176626200e-03f
#define LM_EXP2_C3 5.5503323674201965e-02f
#define LM_EXP2_C2 2.4022647738456726e-01f
#define LM_EXP2_C1 6.9314718246459961e-01f
static inline float lm_exp2f(float x) {
  uint32_t lo = -(uint32_t)(x < -151.0f);
  float c = lm_bits_f32((0xc3170000u & lo) | (lm_f32_bits(x) & ~lo)); /* two selects: 4 ops */
  uint32_t hi = -(uint32_t)(c > 129.0f);
  c = lm_bits_f32((0x43010000u & hi) | (lm_f32_bits(c) & ~hi));
  float t = c + 12582912.0f, n = t - 12582912.0f, f = c - n, p = LM_EXP2_C6;
  p = p * f + LM_EXP2_C5;
  p = p * f + LM_EXP2_C4;
  p = p * f + LM_EXP2_C3;
  p = p * f + LM_EXP2_C2;
  p = p * f + LM_EXP2_C1;
  p = p * f + 1.0f;
  uint32_t k = lm_f32_bits(t) << 23, k1 = (uint32_t)((int32_t)k >> 1) & 0xff800000u;
  return p * lm_bits_f32(k1 + 0x3f800000u) * lm_bits_f32(k - k1 + 0x3f800000u);
}
/* log2(x) without branches, so loops calling it vectorize (libm's log2f is a scalar call).
   x = 2^e * m with m in [sqrt(1/2), sqrt(2)) read from the bits (a subnormal x scaled by 2^23
   first), f = m - 1, log2(1 + f) = L*f + f^2 * R(f) with L = log2(e) as two floats and R a
   degree-9 fit (tools/fit_log2.py); e is exact and log2(1 + f) stays relative-accurate near
   x = 1. Edges by bit selects: +-0 -> -inf, x < 0 and NaN -> NaN, +inf -> +inf. At most
   0.95 ulp from f64 log2 (tests/test_transcendental_log2.py). */
#define LM_LOG2E_HI 1.44269502162933350e+00f
#define LM_LOG2E_LO 1.92596303350001108e-08f
#define LM_LOG2_R9 9.70216989517211914e-02f
#define LM_LOG2_R8 -1.68449535965919495e-01f
#define LM_LOG2_R7 1.71694532036781311e-01f
#define LM_LOG2_R6 -1.79000094532966614e-01f
#define LM_LOG2_R5 2.05117776989936829e-01f
#define LM_LOG2_R4 -2.40463912487030029e-01f
#define LM_LOG2_R3 2.88571029901504517e-01f
#define LM_LOG2_R2 -3.60674142837524414e-01f
#define LM_LOG2_R1 4.80898022651672363e-01f
#define LM_LOG2_R0 -7.21347510814666748e-01f
static inline float lm_log2f(float x) {
  const uint32_t sub = -(uint32_t)(x < 1.17549435e-38f);
  const uint32_t b = (lm_f32_bits(x * 8388608.0f) & sub) | (lm_f32_bits(x) & ~sub);
  const int32_t t = (int32_t)(b - 0x3f3504f3u);
  const float e = (float)((t >> 23) - (int32_t)(sub & 23u));
  const float f = lm_bits_f32(((uint32_t)t & 0x007fffffu) + 0x3f3504f3u) - 1.0f;
  float q = LM_LOG2_R9;
  q = q * f + LM_LOG2_R8;
  q = q * f + LM_LOG2_R7;
  q = q * f + LM_LOG2_R6;
  q = q * f + LM_LOG2_R5;
  q = q * f + LM_LOG2_R4;
  q = q * f + LM_LOG2_R3;
  q = q * f + LM_LOG2_R2;
  q = q * f + LM_LOG2_R1;
  q = q * f + LM_LOG2_R0;
  const float f2 = f * f, lo = f * LM_LOG2E_LO;
  const float r = e + (f * LM_LOG2E_HI + (f2 * q + lo));
  const uint32_t pos = -(uint32_t)(x > 0.0f), zero = -(uint32_t)(x == 0.0f);
  const uint32_t inf = -(uint32_t)(x == INFINITY);
  return lm_bits_f32((lm_f32_bits(r) & pos & ~inf) | (0x7f800000u & inf) | (0xff800000u & zero) |
                     (0x7fc00000u & ~pos & ~zero));
}
"""

# every generated CPU kernel starts with this (one guarded copy per translation unit)
PRELUDE = (
    "\n#ifndef LM_PRELUDE\n#define LM_PRELUDE"
    + _C_HEAD
    + SHARED_HELPERS
    + VECTOR_HELPERS
    + JAM_HELPERS
    + ROW_HELPERS
    + "#endif\n"
)


class CpuEmitter(Emitter):
    """The C emitter with the CPU's explicit-vector split sums and exp-heavy loops
    (``vector.py``)."""

    select_masks = True

    def vector_sum(self, v: K.Reduce, ind: str) -> str | None:
        return blocked_sum(self, v, ind)

    def vector_sum_loop(self, v: K.Reduce, acc: str, lo: str, hi: str, ind: str) -> str | None:
        cache, rv = self.row_cache.get(v), _c_name(v.var)
        accv = self.tmp()
        # the next row's prefetch made per step, where this loop is a row prefetch's strip
        ahead = self.prefetch.step_prefetch(rv, lo, ind + "  ") if self.prefetch else None

        def step(x: str, at: str) -> list[str]:
            out = [f"{ind}  {accv} += {x};", *(ahead or [])]
            if cache is not None:  # the row cache of the sum's body values (rows.py)
                out.insert(0, f"{ind}  memcpy(&{cache}[{rv}], &{x}, sizeof {x});")
            return out

        loop = vector_loop(self, v.body, v.var, lo, hi, ind, step)
        if loop is None:
            return None
        if ahead is not None:
            self.prefetch.inline(self)
        self.lines += [f"{ind}lm_f32v {accv} = {{0}};", *loop[0],
                       f"{ind}{acc} += lm_vsum_f32({accv});"]  # fmt: skip
        if cache is not None:
            self.cached.add(v)
        return loop[1]

    def vector_max_loop(self, v: K.Reduce, key: str, nan: str, hi: str, ind: str) -> str | None:
        mv, nm = self.tmp(), self.tmp()

        def step(x: str, at: str) -> list[str]:
            return [f"{ind}  {mv} = lm_vmaxf({mv}, {x});", f"{ind}  {nm} |= lm_vnanmask({x});"]

        loop = vector_loop(self, v.body, v.var, "0", hi, ind, step, always=True)
        if loop is None:
            return None
        # the lanes are folded only where the vector loop ran (a short run has no vector)
        self.lines += [f"{ind}lm_f32v {mv} = lm_vsplatf(-INFINITY); int32_t {nm} = 0;", *loop[0],
                       f"{ind}if ({loop[1]}) lm_vmax_fold({mv}, {nm}, &{key}, &{nan});"]  # fmt: skip
        return loop[1]


@dataclass
class CKernel:
    name: str
    source: str
    args: list[int]  # buffer ids: output first, then the buffers it reads
    tasks: sint  # grid[0]
    min_chunk: int  # tasks per thread chunk hint


def _row_start(shape: Sequence[sint]) -> sint:
    """The flat index of the current task's row (every index but the innermost)."""
    row0: sint = 0
    for j, st in enumerate(contiguous_strides(shape)[:-1]):
        row0 = sym.add(row0, sym.mul(sym.index_var(j, shape[j]), st))
    return row0


def render_kernel(k: K.Kernel, dim_names: Sequence[str], inner_chunk: int = 1024) -> CKernel:
    scheduled = apply(k)  # a no-op on a scheduled kernel (the pipeline's loop_rewrites stage)
    assert isinstance(scheduled, K.Kernel)
    k = folded(scheduled)
    reads = sorted({v.buf for v in K.walk(k.value) if isinstance(v, K.Load)}
                   | ({v.buf for v in K.walk(k.scatter_row) if isinstance(v, K.Load)} if k.scatter_row else set()))  # fmt: skip
    reads = [b for b in reads if b != k.out] + ([k.out] if k.out in reads else [])
    args = [k.out] + [b for b in reads if b != k.out]
    slot = {b: i for i, b in enumerate(args)}
    dtypes: dict[int, dt.DType] = {k.out: k.dtype}
    for v in K.walk(k.value):
        if isinstance(v, K.Load):
            dtypes[v.buf] = v.dtype
    if k.scatter_row is not None:
        for v in K.walk(k.scatter_row):
            if isinstance(v, K.Load):
                dtypes[v.buf] = v.dtype
    em = CpuEmitter(lambda b: f"b{slot[b]}")
    shape = k.shape
    n = len(shape)
    lines = [
        f"void {k.name}(void *const *args, const int64_t *dims, int64_t begin, int64_t end) {{"
    ]
    for b, i in slot.items():
        const = "" if i == 0 else "const "
        lines.append(
            f"  {const}{storage_ctype(dtypes[b])} *restrict b{i} = ({const}{storage_ctype(dtypes[b])} *)args[{i}];"
        )
    for i, name in enumerate(dim_names):
        lines.append(f"  const int64_t d_{name} = dims[{i}]; (void)d_{name};")
    # what depends on no loop variable (an expression of a scalar input) runs once per call;
    # not in a kernel that reads its own output (a read must see the writes before it)
    if k.out not in reads:
        em.hoist(k.value, K.free_vars(k.value, em.fv_memo), "  ", anywhere=True)
        lines += em.lines
    ext = [cexpr(s) for s in shape]
    ivars = [f"i{j}" for j in range(n)]
    body_ind = "    "

    if _softmax_rows(k):
        row_tasks = _render_softmax_rows(k, em, lines, ext)
        lines.append("}")
        return CKernel(k.name, PRELUDE + "\n".join(lines) + "\n", args, row_tasks, 1)
    stage = 0  # elements of a task's staged output run (rows.py); 0: plain stores
    jam = 0  # elements of the jammed dim per task (K.Schedule.jam); 0: no jam
    odometer = False
    window: tuple[list[str], list[str], sint] | None = None  # see vector.mask_window
    masked: tuple[sint, K.Value] | None = None
    if n == 0:
        tasks: sint = 1
        lines.append("  for (int64_t t = begin; t < end; ++t) {")
        loop_close = ["  }"]
    else:
        inner_var = f"_i{n - 1}"
        # a task is one chunk of the innermost dim at one index of the outer dims; elements
        # that each run a reduction (a GEMV row) get small chunks so every thread has work
        red = _per_element_reduce(k.value, inner_var)
        # a row value hoisted out of the inner loop (softmax's row sum) is computed once per
        # task: never split such a row into chunks, each would recompute it
        hoisted = K.invariant_parts(k.value, frozenset({inner_var}), {})
        row_reduce = any(
            isinstance(x, (K.Reduce, K.SoftmaxSum)) for h in hoisted for x in K.walk(h)
        )
        # rows per task of a per-element reduce (a GEMV): the search's choice, else 16
        rows = (k.schedule.chunk if k.schedule is not None else 0) or 16
        if red and k.schedule is not None and k.schedule.jam2 > 1:  # whole column blocks
            rows = -(-rows // k.schedule.jam2) * k.schedule.jam2
        chunk = rows if red else (2**62 if row_reduce and n >= 2 else inner_chunk)
        nchunks = sym.ceildiv(shape[-1], chunk)
        # a jammed dim's tasks are its blocks of indices (jam.py)
        sched = k.schedule
        blocks = list(shape[:-1])
        if red and sched is not None and sched.jam > 1 and jam_applies(k, sched.jam_dim):
            jam = sched.jam
            blocks[sched.jam_dim] = sym.ceildiv(shape[sched.jam_dim], jam)
            ext[sched.jam_dim] = cexpr(blocks[sched.jam_dim])
        elif red and sched is not None and sched.jam2 > 1:  # columns only (apply checked it)
            jam = 1
        tasks = nchunks
        for sz in blocks:
            tasks = sym.mul(tasks, sz)
        single = sym.upper_bound(shape[-1]) <= chunk
        stage = 0 if k.out in reads else stageable(k, chunk, red)
        inner_ix = sym.index_var(n - 1, shape[-1])
        caches = {}
        if (
            single
            and not jam
            and isinstance(inner_ix, sym.Expr)
            and sym.upper_bound(shape[-1]) <= ROW_CAP
        ):
            caches = row_caches(k, inner_ix, em)
        for j, r in enumerate(caches):
            em.row_cache[r] = f"lm_rc{j}"
            lines.append(f"  {ctype(r.dtype)} lm_rc{j}[{sym.upper_bound(shape[-1])}] "
                         "__attribute__((aligned(64)));")  # fmt: skip
        stage_buf = "lm_st"
        if stage:
            # a row cache of the output's type doubles as it: each element reads only its own
            # cache entry before writing it, and one row buffer less is L1 kept for the row
            same = [j for j, r in enumerate(caches) if ctype(r.dtype) == storage_ctype(k.dtype)]
            if same:
                stage_buf = f"lm_rc{same[0]}"
            else:
                lines.append(
                    f"  {storage_ctype(k.dtype)} lm_st[{stage}] __attribute__((aligned(64)));"
                )
            lines.append(f"  const int lm_nt = {stream_flag(k)};")
        order = k.schedule.order if k.schedule is not None else 0
        # the outer indices of the first task are divided out once, then advanced like an
        # odometer: a division chain per task cost more than a short row's work (a conv's
        # im2col rows of 8-32 elements; 64-bit divides take 40+ cycles on some cores)
        odometer = single or order != 1 or n < 2
        t0 = "begin" if odometer else "t"
        decl = "int64_t" if odometer else "const int64_t"
        dec: list[str] = []
        rem = t0 if single else "q"
        if not single and order == 1 and n >= 2:
            # the outer indices vary fastest: consecutive tasks (one thread's share) read the
            # same chunk of columns, whose operands (a weight's rows) stay in cache
            outer: sint = 1
            for sz in blocks:
                outer = sym.mul(outer, sz)
            dec.append(
                f"    const int64_t c = t / {cexpr(outer)}, q = t % {cexpr(outer)}; (void)q;"
            )
        elif not single:
            dec.append(
                f"    {decl} c = {t0} % {cexpr(nchunks)}, q = {t0} / {cexpr(nchunks)}; (void)q;"
            )
        for j in range(n - 2, -1, -1):
            if j == 0:
                dec.append(f"    {decl} i0 = {rem};")
            else:
                dec.append(f"    {decl} i{j} = {rem} % {ext[j]};")
                dec.append(f"    const int64_t q{j} = {rem} / {ext[j]}; (void)q{j};")
                rem = f"q{j}"
        if odometer:
            lines += [x[2:] for x in dec]
            lines.append("  for (int64_t t = begin; t < end; ++t) {")
        else:
            lines.append("  for (int64_t t = begin; t < end; ++t) {")
            lines += dec
        # per-row values (a row's max or sum feeding every element) are computed once per row
        em.lines = []
        if single and row_reduce and n >= 2 and not jam:
            em.prefetch = row_prefetch(k, em, "    ")
            if em.prefetch is not None:
                em.lines += em.prefetch.lines
        if not jam:  # a jammed block hoists each of its copies' row values (jam.py)
            em.hoist(k.value, frozenset({inner_var}), "    ")
        lines += em.lines
        iv = f"i{n - 1}"
        for r, body_v in caches.items():
            if r in em.cached:  # the sum loop wrote the body's values: read them back
                em.scopes[-1][body_v] = f"{em.row_cache[r]}[{iv}]"
        if single:
            lo, hi = "0", ext[n - 1]
        else:
            lo, hi = f"c * {chunk}", "hi"
            lines.append(f"    const int64_t hi = lm_min({ext[n - 1]}, (c + 1) * {chunk});")
        masked = _unmasked(k.value)
        if (
            masked is not None
            and isinstance(inner_ix, sym.Expr)
            and not red
            and not caches
            and em.prefetch is None
            and k.scatter_row is None
        ):
            window = mask_window(masked[0], inner_ix)
        # a padded row runs as vectors of lanes, its padding a window of them: a row shorter
        # than a vector (a conv's im2col rows of 3 or 7 taps) is one vector where the scalar
        # form pays a loop per row, and a row of 14-100 copies 1.2-3x faster than as GCC's
        # vectorized window loop with its scalar ends and zero loops (staged conv patches, 1
        # thread; rows of 112-224, bound by memory, alike); a row read at stride 2 takes two
        # loads and a permute per vector, where GCC's form of the scalar loop gathers
        short = window is not None and k.dtype is dt.f32 and isinstance(inner_ix, sym.Expr)
        if short:
            window = None
        start = lo  # where the scalar element loop starts (after a vector loop's part)
        if jam:
            pass  # jam_task writes the element loops
        elif window is None:
            half = k.dtype in (dt.bf16, dt.f16) and not stage
            if (
                k.scatter_row is None
                and (k.dtype is dt.f32 or half)
                and isinstance(inner_ix, sym.Expr)
            ):
                # exp-heavy values and staged runs: a vector loop first, stored straight to the
                # output (streamed where the run would be staged to stream: no copy through the
                # stack buffer); the scalar loop takes the rest. A bf16 or f16 output is stored
                # rounded from the f32 lanes (a GEMM's half operand).
                over = {b: f"lm_vload_f32(&{em.row_cache[r]}[{iv}])"
                        for r, b in caches.items() if r in em.cached}  # fmt: skip
                summed = lane_sums(k.value, inner_ix)
                dst = f"&b0[{cexpr(_flat(shape, {}))}]"
                nt = "lm_nt" if stage else "0"
                vloop_args: dict[str, Any] = dict(
                    over=over, always=bool(stage) or summed or short,
                    # a row kernel's row is in cache already (rows.py prefetches the next)
                    prefetch=bool(stage) and not row_reduce and em.prefetch is None,
                )  # fmt: skip
                # a reduction per element: a row's last columns as one shorter vector (a
                # conv's rows of 7 or 28 columns are mostly tail)
                tail = ((lambda x, n: [f"      lm_vstore_f32_lanes({dst}, {x}, {n});"])
                        if not half and (short or reduces_per_element(k)) else None)  # fmt: skip
                vloop: tuple[list[str], str] | None = None
                if stage and not half:
                    # streamed: up to the first 64-byte boundary, then whole aligned vectors
                    run0 = f"&b0[{cexpr(_row_start(shape))} + {lo}]"
                    setup = [f"    const int lm_so = lm_stream_ok({run0}, lm_nt);",
                             f"    const int64_t lm_he = lm_stream_head({run0}, lm_so, {lo}, {hi});"]  # fmt: skip
                    head = vector_loop(
                        em, k.value, inner_ix, lo, "lm_he", "    ",
                        lambda x, at: [f"      {at} += lm_vstore_out({dst}, {x}, lm_so);"],
                        advance=True, **{**vloop_args, "prefetch": False},
                    )  # fmt: skip
                    if head is not None:
                        vloop = vector_loop(
                            em, k.value, inner_ix, head[1], hi, "    ",
                            lambda x, at: [f"      lm_vstore_s({dst}, {x}, lm_so);"],
                            tail=tail, **vloop_args,
                        )  # fmt: skip
                    if vloop is not None:
                        assert head is not None
                        vloop = (setup + head[0] + vloop[0], vloop[1])
                else:
                    vloop = vector_loop(
                        em, k.value, inner_ix, lo, hi, "    ",
                        (lambda x, at: [f"      lm_vstore_{k.dtype.name}({dst}, {x});",
                                        f"      {at} += LM_VL;"])
                        if half else
                        (lambda x, at: [f"      {at} += lm_vstore_out({dst}, {x}, {nt});"]),
                        advance=True, tail=tail, **vloop_args,
                    )  # fmt: skip
                if vloop is not None:
                    lines += vloop[0]
                    start = vloop[1]
            lines.append(f"    for (int64_t {iv} = {start}; {iv} < {hi}; ++{iv}) {{")
        else:
            lines += _window_bounds(window, lo, hi)
            lines.append(f"    for (int64_t {iv} = lm_wlo; {iv} < lm_whi; ++{iv}) {{")
        body_ind = "      "
        loop_close = ["    }", "  }"]
        if stage:
            loop_close = ["    }",
                          f"    lm_copy_out(&b0[{cexpr(_row_start(shape))} + {start}], &{stage_buf}[{start} - {lo}], "
                          f"({hi} - {start}) * (int64_t)sizeof({stage_buf}[0]), lm_nt);", "  }",
                          "  lm_stream_fence(lm_nt);"]  # fmt: skip
    body: list[str] = []
    if jam:
        lines += jam_task(
            em,
            k,
            lo,
            hi,
            lambda i, x, ind: ind + store_stmt("b0", cexpr(i), x, k.dtype),
            span=None if single else chunk,
        )
        loop_close = ["  }"]
    else:
        for j in range(n):
            lines.append(f"{body_ind}(void){ivars[j]};")
        em.lines = []
        val = em.emit(k.value if window is None or masked is None else masked[1], body_ind)
        body = list(em.lines)
    if jam:
        pass  # jam_task stores each element of a block
    elif k.scatter_row is None:
        flat = _flat(shape, {})

        def store(x: str, ind: str) -> str:
            if stage:
                return f"{ind}{stage_buf}[{ivars[-1]} - {lo}] = {x};"
            return ind + store_stmt("b0", cexpr(flat), x, k.dtype)

        body.append(store(val, body_ind))
        if window is not None:
            # the padding around the window: zeros, in loops without a per-element test
            zero = f"(({ctype(k.dtype)})0)"
            iv = ivars[-1]
            loop_close = [
                "    }",
                f"    for (int64_t {iv} = {lo}; {iv} < lm_wlo; ++{iv}) {store(zero, '')}",
                f"    for (int64_t {iv} = lm_whi; {iv} < {hi}; ++{iv}) {store(zero, '')}",
                *loop_close[1:],
            ]
    else:
        em.lines = []
        row = em.emit(k.scatter_row, body_ind)
        body += em.lines
        inner_shape = shape[k.row_dims :]
        inner: sint = 0
        for j, (s, st) in enumerate(zip(inner_shape, contiguous_strides(inner_shape))):
            inner = sym.add(inner, sym.mul(sym.index_var(k.row_dims + j, s), st))
        row_size: sint = 1
        for s in inner_shape:
            row_size = sym.mul(row_size, s)
        body.append(f"{body_ind}{{ const int64_t row = (int64_t)({row});")
        body.append(f"{body_ind}  if (row >= 0 && row < {cexpr(k.scatter_rows)}) "
                    + store_stmt("b0", f"row * {cexpr(row_size)} + {cexpr(inner)}", val, k.dtype) + " }")  # fmt: skip
    group = 0
    if n >= 3 and odometer and single and short and not stage and not jam:
        nxt = shape[n - 2]
        if isinstance(nxt, int) and 1 < nxt <= GROUP_ROWS_MAX and sym.upper_bound(shape[-1]) <= 16:
            group = nxt
    if group:
        lines = _grouped_rows(lines, body + loop_close, n, ext, group)
    elif n >= 1 and odometer:
        # the t loop's closing brace is the last of loop_close that is not the stream fence
        at = max(i for i, x in enumerate(loop_close) if x == "  }")
        loop_close = (
            loop_close[:at] + _advance(n, ext, None if single else cexpr(nchunks)) + loop_close[at:]
        )
    if not group:
        lines += body + loop_close + ["}"]
    inner_elems = min(sym.upper_bound(shape[-1]), chunk) if n >= 1 else 1
    min_chunk = 1 if n >= 1 and red else max(1, 4096 // max(inner_elems, 1))
    if k.dtype.packed or k.scatter_row is not None:
        # packed stores read-modify-write shared bytes, and scatters may write one row from
        # several tasks: keep both on one thread
        min_chunk = 2**62
    return CKernel(k.name, PRELUDE + "\n".join(lines) + "\n", args, tasks, min_chunk)


# rows of the next axis out taken together as one unrolled step: it bounds the code a
# kernel's step grows to (one short row is a few instructions), not tuned
GROUP_ROWS_MAX = 16
_TASK_LOOP = "  for (int64_t t = begin; t < end; ++t) {"


def _grouped_rows(lines: list[str], rest: list[str], n: int, ext: list[str],
                  group: int) -> list[str]:  # fmt: skip
    """A kernel of short rows (a conv's im2col rows of 3 or 7 taps, one vector each) whose
    next axis out has ``group`` (a small constant) indices: where a thread's range holds all
    of them from index 0, one step copies the whole group, that index a constant of an
    unrolled loop (its masks and addresses hoisted, no odometer branch per row); other rows,
    at the ends of a range, one by one. A stem conv's 7x7 stride-2 patches (3x224x224 input,
    batch 1, 1 thread): 1.17 -> 0.43 ms, the odometer's branch per 7-tap row was most of it."""
    at = lines.index(_TASK_LOOP)
    close = max(i for i, x in enumerate(rest) if x == "  }")
    task = lines[at + 1 :] + rest[:close]
    g = f"i{n - 2}"
    return [
        *lines[:at],
        "  for (int64_t t = begin; t < end;) {",
        f"    if ({g} == 0 && t + {group} <= end) {{",
        f"      for (int64_t lm_g = 0; lm_g < {group}; ++lm_g) {{",
        f"        const int64_t {g} = lm_g;",
        *("    " + x for x in task),
        "      }",
        f"      t += {group};",
        *("  " + x for x in _advance(n - 1, ext, None)),
        "      continue;",
        "    }",
        *task,
        "    ++t;",
        *_advance(n, ext, None),
        *rest[close:],
        "}",
    ]


def _advance(n: int, ext: list[str], nchunks: str | None) -> list[str]:
    """The next task's chunk and outer indices, carried like an odometer (see render_kernel)."""
    steps = ([("c", nchunks)] if nchunks is not None else []) + [
        (f"i{j}", ext[j]) for j in range(n - 2, 0, -1)
    ]
    last = "++i0;" if n >= 2 else ""
    out = last
    for name, e in reversed(steps):
        out = f"if (++{name} == {e}) {{ {name} = 0; {out} }}"
    return [f"    {out}"] if out else []


def _unmasked(v: K.Value) -> tuple[sint, K.Value] | None:
    """(mask, value without it) of a value that is zero outside a mask: padding."""
    if isinstance(v, K.Masked):
        return v.valid, v.value
    if isinstance(v, K.Load) and v.valid != 1:
        return v.valid, replace(v, valid=1)
    return None


def _window_bounds(window: tuple[list[str], list[str], sint], lo: str, hi: str) -> list[str]:
    los, his, rest = window
    wlo, whi = lo, hi
    for e in los:
        wlo = f"lm_max({wlo}, {e})"
    for e in his:
        whi = f"lm_min({whi}, {e})"
    out = [f"    int64_t lm_wlo = lm_min({wlo}, {hi}), lm_whi = lm_max({whi}, lm_wlo);"]
    if rest != 1:
        out.append(f"    if (!({cexpr(rest)})) lm_whi = lm_wlo;")
    return out
