"""Graph -> plan: the public entry of the compiler.

g = luminal.Graph(); ...; g.output("y", y)
cg = luminal.compile(g)          # a CompiledGraph (plan + loaded executor)
cg.run({"x": x}, seq=7)          # dict of numpy arrays
cg.save("model.lmp")             # runs later with luminal.load / luminal-run

``compile`` picks a target from the registry (``luminal/targets/``) and runs the pipeline
(``compiler/pipeline.py``: ``python -m luminal.compiler.pipeline`` prints it).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from typing import Any, cast

import numpy as np

from . import flags, targets
from .compiler.lower import Lowered
from .graph.graph import Graph
from .plan import KernelFormat, Plan

__all__ = ["CompiledGraph", "compile", "build_plan"]

# compile()'s stage messages go to its ``progress`` argument, else to this (the CLI sets it
# so that compiles made deep inside model code report too)
PROGRESS: ContextVar[Callable[[str], None] | None] = ContextVar("luminal_progress", default=None)


def build_plan(
    low: Lowered, name: str = "graph", backend: str = "cpu", gemm_impl: str | None = None
) -> Plan:
    """The plan for a lowered graph on target ``backend``: the pipeline's last stages (loop
    rewrites, then the target's code generation and plan). On CUDA, ``gemm_impl`` ("kernel"
    or "cublaslt") forces how gemm calls run; by default it is measured."""
    from .compiler import pipeline

    options = {"gemm_impl": gemm_impl} if gemm_impl is not None else {}
    target = targets.get(backend, **options)
    last = [s for s in pipeline.STAGES if s.name in ("loop_rewrites", "plan")]
    c = pipeline.Compilation(Graph(name), target, search=False, low=low)
    for st in last:
        st.run(c)
    return cast(Plan, c.product)


class CompiledGraph:
    """A compiled plan with its executor: ``run(inputs, **dims)`` and ``save(path)``.

    With ``lazy`` the executor is made on first use (a CUDA plan compiles on a machine
    without a GPU; running it there raises the runtime's error)."""

    def __init__(self, plan: Plan, backend: str = "cpu", lazy: bool = False) -> None:
        self.plan = plan
        self.backend = backend
        self._executor: Any = None
        if not lazy:
            self._executor = self.executor

    @property
    def executor(self) -> Any:
        if self._executor is None:
            from . import runtime

            self._executor = runtime.Executor(self.plan, self.backend)
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
        self.plan.save(path)

    @property
    def kernels(self) -> int:
        return len(self.plan.kernels)


def compile(  # noqa: A001
    graph: Graph,
    backend: str = "cpu",
    search: bool = True,
    progress: Callable[[str], None] | None = None,
) -> CompiledGraph:
    """Compile ``graph`` into a plan for target ``backend`` (``luminal.targets.names()``)
    and load it. With ``search`` (the default), kernels with a library alternative (GEMM) are
    timed both ways and the faster kept, and reduction kernels are timed under the target's
    schedules; what is kept is checked against the kernel as lowered, and decisions are
    cached on disk (bounds: LUMINAL_SEARCH_* flags). ``progress`` receives a line per stage."""
    from .compiler import pipeline  # not at import: ``python -m`` runs it as a script

    say = progress or PROGRESS.get() or (lambda msg: None)
    target = targets.get(backend)
    t0 = time.perf_counter()
    c = pipeline.run(graph, target, search, say)
    plan = cast(Plan, c.product)
    say(f"loading the plan ({len(plan.kernels)} kernels; compiled C is cached on disk)")
    t1 = time.perf_counter()
    cg = CompiledGraph(plan, backend, lazy=backend != "cpu")
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
