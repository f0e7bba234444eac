"""Metal schedules: the threadgroup size of each kernel and the tile of each gemm, ranked by
a cost model of an Apple GPU (no device is measured: these are estimates, like the CUDA
target's without a GPU).

The model: a kernel runs in waves of threadgroups over the GPU's cores, as many groups per
core as its threads and threadgroup memory allow; a group's time is its serial work plus its
barriers. Sizes are evaluated with every symbolic dim at ``REPRESENTATIVE`` (or its bound).
The constants are round numbers for an M-series GPU of 16 cores; only their ratios rank.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from ...compiler import kernel_ir as K
from ...graph import symbolic as sym
from ...graph.symbolic import sint

REPRESENTATIVE = 256


@dataclass(frozen=True)
class Machine:
    cores: int = 16
    threads_per_core: int = 1024  # resident threads per core
    tg_memory: int = 32768  # threadgroup memory per group (bytes)
    element: float = 1e-9  # seconds per serial element of one thread (memory-bound)
    barrier: float = 2e-7  # seconds per threadgroup barrier and fold of partials
    mma: float = 2e12  # simdgroup-matrix flops per second of the whole GPU
    bandwidth: float = 200e9  # bytes per second


APPLE = Machine()
THREADS = (64, 128, 256, 512)  # threadgroup sizes the search ranks


def size(e: sint | float) -> int:
    """``e`` at the representative dims (every dim at REPRESENTATIVE, within its bounds)."""
    if isinstance(e, (int, float)):
        return max(0, int(e))
    env = {v.name: min(max(REPRESENTATIVE, v.lo), v.hi) for v in e.vars()}
    return max(0, int(sym.evaluate(e, env)))


def _numel(shape: tuple[sint, ...] | list[sint]) -> int:
    return math.prod(size(s) for s in shape)


def _waves(groups: int, per_core: int, m: Machine) -> int:
    return max(1, math.ceil(groups / (m.cores * max(1, per_core))))


def estimate_threads(k: K.Kernel, schedule: str, threads: int, m: Machine = APPLE) -> float:
    """Estimated seconds for kernel ``k`` under ``schedule`` with ``threads`` per group."""
    per_core = m.threads_per_core // threads
    reduces = [x for x in K.walk(k.value) if isinstance(x, K.Reduce)]
    extent = max((size(r.extent) for r in reduces), default=1)
    if schedule in ("row", "element"):
        groups = _numel(k.shape[:-1]) if schedule == "row" else _numel(k.shape)
        last = size(k.shape[-1]) if schedule == "row" and k.shape else 1
        serial = math.ceil(extent / threads) + math.ceil(last / threads)
        # each group reduction: simd functions, a barrier, a fold of threads/32 partials
        per_group = serial * m.element + m.barrier * (1 + threads / 32 / 8)
        return _waves(groups, per_core, m) * per_group
    work = _numel(k.shape)
    groups = max(1, math.ceil(work / threads))
    # a thread's elements are serial; a wave holds every core's resident threads
    per_group = m.element * (extent if reduces else 1)
    return _waves(groups, per_core, m) * per_group + groups * 1e-9


def choose_threads(k: K.Kernel, schedule: str, m: Machine = APPLE) -> int:
    """The threadgroup size the model ranks first (ties: the larger, fewer groups)."""
    if schedule == "scatter":
        return 256
    ranked = sorted(THREADS, key=lambda t: (estimate_threads(k, schedule, t, m), -t))
    return ranked[0]


@dataclass(frozen=True)
class GemmTile:
    """A threadgroup's tile of C: sg_m x sg_n simdgroups, each tm x tn 8x8 matrices."""

    sg_m: int
    sg_n: int
    tm: int
    tn: int
    bk: int = 16

    @property
    def bm(self) -> int:
        return self.sg_m * self.tm * 8

    @property
    def bn(self) -> int:
        return self.sg_n * self.tn * 8

    @property
    def threads(self) -> int:
        return 32 * self.sg_m * self.sg_n

    def tg_bytes(self, operand_bytes: int) -> int:
        """Threadgroup memory: the A and B tiles, then the C tile staged as f32 for the
        bounds-checked epilogue."""
        return (self.bm + self.bn) * self.bk * operand_bytes + self.bm * self.bn * 4


TILES = (
    GemmTile(2, 2, 4, 4),  # 64 x 64, 128 threads
    GemmTile(2, 2, 2, 2),  # 32 x 32
    GemmTile(1, 4, 2, 2),  # 16 x 64: short M (decode)
    GemmTile(1, 4, 1, 4),  # 8 x 128: one-row products
    GemmTile(2, 4, 2, 2),  # 32 x 64, 256 threads
)


def estimate_gemm(
    fields: Mapping[str, sint | float], tile: GemmTile, operand_bytes: int, m: Machine = APPLE
) -> float:
    """Estimated seconds of one gemm with ``tile``: padded flops on the simdgroup matrices
    and the operand bytes each tile reads, over the waves the tile count needs."""
    M, N, Kd = size(fields["m"]), size(fields["n"]), size(fields["k"])
    batch = size(fields.get("batch", 1))
    tiles = math.ceil(M / tile.bm) * math.ceil(N / tile.bn) * max(1, batch)
    per_core = min(m.threads_per_core // tile.threads,
                   m.tg_memory // max(1, tile.tg_bytes(operand_bytes)))  # fmt: skip
    if per_core < 1:
        return math.inf
    slots = m.cores * per_core
    waves = max(1, math.ceil(tiles / slots))
    flops = 2.0 * tile.bm * tile.bn * max(1, Kd)
    moved = (tile.bm + tile.bn) * max(1, Kd) * operand_bytes
    per_tile = max(flops / (m.mma / slots), moved / (m.bandwidth / slots))
    return waves * per_tile


def choose_tile(
    fields: Mapping[str, sint | float], operand_bytes: int, m: Machine = APPLE
) -> GemmTile:
    ranked = sorted(TILES, key=lambda t: (estimate_gemm(fields, t, operand_bytes, m), -t.bm))
    return ranked[0]
