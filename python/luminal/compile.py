"""Graph -> plan: the public entry of the compiler.

g = luminal.Graph(); ...; g.output("y", y)
cg = luminal.compile(g)          # a CompiledGraph (plan + loaded executor)
cg.run({"x": x}, seq=7)          # dict of numpy arrays
cg.save("model.lmp")             # runs later with luminal.load / luminal-run

``compile`` picks a target from the registry (``luminal/targets/``) and runs the pipeline
(``compiler/pipeline.py``: ``python -m luminal.compiler.pipeline`` prints it). Compiled plans
are kept in the plan cache (``luminal.plan_cache``, docs/plan-cache.md): compiling the same
graph again, in any process, loads the plan instead.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from . import flags
from .plan import KernelFormat, Plan

if TYPE_CHECKING:  # the compiler is imported when something is compiled, not with luminal
    from .compiler.lower import Lowered
    from .graph.graph import Graph

__all__ = ["CompiledGraph", "compile", "build_plan", "prepare"]

# compile()'s stage messages go to its ``progress`` argument, else to this (the CLI sets it
# so that compiles made deep inside model code report too)
PROGRESS: ContextVar[Callable[[str], None] | None] = ContextVar("luminal_progress", default=None)


def build_plan(
    low: Lowered, name: str = "graph", backend: str = "cpu", gemm_impl: str | None = None
) -> Plan:
    """The plan for a lowered graph on target ``backend``: the pipeline's last stages (loop
    rewrites, then the target's code generation and plan). On CUDA, ``gemm_impl`` ("kernel"
    or "cublaslt") forces how gemm calls run; by default it is measured."""
    from . import targets
    from .compiler import pipeline
    from .graph.graph import Graph

    options = {"gemm_impl": gemm_impl} if gemm_impl is not None else {}
    target = targets.get(backend, **options)
    last = [s for s in pipeline.STAGES if s.name in ("loop_rewrites", "plan")]
    c = pipeline.Compilation(Graph(name), target, search=False, low=low)
    for st in last:
        st.run(c)
    return cast(Plan, c.product)


def prepare(plans: Sequence[Plan], backend: str = "cpu", jobs: int = 0) -> None:
    """Loads the kernels of all ``plans`` at once, ``jobs`` plans at a time (0: one per
    core): on cpu the C compiles run in parallel and land in the disk cache, so that an
    ``Executor`` of each plan afterwards compiles nothing. The search calls it with all
    candidates of one decision before it measures them one by one."""
    from . import _rt

    if jobs < 0:
        raise ValueError(f"prepare: jobs must be >= 0 (0: one per core), not {jobs}")
    _rt.prepare([_rt.Plan.from_parts(p.parts(), ".") for p in plans], backend, jobs)


class CompiledGraph:
    """A compiled plan with its executor: ``run(inputs, **dims)`` and ``save(path)``.

    With ``lazy`` the executor is made on first use (a CUDA plan compiles on a machine
    without a GPU; running it there raises the runtime's error)."""

    def __init__(self, plan: Plan, backend: str = "cpu", lazy: bool = False) -> None:
        self.plan = plan
        self.backend = backend
        self.path: str | None = None  # the plan cache file this plan was loaded from
        self._executor: Any = None
        if not lazy:
            self._executor = self.executor

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], backend: str = "cpu") -> CompiledGraph:
        """A saved plan; the runtime maps the file (inline weights are not copied) when the
        plan first runs."""
        from .plan import FileWeight

        plan = Plan.load(path)
        base = os.path.dirname(os.path.abspath(path))
        for i, w in enumerate(plan.weights):  # saved elsewhere, the plan still finds them
            if isinstance(w, FileWeight) and not os.path.isabs(w.path):
                plan.weights[i] = FileWeight(w.buffer, os.path.join(base, w.path), w.offset,
                                             w.nbytes)  # fmt: skip
        cg = cls(plan, backend, lazy=True)
        cg.path = os.fspath(path)
        return cg

    @property
    def executor(self) -> Any:
        if self._executor is None:
            from . import runtime

            src: Any = self.path if self.path is not None else self.plan
            self._executor = runtime.Executor(src, self.backend)
        return self._executor

    def run(
        self,
        inputs: Mapping[str, Any] | None = None,
        *,
        out: Mapping[str, np.ndarray] | None = None,
        **dims: int,
    ) -> dict[str, np.ndarray]:
        """Runs the plan; ``out`` names caller-owned output arrays (see ``Executor.run``)."""
        return self.executor.run(dict(inputs or {}), dims, out=out)

    __call__ = run

    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes the plan, self-contained: a plan from the plan cache refers to weights in
        model files and cache files; those bytes are written into the saved file."""
        self.plan.save(path) if self.path is None else _inlined(self.plan).save(path)

    @property
    def kernels(self) -> int:
        return len(self.plan.kernels)


def _inlined(plan: Plan) -> Plan:
    """``plan`` with every file weight replaced by the file's bytes (mapped, not read)."""
    import mmap

    from .plan import FileWeight, InlineWeight

    maps: dict[str, np.ndarray] = {}
    weights: list[Any] = []
    for w in plan.weights:
        if isinstance(w, FileWeight):
            if w.path not in maps:
                with open(w.path, "rb") as f:
                    maps[w.path] = np.frombuffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ),
                                                 np.uint8)  # fmt: skip
            w = InlineWeight(w.buffer, maps[w.path][w.offset : w.offset + w.nbytes])
        weights.append(w)
    return Plan(backend=plan.backend, arch=plan.arch, dims=plan.dims, buffers=plan.buffers,
                kernels=plan.kernels, steps=plan.steps, weights=weights,
                metadata=plan.metadata)  # fmt: skip


def compile(  # noqa: A001
    graph: Graph,
    backend: str = "cpu",
    search: bool = True,
    progress: Callable[[str], None] | None = None,
    cache: bool = True,
    load: bool = True,
    typical_dims: Mapping[str, int] | None = None,
) -> CompiledGraph:
    """Compile ``graph`` into a plan for target ``backend`` (``luminal.targets.names()``)
    and load it. With ``search`` (the default), kernels with a library alternative (GEMM) are
    timed both ways and the faster kept, and reduction kernels are timed under the target's
    schedules; what is kept is checked against the kernel as lowered, and decisions are
    cached on disk (bounds: LUMINAL_SEARCH_* flags). ``progress`` receives a line per stage.

    With ``cache`` (the default; ``LUMINAL_PLAN_CACHE=0`` turns it off everywhere) the plan
    comes from the plan cache when this graph, with these weights and options, was compiled
    before on this machine by this luminal, and goes into it otherwise. With ``load=False``
    the plan is not loaded until it first runs (a caller that saves it and runs the saved
    file never holds the runtime's copy of its weights).

    ``typical_dims`` gives values the graph's symbolic dims usually take: the search measures
    its candidates there (and at each dim's smallest) instead of at a default size."""
    from . import plan_cache, targets

    say = progress or PROGRESS.get() or (lambda msg: None)
    target = targets.get(backend)
    store = plan_cache.default_cache() if cache else None
    typical = {n: int(v) for n, v in (typical_dims or {}).items() if n in graph.dims()}
    if store is None:
        return _compile(graph, backend, target, search, say, load, typical)
    options: dict[str, Any] = {"search": search, "target": target.cache_id()}
    if typical:
        options["typical_dims"] = sorted(typical.items())
    key = plan_cache.make_key(plan_cache.graph_fingerprint(graph), backend, options)
    built: list[CompiledGraph] = []

    def build() -> tuple[Plan, dict[str, Any]]:
        built.append(_compile(graph, backend, target, search, say, load, typical))
        return built[0].plan, graph.weights

    path, _ = store.get_or_build(key, build)
    if built:
        return built[0]
    say(f"loading the cached plan {path.name}")
    return CompiledGraph.from_file(path, backend)


_PRELUDE_STARTED = False


def _start_prelude(backend: str) -> None:
    """Starts precompiling the cpu kernels' prelude (about 2 s the first time on a machine,
    then a cache hit) on a thread, so that it overlaps the graph passes and lowering instead
    of delaying the first kernel compile."""
    global _PRELUDE_STARTED
    if backend != "cpu" or _PRELUDE_STARTED:
        return
    _PRELUDE_STARTED = True
    import threading

    from . import _rt
    from .codegen.cpu.kernel import PRELUDE

    def run() -> None:
        # a failure here is the compiler's to report, on the compile that needs it
        with contextlib.suppress(RuntimeError):
            _rt.precompile_prelude(PRELUDE)

    threading.Thread(target=run, name="luminal-prelude").start()


def _compile(
    graph: Graph,
    backend: str,
    target: Any,
    search: bool,
    say: Callable[[str], None],
    load: bool = True,
    typical_dims: Mapping[str, int] | None = None,
) -> CompiledGraph:
    from . import progress
    from .compiler import pipeline  # not at import: ``python -m`` runs it as a script

    t0 = time.perf_counter()
    _start_prelude(backend)
    with progress.task(f"compiling {graph.name!r}"):
        c = pipeline.run(graph, target, search, say, on_stage=progress.update,
                         typical_dims=typical_dims)  # fmt: skip
        plan = cast(Plan, c.product)
        say(f"loading the plan ({len(plan.kernels)} kernels; compiled C is cached on disk)")
        progress.update("loading the plan", detail=lambda: f"{len(plan.kernels)} kernels")
        t1 = time.perf_counter()
        cg = CompiledGraph(plan, backend, lazy=backend != "cpu" or not load)
    level = flags.debug()
    if level >= 1:
        t2 = time.perf_counter()
        print(f"luminal: compiled {graph.name!r}: {len(graph.nodes)} nodes -> "
              f"{len(plan.kernels)} kernels ({len(plan.steps)} steps), compile "
              f"{1e3 * (t1 - t0):.1f} ms, load {1e3 * (t2 - t1):.1f} ms",
              file=sys.stderr)  # fmt: skip
    if level >= 4:
        for k in plan.kernels:
            if k.format in (KernelFormat.c_source, KernelFormat.cuda_source):
                print(bytes(k.code).decode().rsplit("#endif\n", 1)[-1], file=sys.stderr)
    if level >= 5:
        print(plan.describe(), file=sys.stderr)
    return cg
