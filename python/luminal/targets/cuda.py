"""The CUDA target: kernels rendered by ``codegen/cuda/`` and compiled to cubins by NVRTC;
gemm calls run as the generated tensor-core kernel or through cuBLASLt, whichever measures
faster on the device.

Without a device the search still has to rank a generated kernel against a gemm call: it
uses the shared cost model with this target's constants (H100-class round numbers; the ratio
is what matters) as its measurement, under a cache id of its own so such decisions never mix
with measured ones. Measured candidates are not checked against the reference here (the
device runner keeps no outputs).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from .. import cuda as device
from .. import flags
from ..compiler import kernel_ir as K
from ..compiler.lower import BufferInfo, Lowered
from ..compiler.search.cost import estimate
from ..compiler.search.select import representative_dims, subprogram
from ..compiler.search.tuner import Candidate, Tuner, random_inputs
from ..compiler.target import CostModel, ScheduleSpace
from ..plan import KernelFormat, Plan
from .base import Launchable, assemble_plan

# generated reductions run on CUDA cores, the gemm kernel on tensor cores (three passes for
# f32): 1.5e14 / 2e12 is the library speed-up per flop
COST = CostModel(bandwidth=3.0e12, ops=2.0e12, library_speedup=75.0, launch=4e-6,
                 cache_bytes=50 << 20, cache_bandwidth=10e12)  # fmt: skip
# CUDA kernels pick their thread mapping in the renderer; the search measures no schedules
SPACE = ScheduleSpace(splits=(), chunks=(), orders=(0,))
GEMM_IMPLS = ("kernel", "cublaslt")


@dataclass
class CudaTarget:
    name: str = "cuda"
    cost: CostModel = COST
    space: ScheduleSpace = SPACE
    searches_schedules: bool = False
    gemm_impl: str | None = None  # force "kernel" or "cublaslt" for every gemm call
    repeats: int = 7
    evaluate: None = None

    def __post_init__(self) -> None:
        if self.gemm_impl not in (None, *GEMM_IMPLS):
            raise ValueError(f"gemm_impl must be 'kernel' or 'cublaslt', not {self.gemm_impl!r}")

    def cache_id(self) -> str:
        from ..plan_cache import render_id

        if device.available():
            d = device.device()
            return f"cuda-{d.name}-{d.arch}-{render_id()}"
        return f"cuda-estimate-v2-{render_id()}"

    def library_variants(
        self, call: K.LibCall, operands: Sequence[BufferInfo]
    ) -> list[tuple[str, K.LibCall]]:
        return []  # cuBLASLt vs the generated gemm is chosen at plan build (_choose_gemm)

    def signature(self, k: K.Kernel, dim_names: list[str]) -> Hashable:
        from ..codegen import cuda

        c = cuda.render_kernel(k, dim_names)
        return c.source, repr(c.grid), repr(c.block)

    def measure(self, low: Lowered, dims: dict[str, int]) -> float:
        if not device.available():
            return estimate(low, dims, self.cost)
        return self._time(self._plan(low, "measure", None), low, dims)

    def build_plan(self, low: Lowered, name: str) -> Plan:
        return self._plan(low, name, self.gemm_impl)

    def _plan(self, low: Lowered, name: str, gemm_impl: str | None) -> Plan:
        from ..codegen import cuda

        arch = target_arch()
        # library calls become generated kernels unless cuBLASLt measured faster
        keep = self._library_steps(low, gemm_impl)
        libcalls = {i: low.kernels[i] for i in keep}
        gen = [k for i, k in enumerate(low.kernels) if i not in libcalls]
        dtypes = {b.id: b.dtype for b in low.buffers}
        compiled = cuda.compile_kernels(gen, sorted(low.dims), arch, dtypes)
        launches = [Launchable(c.name, KernelFormat.cubin, cubin, c.args, c.grid, c.block)
                    for c, cubin in compiled]  # fmt: skip
        return assemble_plan(low, name, "cuda", arch, launches, libcalls)  # type: ignore[arg-type]

    def _time(self, plan: Plan, low: Lowered, dims: dict[str, int]) -> float:
        """Median seconds of one run of ``plan`` on the device (inputs staged both ways)."""
        from .. import runtime

        _pass_cublaslt_path()
        ex = runtime.Executor(plan, "cuda")
        inputs = random_inputs(low, dims, ex.inputs, flags.SEARCH_SEED.as_int())
        ex.run(inputs, dims)  # warm-up: loads modules, binds, captures the CUDA graph
        times = []
        for _ in range(self.repeats):
            t = time.perf_counter()
            ex.run(inputs, dims)
            times.append(time.perf_counter() - t)
        return float(np.median(times))

    def _library_steps(self, low: Lowered, gemm_impl: str | None) -> list[int]:
        """Indices of the library-call steps kept as LibCall steps (run by cuBLASLt in the
        runtime); every other one becomes a generated kernel."""
        from ..codegen.cuda import gemm as cuda_gemm

        dtypes = {b.id: b.dtype for b in low.buffers}
        keep = []
        for i, step in enumerate(low.kernels):
            if not isinstance(step, K.LibCall):
                continue
            if cuda_gemm.supports(step, dtypes) is not None:
                keep.append(i)  # only the library can run it
            elif (gemm_impl or self._choose_gemm(low, i)) == "cublaslt":
                keep.append(i)
        return keep

    def _choose_gemm(self, low: Lowered, i: int) -> str:
        """The faster of the generated gemm kernel and cuBLASLt for gemm step ``i``, measured
        on the device through the search's tuner (one decision cache for all targets);
        "kernel" when there is no device to measure on."""
        if not device.available():
            return "kernel"
        sub = subprogram(low, [low.kernels[i]])
        dims = {n: v for n, v in representative_dims(low).items() if n in sub.dims}

        def measure(s: Lowered, d: dict[str, int]) -> float:
            impl = "cublaslt" if s is lt else "kernel"
            return self._time(self._plan(sub, "measure", impl), sub, d)

        lt = Lowered(sub.buffers, list(sub.kernels), sub.dims, sub.weights)
        tuner = Tuner(measure, self.cache_id(), None, cost=self.cost, space=self.space)
        cands = [Candidate("kernel", sub, 0.0, "kernel"),
                 Candidate("cublaslt", lt, 0.0, "cublaslt")]  # fmt: skip
        try:
            chosen = tuner.choose(low.kernels[i].name, "gemm-impl", dims, sub, cands)
        except Exception as e:  # e.g. no libcublasLt: the generated kernel stays
            if flags.debug() >= 3:
                name = low.kernels[i].name
                print(f"luminal search: {name}: cuBLASLt failed: {e}", file=sys.stderr)
            return "kernel"
        return str(chosen.payload)


def target_arch() -> str:
    """The arch plans are built for: ``$LUMINAL_CUDA_ARCH``, else the visible GPU's, else
    ``sm_90a`` (Hopper, with its arch-specific instructions)."""
    from ..codegen.cuda import nvrtc

    arch = flags.CUDA_ARCH.get()
    if arch:
        return arch
    try:
        dev = device.device_arch()
    except Exception:  # no runtime module, no driver: compile for the default target
        dev = None
    if dev is None or dev == "sm_90":
        return nvrtc.DEFAULT_ARCH
    return dev


def _pass_cublaslt_path() -> None:
    from .. import _rt

    path = device.cublaslt_path()
    if path:
        _rt.cuda_set_cublaslt_path(path)
