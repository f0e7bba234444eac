"""Render kernel IR as Metal Shading Language (compiled by the Metal runtime at plan load).

The value trees render through the shared C-style emitter; the Metal flavour is the kernel
frame (``device``/``constant`` address spaces, ``[[buffer(i)]]`` and thread-position
attributes), the prelude (the ``lm_*`` helpers as inline functions, C math names mapped to
Metal's) and reductions spread over a threadgroup: ``simd_sum``/``simd_max`` within a
simdgroup, one partial per simdgroup through ``threadgroup`` memory. Low-precision floats
are stored as they are (16-bit half/bfloat bits) and computed in f32. Every kernel has the
ABI::

    kernel void NAME(device T0 *b0 [[buffer(0)]], device const T1 *b1 [[buffer(1)]], ...,
                     constant int64_t *lm_dims [[buffer(NBUF)]], <thread positions>)

buffers first (output first, then what it reads), then every plan dim, in plan order, in one
constant buffer (the runtime binds it with ``setBytes``; at least one slot). Grids count
threadgroups, as CUDA's count blocks. The thread mappings are the CUDA renderer's
(``choose_schedule``: thread, row, element, scatter); the threadgroup size of each is the
one the Metal cost model ranks first (``schedule.py``). Metal has no 64-bit floats: an f64
kernel is refused with its name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ...compiler import kernel_ir as K
from ...compiler.kfold import folded
from ...graph import dtypes as dt
from ...graph import symbolic as sym
from ...graph.ops import Op
from ...graph.symbolic import sint
from ..cstyle import (
    Emitter,
    _c_name,
    cexpr,
    ctype,
    reduce_init,
    reduce_update,
    storage_ctype,
    store_stmt,
)
from ..cuda.kernel import (
    _exprs,
    _fits_i32,
    _flat_store_index,
    _numel,
    _unflatten_lines,
    choose_schedule,
    kernel_buffers,
)
from ..prelude import SHARED_HELPERS

HEAD = r"""#include <metal_stdlib>
using namespace metal;
"""

# Metal has no double: the shared f64 helper is left out (f64 kernels are refused)
_HELPERS = "".join(ln for ln in SHARED_HELPERS.splitlines(True) if "double" not in ln)

PRELUDE = (
    HEAD
    + r"""#ifndef LM_PRELUDE
#define LM_PRELUDE
#ifndef INT8_MIN
#define INT8_MIN (-128)
#endif
#ifndef INT32_MIN
#define INT32_MIN (-2147483647 - 1)
#endif
#ifndef INT64_MIN
#define INT64_MIN (-9223372036854775807L - 1)
#endif
#define LM_FN static inline
LM_FN float lm_bits_f32(uint32_t u) { return as_type<float>(u); }
LM_FN uint32_t lm_f32_bits(float f) { return as_type<uint32_t>(f); }
LM_FN float lm_f16_to_f32(uint16_t h) { return (float)as_type<half>(h); }
LM_FN uint16_t lm_f32_to_f16(float f) { return as_type<uint16_t>((half)f); }
LM_FN float lm_frexpf(float x, thread int *e) { return frexp(x, *e); }
/* the C names the shared helpers and the emitter use */
#define exp2f exp2
#define log2f log2
#define sinf sin
#define sqrtf sqrt
#define fmodf fmod
#define truncf trunc
#define fabsf fabs
#define ldexpf ldexp
#define frexpf lm_frexpf
"""
    + _HELPERS
    + r"""#endif
"""
)

# the thread-position arguments every kernel declares (Metal fills them per thread)
POSITIONS = (
    "uint3 lm_tg [[threadgroup_position_in_grid]]",
    "uint3 lm_tid [[thread_position_in_threadgroup]]",
    "uint3 lm_ntg [[threadgroups_per_grid]]",
    "uint lm_lane [[thread_index_in_simdgroup]]",
    "uint lm_sg [[simdgroup_index_in_threadgroup]]",
)
SIMD = 32  # threads per simdgroup on Apple GPUs
# types Metal's simd_* functions take (no 64-bit types)
_SIMD_TYPES = ("float", "int32_t", "uint32_t", "int16_t", "uint16_t", "int8_t", "uint8_t")


@dataclass
class MetalKernel:
    name: str
    source: str
    args: list[int]  # buffer ids: output first, then the buffers it reads
    grid: tuple[sint, sint, sint]  # threadgroups
    block: tuple[int, int, int]  # threads per threadgroup
    schedule: str


def unsupported(k: K.Kernel) -> str | None:
    """None when Metal can run ``k``, else why not."""
    trees = [k.value] + ([k.scatter_row] if k.scatter_row is not None else [])
    if k.dtype is dt.f64 or any(v.dtype is dt.f64 for t in trees for v in K.walk(t)):
        return "Metal has no 64-bit floats (f64)"
    return None


def frame(name: str, params: Sequence[str], n_bufs: int) -> str:
    """The kernel's head: buffer parameters, the dims buffer, the thread positions."""
    allp = [*params, f"constant int64_t *lm_dims [[buffer({n_bufs})]]", *POSITIONS]
    return f"kernel void {name}({', '.join(allp)}) {{"


def dim_lines(dim_names: Sequence[str], ix: str) -> list[str]:
    return [f"  const {ix} d_{n} = ({ix})lm_dims[{i}]; (void)d_{n};"
            for i, n in enumerate(dim_names)]  # fmt: skip


class MetalEmitter(Emitter):
    """The C emitter with Metal's reductions: one met outside any loop or branch is shared
    by the threadgroup (simdgroup functions, then one partial per simdgroup)."""

    simd_reductions = False  # the CPU's vector idioms; Metal reductions are simd_* calls
    fast_exp2 = False  # exp2 is a hardware instruction on the GPU

    def __init__(
        self, ptr_of: Callable[[int], str], index_type: str, threads: int, block_reduce: bool
    ) -> None:
        super().__init__(ptr_of)
        self.index_type = index_type
        self.threads = threads
        self.block_reduce = block_reduce
        # threadgroup arrays, declared at the top of the kernel (Metal allows them only there)
        self.shared: list[str] = []

    def _emit(self, v: K.Value, ind: str) -> str:
        if isinstance(v, K.Reduce) and self.block_reduce and len(self.scopes) == 1:
            return self._group_reduce(v, ind)
        return super()._emit(v, ind)

    def _group_reduce(self, v: K.Reduce, ind: str) -> str:
        t, init = ctype(v.dtype), reduce_init(v.op, v.dtype)
        self.hoist(v.body, frozenset({v.var.name}), ind)
        acc, sh = self.tmp(), self.tmp()
        rv, ix, n = _c_name(v.var), self.index_type, self.threads
        L = self.lines.append
        L(f"{ind}{t} {acc} = {init};")
        L(f"{ind}for ({ix} {rv} = ({ix})lm_tid.x; {rv} < {cexpr(v.extent)}; {rv} += {n}) {{")

        def body() -> None:
            x = self.emit(v.body, ind + "  ")
            L(f"{ind}  {acc} = {reduce_update(v.op, v.dtype, acc, x)};")

        self.block(body)
        L(f"{ind}}}")
        fold = f"{acc} = {reduce_update(v.op, v.dtype, acc, f'{sh}[j]')};"
        if t in _SIMD_TYPES:
            # within a simdgroup by its functions (every lane runs them), then the groups'
            # partials through threadgroup memory, folded by every thread
            if v.op is Op.SUM_REDUCE:
                L(f"{ind}{acc} = simd_sum({acc});")
            elif t == "float":  # simd_max may drop NaN: the max propagates it
                L(f"{ind}{{ const bool lm_nan = simd_any({acc} != {acc}); {acc} = simd_max({acc});"
                  f" if (lm_nan) {acc} = NAN; }}")  # fmt: skip
            else:
                L(f"{ind}{acc} = simd_max({acc});")
            groups = max(1, n // SIMD)
            self.shared.append(f"  threadgroup {t} {sh}[{groups}];")
            L(f"{ind}if (lm_lane == 0) {sh}[lm_sg] = {acc};")
            L(f"{ind}threadgroup_barrier(mem_flags::mem_threadgroup);")
            L(f"{ind}{acc} = {init};")
            L(f"{ind}for (int j = 0; j < {groups}; ++j) {fold}")
        else:  # 64-bit integers: a tree in threadgroup memory
            self.shared.append(f"  threadgroup {t} {sh}[{n}];")
            L(f"{ind}{sh}[lm_tid.x] = {acc};")
            L(f"{ind}threadgroup_barrier(mem_flags::mem_threadgroup);")
            upd = reduce_update(v.op, v.dtype, f"{sh}[lm_tid.x]", f"{sh}[lm_tid.x + s]")
            L(f"{ind}for (uint s = {n // 2}; s > 0; s >>= 1) {{ if (lm_tid.x < s) "
              f"{sh}[lm_tid.x] = {upd}; threadgroup_barrier(mem_flags::mem_threadgroup); }}")  # fmt: skip
            L(f"{ind}{acc} = {sh}[0];")
        return acc


def render_kernel(
    k: K.Kernel, dim_names: Sequence[str], schedule: str | None = None, threads: int | None = None
) -> MetalKernel:
    """MSL for one kernel, with its launch geometry (expressions over plan dims)."""
    from .schedule import choose_threads

    why = unsupported(k)
    if why is not None:
        raise ValueError(f"kernel {k.name}: cannot run on Metal: {why}")
    k = folded(k)
    schedule = schedule or ("softmax_row" if softmax_rows(k) else choose_schedule(k))
    args, dtypes = kernel_buffers(k)
    slot = {b: i for i, b in enumerate(args)}
    shape, n = k.shape, len(k.shape)
    numel = _numel(shape)
    exprs: list[sint] = [*shape, numel, _flat_store_index(shape), *_exprs(k.value)]
    if k.scatter_row is not None:
        exprs += _exprs(k.scatter_row) + [k.scatter_rows]
    ix = "int32_t" if _fits_i32(exprs) else "int64_t"
    params = []
    for b, i in slot.items():
        const = "" if i == 0 else "const "
        params.append(f"device {const}{storage_ctype(dtypes[b])} *b{i} [[buffer({i})]]")
    if threads is None:
        threads = SOFTMAX_THREADS if schedule == "softmax_row" else choose_threads(k, schedule)
    if schedule == "scatter" and k.dtype.packed:
        threads = 1  # neighbouring 4-bit elements share a byte: one thread writes them all
    em = MetalEmitter(lambda b: f"b{slot[b]}", ix, threads, schedule in ("row", "element"))
    if schedule == "softmax_row":
        em.block_reduce = False  # the score's own reductions run in the thread of its key
    ind = "  "
    body: list[str] = []

    def store(val: str, ind: str) -> str:
        return ind + store_stmt("b0", cexpr(_flat_store_index(shape)), val, k.dtype)

    grid: sint
    if schedule == "thread":
        per = 2 if k.dtype.packed else 1
        grid = sym.ceildiv(numel, threads * per)
        body.append(f"  const {ix} t0 = ({ix})lm_tg.x * {threads} + ({ix})lm_tid.x;")
        body.append(
            f"  for ({ix} t = t0 * {per}; t < t0 * {per} + {per} && t < {cexpr(numel)}; ++t) {{"
        )
        body += _unflatten_lines("t", shape, 0, ix, "    ", "")
        em.lines = []
        em.block(lambda: em.lines.append(store(em.emit(k.value, "    "), "    ")))
        body += em.lines + ["  }"]
    elif schedule == "row":
        grid = _numel(shape[:-1])
        body.append(f"  const {ix} t = ({ix})lm_tg.x;")
        body += _unflatten_lines("t", shape[:-1], 0, ix, ind, "")
        em.lines = []
        em.hoist(k.value, frozenset({f"_i{n - 1}"}), ind)
        last = f"i{n - 1}"
        em.lines.append(f"  for ({ix} {last} = ({ix})lm_tid.x; {last} < {cexpr(shape[-1])}; "
                        f"{last} += {threads}) {{")  # fmt: skip
        em.block(lambda: em.lines.append(store(em.emit(k.value, "    "), "    ")))
        body += em.lines + ["  }"]
    elif schedule == "element":
        grid = numel
        body.append(f"  const {ix} t = ({ix})lm_tg.x;")
        body += _unflatten_lines("t", shape, 0, ix, ind, "")
        em.lines = []
        val = em.emit(k.value, ind)
        body += em.lines
        body.append(f"  if (lm_tid.x == 0) {store(val, '')}")
    elif schedule == "softmax_row":
        grid = _numel(shape[:-1])
        body.append(f"  const {ix} t = ({ix})lm_tg.x;")
        body += _unflatten_lines("t", shape[:-1], 0, ix, ind, "")
        body += _softmax_row(em, k, ix, threads)
    elif schedule == "scatter":
        assert k.scatter_row is not None
        rows_shape, inner_shape = shape[: k.row_dims], shape[k.row_dims :]
        inner_n, rows_n = _numel(inner_shape), _numel(rows_shape)
        grid = 1 if threads == 1 else sym.ceildiv(inner_n, threads)
        row_size = cexpr(inner_n)
        inner_flat = cexpr(_flat_store_index(inner_shape, k.row_dims))
        body.append(f"  for ({ix} u = ({ix})lm_tg.x * {threads} + ({ix})lm_tid.x; "
                    f"u < {row_size}; u += ({ix})lm_ntg.x * {threads}) {{")  # fmt: skip
        body += _unflatten_lines("u", inner_shape, k.row_dims, ix, "    ", "u")
        body.append(f"    for ({ix} r = 0; r < {cexpr(rows_n)}; ++r) {{")
        body += _unflatten_lines("r", rows_shape, 0, ix, "      ", "r")

        def sbody() -> None:
            val = em.emit(k.value, "      ")
            assert k.scatter_row is not None
            row = em.emit(k.scatter_row, "      ")
            em.lines.append(f"      {{ const int64_t row = (int64_t)({row});")
            em.lines.append(f"        if (row >= 0 && row < {cexpr(k.scatter_rows)}) "
                            + store_stmt("b0", f"row * {row_size} + {inner_flat}", val, k.dtype)
                            + " }")  # fmt: skip

        em.lines = []
        em.block(sbody)
        body += em.lines + ["    }", "  }"]
    else:
        raise ValueError(f"unknown Metal schedule {schedule!r}")
    lines = [frame(k.name, params, len(args)), *em.shared, *dim_lines(dim_names, ix), *body, "}"]
    return MetalKernel(
        k.name, PRELUDE + "\n".join(lines) + "\n", args, (grid, 1, 1), (threads, 1, 1), schedule
    )


SOFTMAX_THREADS = 64  # threads of a softmax row: one key each per tile, columns strided
_SOFTMAX_COLS = 512  # the longest row (head dim) the softmax-row schedule keeps in registers


def softmax_rows(k: K.Kernel) -> bool:
    """A row of softmax-weighted sums (attention: out[..., i, v]) whose score does not depend
    on the row's last index: one threadgroup per row computes each key's score once, instead
    of once per output column."""
    v, n = k.value, len(k.shape)
    if k.scatter_row is not None or not isinstance(v, K.SoftmaxSum) or n == 0:
        return False
    return (
        0 < sym.upper_bound(k.shape[-1]) <= _SOFTMAX_COLS
        and f"_i{n - 1}" not in K.free_vars(v.score, {})
        and v.dtype is dt.f32
    )


def _softmax_row(em: MetalEmitter, k: K.Kernel, ix: str, threads: int) -> list[str]:
    """An online softmax over tiles of ``threads`` keys: each thread scores one key of the
    tile; the tile's max and sum are threadgroup reductions; the running sums are rescaled
    when the max grows; each thread accumulates its columns (strided by ``threads``) of the
    probability-weighted values, reading the tile's probabilities from threadgroup memory."""
    v = k.value
    assert isinstance(v, K.SoftmaxSum)
    n = len(k.shape)
    last, jv, ext = f"i{n - 1}", _c_name(v.var), cexpr(v.extent)
    cols = -(-sym.upper_bound(k.shape[-1]) // threads)
    width = cexpr(k.shape[-1])
    groups = max(1, threads // SIMD)
    em.shared += [f"  threadgroup float lm_ps[{threads}];",
                  f"  threadgroup float lm_pm[{groups}];", f"  threadgroup float lm_pl[{groups}];"]  # fmt: skip
    out = ["  float lm_m = -INFINITY, lm_l = 0.0f;",
           f"  float lm_acc[{cols}] = {{{', '.join(['0.0f'] * cols)}}};",
           f"  for ({ix} lm_j0 = 0; lm_j0 < {ext}; lm_j0 += {threads}) {{",
           "    float lm_s = -INFINITY;",
           f"    {{ const {ix} {jv} = lm_j0 + ({ix})lm_tid.x;",
           f"    if ({jv} < {ext}) {{"]  # fmt: skip

    def emit(value: K.Value, indent: str, fmt: str) -> None:
        em.lines = []
        em.block(lambda: em.lines.append(indent + fmt.format(em.emit(value, indent))))
        out.extend(em.lines)

    emit(v.score, "      ", "lm_s = {};")
    bar = "threadgroup_barrier(mem_flags::mem_threadgroup);"
    out += ["    } }",
            # the tile's max and sum, every thread holding both; NaN scores give NaN sums
            "    float lm_mt = simd_max(lm_s);",
            "    if (lm_lane == 0) lm_pm[lm_sg] = lm_mt;",
            f"    {bar}",
            f"    for (int j = 0; j < {groups}; ++j) lm_mt = lm_maxf(lm_mt, lm_pm[j]);",
            "    const float lm_mn = lm_maxf(lm_m, lm_mt);",
            "    const float lm_r = lm_mn == -INFINITY ? 1.0f : exp2(lm_m - lm_mn);",
            "    const float lm_p = lm_s == -INFINITY ? 0.0f : exp2(lm_s - lm_mn);",
            "    lm_ps[lm_tid.x] = lm_p;",
            "    float lm_lt = simd_sum(lm_p);",
            "    if (lm_lane == 0) lm_pl[lm_sg] = lm_lt;",
            f"    {bar}",
            "    lm_lt = 0.0f;",
            f"    for (int j = 0; j < {groups}; ++j) lm_lt += lm_pl[j];",
            "    lm_l = lm_l * lm_r + lm_lt;",
            "    lm_m = lm_mn;",
            f"    for (int c = 0; c < {cols}; ++c) lm_acc[c] *= lm_r;",
            f"    const {ix} lm_nj = min(({ix}){threads}, ({ix})({ext}) - lm_j0);",
            "    for (int lm_q = 0; lm_q < (int)lm_nj; ++lm_q) {",
            "      const float lm_pj = lm_ps[lm_q];",
            f"      const {ix} {jv} = lm_j0 + lm_q;"]  # fmt: skip
    for c in range(cols):
        out.append(f"      {{ const {ix} {last} = {c * threads} + ({ix})lm_tid.x;")
        out.append(f"      if ({last} < {width}) {{")
        emit(v.weight, "        ", f"lm_acc[{c}] += lm_pj * {{}};")
        out.append("      } }")
    out += ["    }", f"    {bar}  // lm_ps and the partials are rewritten by the next tile", "  }"]
    flat = cexpr(_flat_store_index(k.shape))
    for c in range(cols):
        out.append(f"  {{ const {ix} {last} = {c * threads} + ({ix})lm_tid.x;")
        out.append(
            f"  if ({last} < {width}) {store_stmt('b0', flat, f'lm_acc[{c}] / lm_l', k.dtype)} }}"
        )
    return out
