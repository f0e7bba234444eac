"""Graph -> plan: lower, generate kernels, plan memory, write the plan, load it.

g = luminal.Graph(); ...; g.output("y", y)
cg = luminal.compile(g)          # a CompiledGraph (plan + loaded executor)
cg.run({"x": x}, seq=7)          # dict of numpy arrays
cg.save("model.lmp")             # runs later with luminal.load / luminal-run
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from . import flags
from .codegen.c import render_kernel
from .compiler.lower import Lowered, lower
from .compiler.memory import plan_memory
from .graph.graph import Graph
from .plan import InlineWeight, KernelFormat, Launch, Plan, Role

__all__ = ["CompiledGraph", "compile", "build_plan"]

_ROLE = {"input": Role.input, "output": Role.output, "weight": Role.weight, "scratch": Role.scratch}


def build_plan(low: Lowered, name: str = "graph") -> Plan:
    """The plan for a lowered graph on the CPU backend."""
    plan = Plan(backend="cpu", metadata={"graph": name})
    dim_names = sorted(low.dims)
    for n in dim_names:
        d = low.dims[n]
        plan.add_dim(n, d.lo, d.hi)
    ckernels = [render_kernel(k, dim_names) for k in low.kernels]
    steps = [(c.args[:1], c.args[1:]) for c in ckernels]
    mem = plan_memory({b.id: b.nbytes() for b in low.buffers if b.role == "scratch"}, steps)
    for b in low.buffers:
        plan.add_buffer(
            b.name, b.dtype.name, _ROLE[b.role], b.shape, b.nbytes(), mem.offsets.get(b.id)
        )
    for c in ckernels:
        kid = plan.add_kernel(c.name, KernelFormat.c_source, c.name, c.source)
        plan.steps.append(Launch(kid, c.args, (c.tasks, 1, 1), (c.min_chunk, 1, 1)))
    for b in low.buffers:
        if b.role == "weight":
            if b.name not in low.weights:
                raise ValueError(
                    f"weight {b.name!r} has no data: give data= or call .set() before compiling"
                )
            plan.weights.append(InlineWeight(b.id, np.ascontiguousarray(low.weights[b.name])))
    plan.metadata["arena_slots"] = str(mem.slots)
    return plan


class CompiledGraph:
    """A compiled plan with its executor: ``run(inputs, **dims)`` and ``save(path)``."""

    def __init__(self, plan: Plan, backend: str = "cpu") -> None:
        from . import runtime

        self.plan = plan
        self.executor = runtime.Executor(plan, backend)

    def run(self, inputs: Mapping[str, Any] | None = None, **dims: int) -> dict[str, np.ndarray]:
        return self.executor.run(dict(inputs or {}), **dims)

    __call__ = run

    def save(self, path: str | os.PathLike[str]) -> None:
        self.plan.save(path)

    @property
    def kernels(self) -> int:
        return len(self.plan.kernels)


def compile(graph: Graph, backend: str = "cpu") -> CompiledGraph:  # noqa: A001
    """Compile ``graph`` into a plan for ``backend`` and load it."""
    if backend != "cpu":
        raise ValueError(f"luminal.compile: backend {backend!r} is not available yet (have: 'cpu')")
    t0 = time.perf_counter()
    low = lower(graph)
    plan = build_plan(low, graph.name)
    t1 = time.perf_counter()
    cg = CompiledGraph(plan, backend)
    level = flags.debug()
    if level >= 1:
        t2 = time.perf_counter()
        print(f"luminal: compiled {graph.name!r}: {len(graph.nodes)} nodes -> "
              f"{len(plan.kernels)} kernels, lower+codegen {1e3 * (t1 - t0):.1f} ms, "
              f"load {1e3 * (t2 - t1):.1f} ms",
              file=sys.stderr)  # fmt: skip
    if level >= 4:
        for k in plan.kernels:
            print(bytes(k.code).decode().split("#endif\n", 1)[-1], file=sys.stderr)
    if level >= 5:
        print(plan.describe(), file=sys.stderr)
    return cg
