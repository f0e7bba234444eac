"""Render kernel IR as CUDA C (compiled by NVRTC; see codegen/cuda/nvrtc.py).

The value trees render through the C renderer's emitter and the same ``lm_*`` helpers (the
CUDA prelude defines them as device functions); the thread mappings (thread, row, element,
scatter) are the shared GPU core's (``codegen/gpu/kernel.py``), written here in CUDA's names:
blocks, ``__syncthreads``, ``__shared__`` and warp shuffles. Every kernel has the ABI::

    extern "C" __global__ void NAME(T0 *b0, const T1 *b1, ..., int64_t dim0, int64_t dim1, ...)

buffers first (output first, then what it reads), then every plan dim by value in plan order.
Low-precision floats are stored as they are and computed in f32.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence

from ... import flags
from ...compiler import kernel_ir as K
from ...compiler.kfold import folded
from ...graph import dtypes as dt
from ..gpu.kernel import Rendered, choose_schedule, kernel_buffers, render
from ..prelude import SHARED_HELPERS
from . import nvrtc
from .dialect import CUDA
from .gemm import GemmKernel, render_gemm

__all__ = ["CUDA", "PRELUDE", "CudaKernel", "choose_schedule", "compile_kernels",
           "kernel_buffers", "render_kernel", "render_step"]  # fmt: skip

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


CudaKernel = Rendered


def render_kernel(k: K.Kernel, dim_names: Sequence[str], schedule: str | None = None) -> CudaKernel:
    """CUDA C for one kernel, with its launch geometry (expressions over plan dims)."""
    k = folded(k)
    schedule = schedule or choose_schedule(k)
    threads = REDUCE_BLOCK if schedule in ("row", "element") else BLOCK
    if schedule == "scatter" and k.dtype.packed:
        threads = 1  # neighbouring 4-bit elements share a byte: one thread writes them all
    return render(CUDA, k, dim_names, PRELUDE, schedule, threads)


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
