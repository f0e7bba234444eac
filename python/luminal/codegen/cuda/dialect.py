"""CUDA's names for the shared GPU core (codegen/gpu/): blocks, ``__syncthreads``,
``__shared__``, warp shuffles (``lm_shfl``, defined in the CUDA prelude)."""

from __future__ import annotations

from collections.abc import Sequence

from ...graph import dtypes as dt
from ...graph.ops import Op
from ..cstyle import reduce_update
from ..gpu.kernel import Dialect


class CudaDialect(Dialect):
    name = "CUDA"
    group, local, groups = "blockIdx", "threadIdx", "gridDim"
    lane, subgroup = "(threadIdx.x & 31)", "(threadIdx.x >> 5)"
    barrier = "__syncthreads()"
    shared = "__shared__"
    global_ = ""

    def param(self, slot: int, ctype: str, restrict: bool) -> str:
        return (
            f"{'' if slot == 0 else 'const '}{ctype} *{' __restrict__' if restrict else ''} b{slot}"
        )

    def frame(self, name: str, params: Sequence[str], n_dims: int, threads: int) -> str:
        allp = [*params, *(f"const int64_t lm_dim{i}" for i in range(n_dims))]
        return (
            f'extern "C" __global__ void __launch_bounds__({threads}) {name}({", ".join(allp)}) {{'
        )

    def dim(self, i: int) -> str:
        return f"lm_dim{i}"

    def subgroup_reduce(self, acc: str, op: Op, t: str, d: dt.DType) -> str:
        upd = reduce_update(op, d, acc, "y")
        return f"for (int o = 16; o > 0; o >>= 1) {{ const {t} y = lm_shfl({acc}, o); {acc} = {upd}; }}"


CUDA = CudaDialect()
