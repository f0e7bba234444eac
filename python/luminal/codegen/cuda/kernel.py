"""Render kernel IR as CUDA C (compiled by NVRTC; see codegen/nvrtc.py).

The value trees render through the C renderer's emitter and the same ``lm_*`` helpers (the
CUDA prelude defines them as device functions), so C and CUDA differ only in the kernel
frame and in how reductions are spread over threads. Every kernel has the ABI::

    extern "C" __global__ void NAME(T0 *b0, const T1 *b1, ..., int64_t dim0, int64_t dim1, ...)

buffers first (output first, then what it reads), then every plan dim by value in plan order.
Low-precision floats are stored as they are and computed in f32. Schedules (one per kernel):

- ``thread``: one thread per output element (two for 4-bit outputs, which share bytes);
  reductions inside run serially in that thread.
- ``row``: one block per row of the output (all dims but the last); reductions that do not
  depend on the last index (a row max, a row sum) run once, spread over the block's threads
  with warp shuffles, then the threads stride over the row (softmax, layer norm).
- ``element``: one block per output element; its reduction is spread over the block
  (few outputs, long reductions).
- ``scatter``: threads over a row's elements, source rows in order (duplicate rows: the last
  one wins, as in the reference interpreter).
Index arithmetic is 32-bit when every index expression of the kernel provably fits.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ... import flags
from ...compiler import kernel_ir as K
from ...compiler.kfold import folded
from ...graph import dtypes as dt
from ...graph import symbolic as sym
from ...graph.symbolic import sint
from ...graph.view import contiguous_strides
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
from ..prelude import SHARED_HELPERS
from . import nvrtc
from .gemm import GemmKernel, render_gemm

PRELUDE = (
    r"""
#ifndef LM_PRELUDE
#define LM_PRELUDE
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
#define INFINITY __int_as_float(0x7f800000)
#define NAN __int_as_float(0x7fffffff)
#define INT8_MIN (-128)
#define INT32_MIN (-2147483647 - 1)
#define INT64_MIN (-9223372036854775807LL - 1)
#define LM_FN static __device__ __forceinline__
LM_FN float lm_bits_f32(uint32_t u) { return __uint_as_float(u); }
LM_FN uint32_t lm_f32_bits(float f) { return __float_as_uint(f); }
LM_FN float lm_f16_to_f32(uint16_t h) {
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
}
LM_FN uint16_t lm_f32_to_f16(float f) {
  uint16_t h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}
"""
    + SHARED_HELPERS
    + r"""
LM_FN float lm_shfl(float v, int o) { return __shfl_xor_sync(0xffffffffu, v, o); }
LM_FN double lm_shfl(double v, int o) { return __shfl_xor_sync(0xffffffffu, v, o); }
LM_FN int64_t lm_shfl(int64_t v, int o) { return __shfl_xor_sync(0xffffffffu, v, o); }
template <typename T> LM_FN T lm_shfl(T v, int o) {
  return (T)__shfl_xor_sync(0xffffffffu, (int)v, o);
}
#endif
"""
)

BLOCK = 256  # threads per block of the thread and scatter schedules
REDUCE_BLOCK = 256  # threads per block that share one reduction
_I32 = 2**31


@dataclass
class CudaKernel:
    name: str
    source: str
    args: list[int]  # buffer ids: output first, then the buffers it reads
    grid: tuple[sint, sint, sint]
    block: tuple[int, int, int]
    schedule: str


def kernel_buffers(k: K.Kernel) -> tuple[list[int], dict[int, dt.DType]]:
    """The kernel's buffer ids (output first, then each buffer it reads once) and dtypes."""
    trees = [k.value] + ([k.scatter_row] if k.scatter_row is not None else [])
    dtypes: dict[int, dt.DType] = {}
    for t in trees:
        for v in K.walk(t):
            if isinstance(v, K.Load):
                dtypes[v.buf] = v.dtype
    args = [k.out] + sorted(b for b in dtypes if b != k.out)
    dtypes[k.out] = k.dtype
    return args, dtypes


# ------------------------------------------------------------------------------ analysis


def _exprs(v: K.Value) -> list[sint]:
    out: list[sint] = []
    for x in K.walk(v):
        if isinstance(x, K.Load):
            out += [x.index, x.valid]
        elif isinstance(x, K.IndexVal):
            out.append(x.expr)
        elif isinstance(x, K.Masked):
            out.append(x.valid)
        elif isinstance(x, (K.Reduce, K.SoftmaxSum)):
            out.append(x.extent)
        elif isinstance(x, K.Gather):
            out.append(x.rows)
    return out


def _fits_i32(exprs: Sequence[sint]) -> bool:
    """Every subexpression provably in [-2^31, 2^31)."""
    seen: set[int] = set()
    stack = list(exprs)
    while stack:
        e = stack.pop()
        if isinstance(e, int):
            if not -_I32 <= e < _I32:
                return False
            continue
        if not isinstance(e, sym.Expr) or id(e) in seen:
            continue
        seen.add(id(e))
        if e.lo < -_I32 or e.hi >= _I32:
            return False
        if e.kind == "var":
            continue
        for a in e.args:
            if isinstance(a, tuple):  # ADD: ((term, coef), ...)
                for t in a:
                    stack.extend(t if isinstance(t, tuple) else (t,))
            else:
                stack.append(a)
    return True


def _numel(shape: Sequence[sint]) -> sint:
    n: sint = 1
    for s in shape:
        n = sym.mul(n, s)
    return n


def _has_reduce(v: K.Value) -> bool:
    return any(isinstance(x, K.Reduce) for x in K.walk(v))


def _row_reduces(k: K.Kernel) -> bool:
    """Some reduction is the same for a whole output row (it can be shared by a block)."""
    if not k.shape:
        return False
    last = frozenset({f"_i{len(k.shape) - 1}"})
    parts = K.invariant_parts(k.value, last, {})
    return any(_has_reduce(p) for p in parts)


def choose_schedule(k: K.Kernel) -> str:
    if k.scatter_row is not None:
        return "scatter"
    if k.dtype.packed or not _has_reduce(k.value):
        return "thread"
    n = len(k.shape)
    if n >= 1 and sym.upper_bound(k.shape[-1]) >= 32 and _row_reduces(k):
        return "row"
    reduces = [x for x in K.walk(k.value) if isinstance(x, K.Reduce)]
    if max(sym.upper_bound(r.extent) for r in reduces) < 64:
        return "thread"
    if sym.upper_bound(_numel(k.shape)) <= 65536:
        return "element"  # too few outputs to fill the GPU with one thread each
    # many outputs: a block per output when its reduction reads memory contiguously and
    # neighbouring outputs do not (a matrix-vector product); else a thread per output
    loads = [x for x in K.walk(k.value) if isinstance(x, K.Load)]
    along_r = any(_unit_stride(ld.index, r.var) for ld in loads for r in reduces)
    last = sym.index_var(n - 1, k.shape[-1]) if n else 0
    along_out = isinstance(last, sym.Expr) and any(_unit_stride(ld.index, last) for ld in loads)
    return "element" if along_r and not along_out else "thread"


def _unit_stride(index: sint, v: sym.Expr) -> bool:
    """``index`` advances by exactly 1 when ``v`` does."""
    if not isinstance(index, sym.Expr) or v not in index.vars():
        return False
    return sym.add(sym.substitute(index, {v.name: sym.add(v, 1)}), sym.mul(index, -1)) == 1


# ------------------------------------------------------------------------------ rendering


class _CudaEmitter(Emitter):
    """The C emitter; reductions met outside any loop or branch are shared by the block."""

    simd_reductions = False
    fast_exp2 = False  # exp2f is a hardware instruction on the GPU

    def __init__(self, ptr_of: Callable[[int], str], index_type: str, block_reduce: bool) -> None:
        super().__init__(ptr_of)
        self.index_type = index_type
        self.block_reduce = block_reduce

    def _emit(self, v: K.Value, ind: str) -> str:
        if isinstance(v, K.Reduce) and self.block_reduce and len(self.scopes) == 1:
            return self._block_reduce(v, ind)
        return super()._emit(v, ind)

    def _block_reduce(self, v: K.Reduce, ind: str) -> str:
        t, init = ctype(v.dtype), reduce_init(v.op, v.dtype)
        hoist = getattr(self, "hoist", None)
        if hoist is not None:
            hoist(v.body, frozenset({v.var.name}), ind)
        acc, sh = self.tmp(), self.tmp()
        rv, ix = _c_name(v.var), self.index_type
        L = self.lines.append
        L(f"{ind}{t} {acc} = {init};")
        L(
            f"{ind}for ({ix} {rv} = threadIdx.x; {rv} < {cexpr(v.extent)}; "
            f"{rv} += {REDUCE_BLOCK}) {{"
        )

        def body() -> None:
            x = self.emit(v.body, ind + "  ")
            L(f"{ind}  {acc} = {reduce_update(v.op, v.dtype, acc, x)};")

        self.block(body)
        L(f"{ind}}}")
        # the shuffle must run once on every lane: never inside the update's conditional
        shuffle = (f"{ind}for (int o = 16; o > 0; o >>= 1) {{ const {t} y = lm_shfl({acc}, o); "
                   f"{acc} = {reduce_update(v.op, v.dtype, acc, 'y')}; }}")  # fmt: skip
        L(shuffle)
        if REDUCE_BLOCK > 32:
            # one partial per warp through shared memory; every warp then folds them all, so
            # every thread holds the result and no second barrier is needed
            L(f"{ind}__shared__ {t} {sh}[32];")
            L(f"{ind}if ((threadIdx.x & 31) == 0) {sh}[threadIdx.x >> 5] = {acc};")
            L(f"{ind}__syncthreads();")
            lane = "threadIdx.x & 31"
            L(f"{ind}{acc} = ({lane}) < {REDUCE_BLOCK // 32} ? {sh}[{lane}] : {init};")
            L(shuffle)
        return acc


def _unflatten_lines(
    flat: str, shape: Sequence[sint], first: int, ix: str, ind: str, tag: str
) -> list[str]:
    """Declare index vars i{first}.. of ``shape`` from the flat index ``flat``."""
    lines: list[str] = []
    n = len(shape)
    if n == 0:
        return lines
    rem = flat
    for j in range(n - 1, -1, -1):
        v = f"i{first + j}"
        if j == 0:
            lines.append(f"{ind}const {ix} {v} = {rem}; (void){v};")
        else:
            e = cexpr(shape[j])
            lines.append(f"{ind}const {ix} {v} = {rem} % {e}; (void){v};")
            lines.append(f"{ind}const {ix} q{tag}{first + j} = {rem} / {e};")
            rem = f"q{tag}{first + j}"
    return lines


def _flat_store_index(shape: Sequence[sint], first: int = 0) -> sint:
    flat: sint = 0
    for j, (s, st) in enumerate(zip(shape, contiguous_strides(shape), strict=True)):
        flat = sym.add(flat, sym.mul(sym.index_var(first + j, s), st))
    return flat


def render_kernel(k: K.Kernel, dim_names: Sequence[str], schedule: str | None = None) -> CudaKernel:
    """CUDA C for one kernel, with its launch geometry (expressions over plan dims)."""
    k = folded(k)
    schedule = schedule or choose_schedule(k)
    args, dtypes = kernel_buffers(k)
    slot = {b: i for i, b in enumerate(args)}
    shape, n = k.shape, len(k.shape)
    numel = _numel(shape)
    exprs: list[sint] = [*shape, numel, _flat_store_index(shape), *_exprs(k.value)]
    if k.scatter_row is not None:
        exprs += _exprs(k.scatter_row) + [k.scatter_rows]
    ix = "int32_t" if _fits_i32(exprs) else "int64_t"
    reads_out = any(isinstance(v, K.Load) and v.buf == k.out for v in K.walk(k.value))
    params = []
    for b, i in slot.items():
        const = "" if i == 0 else "const "
        restrict = "" if reads_out and b == k.out else " __restrict__"
        params.append(f"{const}{storage_ctype(dtypes[b])} *{restrict} b{i}")
    params += [f"const int64_t lm_dim{i}" for i in range(len(dim_names))]
    threads = REDUCE_BLOCK if schedule in ("row", "element") else BLOCK
    if schedule == "scatter" and k.dtype.packed:
        threads = 1  # neighbouring 4-bit elements share a byte: one thread writes them all
    head = f'extern "C" __global__ void __launch_bounds__({threads}) {k.name}'
    lines = [f"{head}({', '.join(params)}) {{"]
    for i, name in enumerate(dim_names):
        lines.append(f"  const {ix} d_{name} = ({ix})lm_dim{i}; (void)d_{name};")
    em = _CudaEmitter(lambda b: f"b{slot[b]}", ix, block_reduce=schedule in ("row", "element"))
    ind = "  "

    def store(val: str, ind: str) -> str:
        return ind + store_stmt("b0", cexpr(_flat_store_index(shape)), val, k.dtype)

    grid: sint
    if schedule == "thread":
        per = 2 if k.dtype.packed else 1
        grid = sym.ceildiv(numel, BLOCK * per)
        lines.append(f"  const {ix} t0 = ({ix})blockIdx.x * {BLOCK} + ({ix})threadIdx.x;")
        lines.append(
            f"  for ({ix} t = t0 * {per}; t < t0 * {per} + {per} && t < {cexpr(numel)}; ++t) {{"
        )
        lines += _unflatten_lines("t", shape, 0, ix, "    ", "")
        em.lines = []
        em.block(lambda: em.lines.append(store(em.emit(k.value, "    "), "    ")))
        lines += em.lines + ["  }"]
    elif schedule == "row":
        grid = _numel(shape[:-1])
        lines.append(f"  const {ix} t = ({ix})blockIdx.x;")
        lines += _unflatten_lines("t", shape[:-1], 0, ix, ind, "")
        em.lines = []
        em.hoist(k.value, frozenset({f"_i{n - 1}"}), ind)
        last = f"i{n - 1}"
        em.lines.append(
            f"  for ({ix} {last} = threadIdx.x; {last} < {cexpr(shape[-1])}; "
            f"{last} += {threads}) {{"
        )
        em.block(lambda: em.lines.append(store(em.emit(k.value, "    "), "    ")))
        lines += em.lines + ["  }"]
    elif schedule == "element":
        grid = numel
        lines.append(f"  const {ix} t = ({ix})blockIdx.x;")
        lines += _unflatten_lines("t", shape, 0, ix, ind, "")
        em.lines = []
        val = em.emit(k.value, ind)
        lines += em.lines
        lines.append(f"  if (threadIdx.x == 0) {store(val, '')}")
    elif schedule == "scatter":
        assert k.scatter_row is not None
        rows_shape, inner_shape = shape[: k.row_dims], shape[k.row_dims :]
        inner_n, rows_n = _numel(inner_shape), _numel(rows_shape)
        grid = 1 if threads == 1 else sym.ceildiv(inner_n, threads)
        row_size = cexpr(inner_n)
        inner_flat = cexpr(_flat_store_index(inner_shape, k.row_dims))
        lines.append(f"  for ({ix} u = ({ix})blockIdx.x * {threads} + ({ix})threadIdx.x; "
                     f"u < {row_size}; u += ({ix})gridDim.x * {threads}) {{")  # fmt: skip
        lines += _unflatten_lines("u", inner_shape, k.row_dims, ix, "    ", "u")
        lines.append(f"    for ({ix} r = 0; r < {cexpr(rows_n)}; ++r) {{")
        lines += _unflatten_lines("r", rows_shape, 0, ix, "      ", "r")

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
        lines += em.lines + ["    }", "  }"]
    else:
        raise ValueError(f"unknown CUDA schedule {schedule!r}")
    lines.append("}")
    return CudaKernel(
        k.name, PRELUDE + "\n".join(lines) + "\n", args, (grid, 1, 1), (threads, 1, 1), schedule
    )


# ------------------------------------------------------------------------------ compiling


def render_step(
    step: K.Kernel | K.LibCall, dim_names: Sequence[str], dtypes: Mapping[int, dt.DType]
) -> CudaKernel | GemmKernel:
    """A kernel, or a library call this backend generates a kernel for (``gemm``)."""
    if isinstance(step, K.LibCall):
        return render_gemm(step, dtypes, dim_names, PRELUDE)
    return render_kernel(step, dim_names)


def compile_kernels(
    kernels: Sequence[K.Kernel | K.LibCall],
    dim_names: Sequence[str],
    arch: str = nvrtc.DEFAULT_ARCH,
    dtypes: Mapping[int, dt.DType] | None = None,
) -> list[tuple[CudaKernel | GemmKernel, bytes]]:
    """Render every step and compile each to a cubin for ``arch`` (in parallel, cached).
    Library calls need ``dtypes`` (buffer id -> dtype): their kernel depends on them."""
    rendered = [render_step(k, dim_names, dtypes or {}) for k in kernels]
    if flags.debug() >= 4:
        for c in rendered:
            print(f"// {c.name}: {c.schedule} schedule, grid {c.grid}, block {c.block}\n"
                  + c.source.split("#endif\n", 1)[-1], file=sys.stderr)  # fmt: skip
    cubins = nvrtc.compile_many([(c.name, c.source) for c in rendered], arch)
    return list(zip(rendered, cubins, strict=True))
