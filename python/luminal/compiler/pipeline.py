"""The whole compile as one list of stages (DESIGN.md §1): print it, reorder it, bisect it.

    python -m luminal.compiler.pipeline        # the stages, in order, with their flags

Each stage is named, documented and reads and writes one ``Compilation`` (the graph, then the
lowered program, then the product). A stage with a flag is skipped when the flag is ``0``.
Graph stages return an equivalent graph; the lowered stages keep each kernel's value. The last
two stages are the target's (``compiler/target.py``): only a target generates code and plans.
``LUMINAL_DEBUG=1`` prints each stage's time.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from contextvars import Token
from dataclasses import dataclass, field
from typing import Any, cast

from .. import flags
from ..graph.graph import Graph
from . import kernel_ir as K
from .actquant import quantize_activations
from .bf16 import round_products
from .collapse import collapse_dims
from .fold import fold_scales
from .lower import Lowered, lower
from .schedule import schedule
from .search.egraph import simplify
from .search.fusion import choose_fusions, choose_groups, choose_layouts
from .search.schedules import choose_schedules
from .search.select import TYPICAL_DIMS, choose_library_calls, representative_dims
from .search.tuner import PROGRAM_BYTES, STATS, Tuner, program_bytes
from .siblings import merge_sibling_products
from .stage import stage_strided_reads, summed_major_operands
from .store_order import permutable, permuted
from .target import Target


@dataclass
class Compilation:
    """What the stages pass along: a graph until ``lower``, a lowered program after it."""

    graph: Graph
    target: Target
    search: bool = True
    say: Callable[[str], None] = lambda msg: None
    low: Lowered | None = None
    tuner: Tuner | None = None
    product: Any = None  # the target's plan
    unstaged: Graph | None = None  # the graph before "stage", for the layouts stage
    times: dict[str, float] = field(default_factory=dict)

    @property
    def lowered(self) -> Lowered:
        if self.low is None:
            raise RuntimeError("this stage needs the lowered program: it runs after 'lower'")
        return self.low


@dataclass(frozen=True)
class Stage:
    name: str
    run: Callable[[Compilation], None]
    doc: str
    flag: flags.Flag | None = None

    def enabled(self) -> bool:
        return self.flag is None or self.flag.get() != "0"


def _graph_pass(fn: Callable[[Graph], Graph]) -> Callable[[Compilation], None]:
    def run(c: Compilation) -> None:
        state = dict(c.graph.state)
        c.graph = fn(c.graph)
        # passes keep inputs and outputs, so in-place updates still apply (lower re-checks)
        c.graph.state = state

    return run


def _fold_scales(c: Compilation) -> None:
    state = dict(c.graph.state)
    c.graph = fold_scales(c.graph, c.say)
    c.graph.state = state


def _egraph(g: Graph) -> Graph:
    return simplify(g, verbose=flags.debug() >= 3)[0]


def _stage(c: Compilation) -> None:
    c.unstaged = c.graph
    _graph_pass(stage_strided_reads)(c)


def _lower(c: Compilation) -> None:
    c.say(f"lowering {len(c.graph.nodes)} nodes")
    c.low = lower(c.graph)


def _collapse(c: Compilation) -> None:
    c.low = collapse_dims(c.lowered)


def _tuner(c: Compilation) -> Tuner | None:
    if not c.search:
        return None
    if c.tuner is None:
        t = c.target
        schedules = t.searches_schedules and flags.SEARCH_SCHEDULES.get() != "0"
        c.tuner = Tuner(t.measure, t.cache_id(), t.evaluate, t.cost, t.space, t.library_variants,
                        getattr(t, "prepare", None), races=getattr(t, "races", False),
                        schedules=schedules,
                        context=getattr(t, "measure_context", None),
                        epilogues=getattr(t, "library_epilogues", None))  # fmt: skip
    return c.tuner


def _library_calls(c: Compilation) -> None:
    tuner = _tuner(c)
    if tuner is not None:
        c.low = choose_library_calls(c.lowered, tuner)


def _layouts(c: Compilation) -> None:
    tuner = _tuner(c)
    if tuner is None or c.unstaged is None:
        return
    major = summed_major_operands(c.unstaged)
    if not major:
        return
    copies: dict[int, tuple[int, int]] = {}
    alt = _restaged(c, major, copies)
    chosen = choose_layouts(c.lowered, alt.lowered, copies, tuner)
    if chosen:
        done = alt if chosen == major else _restaged(c, frozenset(chosen), {})
        c.graph, c.low = done.graph, done.low


def _store_order(c: Compilation) -> None:
    tuner = _tuner(c)
    if tuner is None:
        return
    order = permutable(c.graph)
    graph = permuted(c.graph, order)
    if graph is c.graph:
        return
    alt = _relowered(c, graph)
    chosen = choose_groups(c.lowered, alt.lowered, tuner, frozenset(order), "store_order",
                           ("as built", "permuted"), weights=True)  # fmt: skip
    if not chosen:
        return
    stored = {b.name for b in alt.lowered.buffers}
    if chosen != {n for n in order if f"t{n}" in stored}:
        # the values no kernel stores are permuted alike: alone they change no memory access
        keep = frozenset(chosen) | {n for n in order if f"t{n}" not in stored}
        alt = _relowered(c, permuted(c.graph, permutable(c.graph, keep)))
    c.graph, c.low = alt.graph, alt.low


def _relowered(c: Compilation, graph: Graph) -> Compilation:
    """``graph`` (a staged graph) through every enabled stage after "stage" up to
    "library_calls"."""
    sub = Compilation(graph, c.target, c.search, c.say, tuner=c.tuner)
    names = [st.name for st in STAGES]
    for st in STAGES[names.index("stage") + 1 : names.index("library_calls") + 1]:
        if st.enabled():
            st.run(sub)
    return sub


def _restaged(
    c: Compilation, major: frozenset[tuple[int, int]], copies: dict[int, tuple[int, int]]
) -> Compilation:
    """``c`` staged again from its unstaged graph with ``major`` copied summed axis first,
    through every enabled stage from "stage" to "library_calls"."""
    assert c.unstaged is not None
    staged = stage_strided_reads(c.unstaged, major, copies)
    staged.state = dict(c.unstaged.state)
    return _relowered(c, staged)


def _fusion(c: Compilation) -> None:
    tuner = _tuner(c)
    if tuner is None or not c.lowered.windowed:
        return
    calls = flags.SEARCH_LIBRARY.get() != "0"
    c.low = choose_fusions(
        c.graph, c.lowered, tuner, lambda low: choose_library_calls(low, tuner) if calls else low
    )


def _schedules(c: Compilation) -> None:
    tuner = _tuner(c)
    if tuner is not None and c.target.searches_schedules:
        c.low = choose_schedules(c.lowered, tuner, c.target.signature)


def _loop_rewrites(c: Compilation) -> None:
    low = c.lowered
    if c.tuner is not None:
        c.tuner.summary()
    c.low = Lowered(low.buffers, cast(list[K.Kernel], schedule(low.kernels)), low.dims, low.weights)


def _plan(c: Compilation) -> None:
    low = c.lowered
    c.say(f"generating code for {len(low.kernels)} kernels")
    c.product = c.target.build_plan(low, c.graph.name)


STAGES: list[Stage] = [
    Stage(
        "act_quant",
        _graph_pass(quantize_activations),
        "with LUMINAL_ACT_QUANT=q8, activations of products by 32-block quantized weights "
        "quantized to int8 per block, llama.cpp's numerics (compiler/actquant.py)",
        flags.ACT_QUANT,
    ),
    Stage(
        "fold_scales",
        _fold_scales,
        "weight-only values constant along axes (quantized block scales) stored once as f32; "
        "strided weight reads repacked (compiler/fold.py)",
        flags.FOLD_SCALES,
    ),
    Stage(
        "siblings",
        _graph_pass(merge_sibling_products),
        "products of one operand by several weights merged into one (compiler/siblings.py)",
        flags.SIBLINGS,
    ),
    Stage(
        "egraph",
        _graph_pass(_egraph),
        "equality saturation with the rule files (compiler/search/rules)",
        flags.EGRAPH,
    ),
    Stage(
        "stage",
        _stage,
        "div/mod-strided operands of sums shared by many rows copied contiguously "
        "(compiler/stage.py)",
        flags.STAGE,
    ),
    Stage(
        "bf16",
        _graph_pass(round_products),
        "with LUMINAL_MATMUL_PRECISION=bf16, both operands of products by f32 or bf16 weights "
        "rounded to bf16, the sums in f32 (compiler/bf16.py)",
        flags.MATMUL_PRECISION,
    ),
    Stage(
        "lower",
        _lower,
        "fusion into kernels of the kernel IR, with the online-softmax rule "
        "(compiler/lower.py, compiler/attention.py)",
    ),
    Stage(
        "collapse",
        _collapse,
        "adjacent symbolic dims every index reads as one (batch x seq rows) merged into one "
        "loop (compiler/collapse.py)",
        flags.COLLAPSE,
    ),
    Stage(
        "library_calls",
        _library_calls,
        "generated kernel or library call (GEMM), by measurement on the target "
        "(compiler/search/select.py)",
        flags.SEARCH_LIBRARY,
    ),
    Stage(
        "layouts",
        _layouts,
        "staged copies read along an output axis (a conv's patches) copied in row order or "
        "summed axis first, by measurement (compiler/search/fusion.py)",
        flags.SEARCH_FUSION,
    ),
    Stage(
        "store_order",
        _store_order,
        "values read only through one permutation computed in that order, by measurement "
        "(compiler/store_order.py)",
        flags.SEARCH_FUSION,
    ),
    Stage(
        "fusion",
        _fusion,
        "values read through overlapping windows (a conv's patches) stored first or recomputed "
        "per read, by measurement (compiler/search/fusion.py)",
        flags.SEARCH_FUSION,
    ),
    Stage(
        "schedules",
        _schedules,
        "each reduction kernel's schedule from the target's space, by measurement "
        "(compiler/search/schedules.py)",
        flags.SEARCH_SCHEDULES,
    ),
    Stage(
        "loop_rewrites",
        _loop_rewrites,
        "schedules applied: reductions split, blocks jammed (compiler/schedule.py)",
    ),
    Stage("plan", _plan, "the target's code generation, memory plan and plan (luminal/targets/)"),
]


def graph_passes(graph: Graph) -> Graph:
    """``graph`` through the enabled graph stages (every stage before ``lower``)."""
    c = Compilation(graph, cast(Target, None))
    for st in STAGES[: [s.name for s in STAGES].index("lower")]:
        if st.enabled():
            st.run(c)
    return c.graph


# on_stage(stage name, its number, number of stages, a function giving a live count or None)
OnStage = Callable[[str, int, int, "Callable[[], str] | None"], None]


def run(
    graph: Graph,
    target: Target,
    search: bool = True,
    say: Callable[[str], None] | None = None,
    stages: list[Stage] | None = None,
    on_stage: OnStage | None = None,
    typical_dims: Mapping[str, int] | None = None,
) -> Compilation:
    """Runs ``stages`` (default ``STAGES``) on ``graph`` for ``target``; ``on_stage`` hears
    of each stage as it starts (the progress line). The search measures at ``typical_dims``
    where given (``search.select.TYPICAL_DIMS``)."""
    token = TYPICAL_DIMS.set(dict(typical_dims or {}))
    try:
        return _run(Compilation(graph, target, search, say or (lambda msg: None)), stages,
                    on_stage)  # fmt: skip
    finally:
        TYPICAL_DIMS.reset(token)


def _run(c: Compilation, stages: list[Stage] | None, on_stage: OnStage | None) -> Compilation:
    level = flags.debug()
    todo = [st for st in (STAGES if stages is None else stages) if st.enabled()]
    size: Token[int | None] | None = None
    try:
        for i, st in enumerate(todo):
            if on_stage is not None:
                on_stage(st.name, i + 1, len(todo), _progress_detail(c, st.name))
            t = time.perf_counter()
            if size is None and c.low is not None and c.search:
                # the program as lowered, for every later stage: a decision two stages share
                # (the fusion stage chooses library calls again) has one cache key
                size = PROGRAM_BYTES.set(program_bytes(c.low, representative_dims(c.low)))
            st.run(c)
            c.times[st.name] = time.perf_counter() - t
            if level >= 1:
                print(f"luminal: stage {st.name}: {1e3 * c.times[st.name]:.1f} ms",
                      file=sys.stderr)  # fmt: skip
    finally:
        if size is not None:
            PROGRAM_BYTES.reset(size)
    return c


def _progress_detail(c: Compilation, stage: str) -> Callable[[], str] | None:
    """The live count the progress line shows during ``stage``."""
    if stage in ("library_calls", "schedules") and c.search:
        m0, d0 = STATS.measurements, STATS.searched + STATS.cached
        return lambda: (f"{STATS.searched + STATS.cached - d0} kernels decided, "
                        f"{STATS.measurements - m0} measurements")  # fmt: skip
    if stage in ("loop_rewrites", "plan") and c.low is not None:
        n = len(c.low.kernels)
        return lambda: f"{n} kernels"
    return None


def describe(stages: list[Stage] | None = None) -> str:
    lines = []
    for i, st in enumerate(STAGES if stages is None else stages):
        flag = f"  [{st.flag.name}={st.flag.get() or st.flag.default}]" if st.flag else ""
        lines.append(f"{i + 1:2d}. {st.name}{flag}\n    {st.doc}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(describe())
