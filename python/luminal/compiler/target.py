"""What the compiler asks of a target (DESIGN.md §1): the interface, not an implementation.

A target (``luminal/targets/``) is the one place that knows a backend. The pipeline
(``pipeline.py``) and the search reach it only through this interface: its cost constants, its
schedule space, its measuring and checking runs, its cache id, and the last stages (code
generation and the plan), which only a target can do.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from . import kernel_ir as K
    from .lower import BufferInfo, Lowered
    from .search.tuner import Timing


@dataclass(frozen=True)
class CostModel:
    """Constants of the search's cost model (``search/cost.py``). They only rank candidates
    (which few are measured), so round numbers of the right order are enough."""

    bandwidth: float = 10e9  # bytes per second
    ops: float = 10e9  # simple vectorized operations per second in generated loops
    library_speedup: float = 8.0  # a tuned library GEMM against generated loops, per flop
    # a kernel that reduces (its loops run along a sum, vectorized) against other generated
    # loops: its operations and re-reads from a cache take this many times less time
    reduce_speedup: float = 1.0
    launch: float = 5e-6  # seconds per step
    divmod: float = 4.0  # an integer division or modulus in an index, in simple operations
    block: float = 4.0  # per pass of an outer loop of a split reduction
    cache_bytes: int = 1 << 20  # an operand up to this size is re-read from a worker's cache
    cache_bandwidth: float = 40e9  # re-reads of a larger one come from a shared cache


@dataclass(frozen=True)
class ScheduleSpace:
    """The schedules the search tries on a target (``schedule.alternatives``): reduction split
    factors (partial sums kept as a vector of that many lanes), output elements per task,
    task orders (0: rows outermost; 1: outer indices fastest), jams (elements of an outer
    dim one reduction loop computes together; () where the target's renderer has none), and
    blocks: (rows, columns) of elements one loop of plain sums computes together, jammed over
    an outer dim and the innermost one (``K.Schedule.jam`` x ``jam2``), each within what the
    target's registers hold; qblocks: the same for split sums (products by block-quantized
    weights), whose dequantization temporaries take registers of their own; columns: blocks
    of one row by that many columns of products whose weight is gathered by the row (a
    mixture of experts'), which no row jam or 2-D block applies to
    (``search/schedules.py::column_blocks``)."""

    splits: tuple[int, ...] = (8, 16, 32)
    chunks: tuple[int, ...] = (8, 32)
    orders: tuple[int, ...] = (0, 1)
    jams: tuple[int, ...] = ()
    blocks: tuple[tuple[int, int], ...] = ()
    qblocks: tuple[tuple[int, int], ...] = ()
    columns: tuple[int, ...] = ()


class Target(Protocol):
    """A backend as the compiler sees it. A target may also have ``prepare(lows, wait=True)``:
    get ready to measure all of ``lows`` (compile their kernels together, in parallel); the
    search calls it with a stage's candidates. With ``wait=False`` it may return before that
    is done (compiling in the background while the search lists more candidates) and must
    finish it before it next measures or prepares waiting. ``races = True`` says ``measure``
    takes ``cutoff=`` (seconds: a first run slower than it is the only one). A target whose
    measurements depend on more than a cut-out and its dims (``search.tuner.PROGRAM_BYTES``)
    has ``measure_context() -> str`` naming it, part of each decision's cache key ('': on
    nothing more)."""

    name: str
    cost: CostModel
    space: ScheduleSpace
    # whether the search measures schedules (``space``) on this target
    searches_schedules: bool

    def cache_id(self) -> str:
        """Names the machine class measured decisions belong to (part of every cache key)."""
        ...

    def measure(self, low: Lowered, dims: dict[str, int]) -> float | Timing:
        """Median seconds of one run of a cut-out program (with its outputs when kept)."""
        ...

    @property
    def evaluate(self) -> Callable[[Lowered, dict[str, int]], dict[str, Any]] | None:
        """Outputs of a cut-out program on the search's seeded inputs; None: candidates are
        kept unchecked (the target's runner keeps no outputs)."""
        ...

    def signature(self, k: K.Kernel, dim_names: list[str]) -> Hashable:
        """Equal for scheduled kernels that generate the same code."""
        ...

    def build_plan(self, low: Lowered, name: str) -> Any:
        """Code generation and the plan for a lowered, scheduled program."""
        ...

    def library_variants(
        self, call: K.LibCall, operands: Sequence[BufferInfo]
    ) -> list[tuple[str, K.LibCall]]:
        """Other implementations of a library call that this target offers (e.g. a GEMM of
        its own with tile sizes in its fields), each with a label; the search measures them
        against the call and the generated kernel. ``operands``: the buffer of each of the
        call's arguments (dtype, and role: a weight holds the same values on every run).
        [] when it has none. A target may also define ``library_epilogues(call, epilogue,
        operands)``: calls that compute the elementwise kernel reading the call's output too
        (writing its output), measured against the call followed by that kernel."""
        ...
