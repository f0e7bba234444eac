"""The Metal target: kernels rendered as MSL by ``codegen/metal/`` and held in the plan as
source, compiled by the Metal framework when the plan loads (``csrc/metal/``, macOS only);
gemm calls run as the generated simdgroup-matrix kernel, or as MPS matrix multiplications
(``gemm_impl="mps"``).

There is no Metal device to measure on where this is usually run, so the search ranks
candidates by the shared cost model with this target's constants (Apple M-series round
numbers) under a cache id of its own, and threadgroup sizes and gemm tiles come from the
Metal cost model (``codegen/metal/schedule.py``). Candidates are not checked against the
reference here (no runner keeps outputs).
"""

from __future__ import annotations

import sys
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from .. import flags
from ..compiler import kernel_ir as K
from ..compiler.lower import BufferInfo, Lowered
from ..compiler.search.cost import estimate
from ..compiler.target import CostModel, ScheduleSpace
from ..plan import KernelFormat, Plan
from .base import Launchable, assemble_plan

# unified memory of an M-series Pro; simdgroup-matrix gemm against generated loops per flop
COST = CostModel(bandwidth=200e9, ops=1e12, library_speedup=8.0, launch=8e-6,
                 cache_bytes=16 << 20, cache_bandwidth=1e12)  # fmt: skip
# threadgroup sizes and tiles are ranked in the renderer (schedule.py): no loop schedules
SPACE = ScheduleSpace(splits=(), chunks=(), orders=(0,))
GEMM_IMPLS = ("kernel", "mps")
# the MSL version the kernels need (simd_* reductions, simdgroup matrices: Apple7 / M1 up)
ARCH = "msl2.4"


@dataclass
class MetalTarget:
    name: str = "metal"
    cost: CostModel = COST
    space: ScheduleSpace = SPACE
    searches_schedules: bool = False
    gemm_impl: str | None = None  # "mps": every supported gemm is an MPS library call
    evaluate: None = None

    def __post_init__(self) -> None:
        if self.gemm_impl not in (None, *GEMM_IMPLS):
            raise ValueError(f"gemm_impl must be 'kernel' or 'mps', not {self.gemm_impl!r}")

    def cache_id(self) -> str:
        from ..plan_cache import render_id

        return f"metal-estimate-v1-{render_id()}"

    def library_variants(
        self, call: K.LibCall, operands: Sequence[BufferInfo]
    ) -> list[tuple[str, K.LibCall]]:
        return []  # gemm tiles are ranked by the Metal cost model in the renderer

    def signature(self, k: K.Kernel, dim_names: list[str]) -> Hashable:
        from ..codegen.metal.kernel import render_kernel

        c = render_kernel(k, dim_names)
        return c.source, repr(c.grid), repr(c.block)

    def measure(self, low: Lowered, dims: dict[str, int]) -> float:
        return estimate(low, dims, self.cost)

    def build_plan(self, low: Lowered, name: str) -> Plan:
        launches, libcalls = render_steps(low, self.gemm_impl)
        return assemble_plan(low, name, "metal", ARCH, launches, libcalls)


def render_steps(
    low: Lowered, gemm_impl: str | None = None
) -> tuple[list[Launchable], dict[int, K.LibCall]]:
    """Every step as an MSL launch, except gemm calls kept as library calls (MPS): those
    with ``gemm_impl="mps"`` and those the generated kernel cannot run."""
    from ..codegen.gpu.gemm import supports
    from ..codegen.metal.gemm import MetalGemm, render_gemm
    from ..codegen.metal.kernel import MetalKernel, render_kernel

    dims = sorted(low.dims)
    dtypes = {b.id: b.dtype for b in low.buffers}
    launches: list[Launchable] = []
    libcalls: dict[int, K.LibCall] = {}
    for i, step in enumerate(low.kernels):
        r: MetalKernel | MetalGemm
        if isinstance(step, K.LibCall):
            if gemm_impl == "mps" or supports(step, dtypes) is not None:
                libcalls[i] = step
                continue
            r = render_gemm(step, dtypes, dims)
        else:
            r = render_kernel(step, dims)
        if flags.debug() >= 4:
            print(f"// {r.name}: {r.schedule} schedule, grid {r.grid}, block {r.block}\n"
                  + r.source.split("#endif\n", 1)[-1], file=sys.stderr)  # fmt: skip
        launches.append(Launchable(r.name, KernelFormat.msl, r.source, r.args, r.grid, r.block))
    return launches, libcalls


def plan_kernels(plan: Plan) -> list[tuple[str, str]]:
    """The (name, MSL) kernels of a plan."""
    return [(k.name, k.code if isinstance(k.code, str) else bytes(k.code).decode())
            for k in plan.kernels if k.format == KernelFormat.msl]  # fmt: skip


def main(argv: Sequence[str]) -> int:
    """Type-checks the MSL kernels of saved plans (``codegen/metal/check.py``)."""
    from ..codegen.metal.check import typecheck

    kernels = [k for p in argv for k in plan_kernels(Plan.load(p))]
    n, failures = typecheck(kernels)
    for f in failures:
        print(f"{f.kernel}: {f.message}")
    print(f"{n} MSL kernels type-checked, {len(failures)} errors")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
