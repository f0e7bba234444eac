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
threadgroups, as CUDA's count blocks. The thread mappings (thread, row, element, scatter)
are the shared GPU core's (``codegen/gpu/kernel.py``) in Metal's names; Metal adds
``softmax_row`` (below). The threadgroup size of each is the one the Metal cost model ranks
first (``schedule.py``). Metal has no 64-bit floats: an f64 kernel is refused with its name.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...compiler import kernel_ir as K
from ...compiler.kfold import folded
from ...graph import dtypes as dt
from ...graph import symbolic as sym
from ...graph.ops import Op
from ..cstyle import _c_name, cexpr, store_stmt
from ..gpu.kernel import (
    SUBGROUP,
    Dialect,
    GpuEmitter,
    Rendered,
    assemble,
    choose_schedule,
    flat_store_index,
    index_type,
    kernel_buffers,
    numel,
    render,
    unflatten_lines,
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
# types Metal's simd_* functions take (no 64-bit types)
_SIMD_TYPES = ("float", "int32_t", "uint32_t", "int16_t", "uint16_t", "int8_t", "uint8_t")


class MetalDialect(Dialect):
    name = "Metal"
    group, local, groups = "lm_tg", "lm_tid", "lm_ntg"
    lane, subgroup = "lm_lane", "lm_sg"
    barrier = "threadgroup_barrier(mem_flags::mem_threadgroup)"
    shared = "threadgroup"
    global_ = "device "

    def param(self, slot: int, ctype: str, restrict: bool) -> str:
        return f"device {'' if slot == 0 else 'const '}{ctype} *b{slot} [[buffer({slot})]]"

    def frame(self, name: str, params: Sequence[str], n_dims: int, threads: int) -> str:
        """Buffer parameters, the dims buffer, the thread positions."""
        allp = [*params, f"constant int64_t *lm_dims [[buffer({len(params)})]]", *POSITIONS]
        return f"kernel void {name}({', '.join(allp)}) {{"

    def dim(self, i: int) -> str:
        return f"lm_dims[{i}]"

    def subgroup_reduce(self, acc: str, op: Op, t: str, d: dt.DType) -> str | None:
        if t not in _SIMD_TYPES:
            return None
        if op is Op.SUM_REDUCE:
            return f"{acc} = simd_sum({acc});"
        if t == "float":  # simd_max may drop NaN: the max propagates it
            return (f"{{ const bool lm_nan = simd_any({acc} != {acc}); {acc} = simd_max({acc});"
                    f" if (lm_nan) {acc} = NAN; }}")  # fmt: skip
        return f"{acc} = simd_max({acc});"


METAL = MetalDialect()
MetalKernel = Rendered


def unsupported(k: K.Kernel) -> str | None:
    """None when Metal can run ``k``, else why not."""
    trees = [k.value] + ([k.scatter_row] if k.scatter_row is not None else [])
    if k.dtype is dt.f64 or any(v.dtype is dt.f64 for t in trees for v in K.walk(t)):
        return "Metal has no 64-bit floats (f64)"
    return None


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
    if threads is None:
        threads = SOFTMAX_THREADS if schedule == "softmax_row" else choose_threads(k, schedule)
    if schedule == "scatter" and k.dtype.packed:
        threads = 1  # neighbouring 4-bit elements share a byte: one thread writes them all
    if schedule != "softmax_row":
        return render(METAL, k, dim_names, PRELUDE, schedule, threads)
    args, dtypes = kernel_buffers(k)
    slot = {b: i for i, b in enumerate(args)}
    # the score's own reductions run in the thread of its key
    em = GpuEmitter(lambda b: f"b{slot[b]}", METAL, index_type(k), threads, False)
    ix = em.index_type
    body = [f"  const {ix} t = ({ix})lm_tg.x;"]
    body += unflatten_lines("t", k.shape[:-1], 0, ix, "  ", "")
    body += _softmax_row(em, k, ix, threads)
    source = assemble(METAL, k, PRELUDE, args, dtypes, em, body, dim_names)
    return Rendered(k.name, source, args, (numel(k.shape[:-1]), 1, 1), (threads, 1, 1), schedule)


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


def _softmax_row(em: GpuEmitter, k: K.Kernel, ix: str, threads: int) -> list[str]:
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
    groups = max(1, threads // SUBGROUP)
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
    flat = cexpr(flat_store_index(k.shape))
    for c in range(cols):
        out.append(f"  {{ const {ix} {last} = {c * threads} + ({ix})lm_tid.x;")
        out.append(
            f"  if ({last} < {width}) {store_stmt('b0', flat, f'lm_acc[{c}] / lm_l', k.dtype)} }}"
        )
    return out
