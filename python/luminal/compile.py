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
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from typing import Any, cast

import numpy as np

from . import flags
from .codegen.c import render_kernel
from .compiler import kernel_ir as K
from .compiler.fold import fold_scales
from .compiler.lower import Lowered, lower
from .compiler.memory import plan_memory
from .compiler.passes import run_passes
from .compiler.schedule import schedule
from .compiler.search.schedules import choose_schedules
from .compiler.search.select import choose_library_calls
from .compiler.search.tuner import Timing, Tuner, random_inputs
from .graph.graph import Graph
from .plan import InlineWeight, KernelFormat, Launch, LibCall, Plan, Role

__all__ = ["CompiledGraph", "compile", "build_plan"]

# compile()'s stage messages go to its ``progress`` argument, else to this (the CLI sets it
# so that compiles made deep inside model code report too)
PROGRESS: ContextVar[Callable[[str], None] | None] = ContextVar("luminal_progress", default=None)

_ROLE = {"input": Role.input, "output": Role.output, "weight": Role.weight, "scratch": Role.scratch}


def build_plan(
    low: Lowered, name: str = "graph", backend: str = "cpu", gemm_impl: str | None = None
) -> Plan:
    """The plan for a lowered graph on ``backend`` ("cpu" or "cuda"). On CUDA, ``gemm_impl``
    ("kernel" or "cublaslt") forces how gemm calls run; by default it is measured."""
    dim_names = sorted(low.dims)
    # loop-structure rewrites that keep each kernel's value (compiler/schedule.py)
    low = Lowered(low.buffers, cast(list[K.Kernel], schedule(low.kernels)), low.dims, low.weights)
    # per kernel: (name, format, code, buffer args, grid, block)
    launches: list[tuple[str, KernelFormat, bytes | str, list[int], tuple, tuple]]
    libcalls = {i: k for i, k in enumerate(low.kernels) if isinstance(k, K.LibCall)}
    if backend == "cpu":
        arch = ""
        ckernels = [_render(k, dim_names) for k in low.kernels if isinstance(k, K.Kernel)]
        launches = [(c.name, KernelFormat.c_source, c.source, c.args, (c.tasks, 1, 1),
                     (c.min_chunk, 1, 1)) for c in ckernels]  # fmt: skip
    elif backend == "cuda":
        from . import cuda as cuda_rt
        from .codegen import cuda

        arch = cuda.target_arch()
        # library calls become generated kernels unless cuBLASLt measured faster (cuda.py)
        libcalls = {i: libcalls[i] for i in cuda_rt.library_steps(low, gemm_impl)}
        gen = [k for i, k in enumerate(low.kernels) if i not in libcalls]
        dtypes = {b.id: b.dtype for b in low.buffers}
        launches = [(c.name, KernelFormat.cubin, cubin, c.args, c.grid, c.block)
                    for c, cubin in cuda.compile_kernels(gen, dim_names, arch, dtypes)]  # fmt: skip
    else:
        raise ValueError(f"luminal.compile: unknown backend {backend!r} (have: 'cpu', 'cuda')")
    plan = Plan(backend=backend, arch=arch, metadata={"graph": name})
    for n in dim_names:
        d = low.dims[n]
        plan.add_dim(n, d.lo, d.hi)
    steps = [K.step_buffers(k) for k in low.kernels]
    mem = plan_memory({b.id: b.nbytes() for b in low.buffers if b.role == "scratch"}, steps)
    for b in low.buffers:
        plan.add_buffer(
            b.name, b.dtype.name, _ROLE[b.role], b.shape, b.nbytes(), mem.offsets.get(b.id),
            alias=b.alias,
        )  # fmt: skip
    pending = iter(launches)
    for i in range(len(low.kernels)):
        if i in libcalls:
            lc = libcalls[i]
            plan.steps.append(LibCall(lc.func, dict(lc.fields), list(lc.args)))
            continue
        kname, fmt, code, args, grid, block = next(pending)
        kid = plan.add_kernel(kname, fmt, kname, code)
        plan.steps.append(Launch(kid, args, grid, block))
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


def _render(k: K.Kernel, dim_names: list[str]) -> Any:
    # a searched chunk reaches the C generator through inner_chunk (used by kernels without a
    # per-element reduction; c.py reads nothing else of the schedule yet)
    chunk = k.schedule.chunk if k.schedule is not None else 0
    return render_kernel(k, dim_names, inner_chunk=chunk) if chunk else render_kernel(k, dim_names)


def _signature(k: K.Kernel, dim_names: list[str]) -> tuple[str, str, int]:
    """What decides the code a scheduled kernel runs: equal signatures, equal programs."""
    c = _render(k, dim_names)
    return c.source, repr(c.tasks), c.min_chunk


def _cpu_target() -> str:
    import platform

    return f"cpu-{platform.machine()}-{platform.processor() or 'generic'}-{os.cpu_count()}"


def _executor(low: Lowered) -> Any:
    from . import runtime

    ex = runtime.Executor(build_plan(low, "measure", "cpu"))
    if flags.debug() >= 2:  # measuring runs are not the user's: keep them out of the step table
        ex.set_profiling(False)
        if ex in runtime._PROFILED:
            runtime._PROFILED.remove(ex)
    return ex


def _measure_cpu(low: Lowered, dims: dict[str, int], repeats: int = 5) -> Timing:
    """Median seconds of one run of a small plan, through the runtime that runs plans, with
    the outputs of its first run on the search's seeded inputs. A first run longer than
    LUMINAL_SEARCH_MEASURE_MS is the only one."""
    ex = _executor(low)
    inputs = random_inputs(low, dims, ex.inputs, flags.SEARCH_SEED.as_int())
    t = time.perf_counter()
    outputs = ex.run(inputs, **dims)  # warm-up, and the outputs the search checks
    first = time.perf_counter() - t
    if first * 1e3 > flags.SEARCH_MEASURE_MS.as_float():
        return Timing(first, 1, outputs)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        ex.run(inputs, **dims)
        times.append(time.perf_counter() - t)
    return Timing(float(np.median(times)), repeats, outputs)


def _evaluate_cpu(low: Lowered, dims: dict[str, int]) -> dict[str, np.ndarray]:
    """Outputs of a small plan on the search's seeded inputs (to check a candidate)."""
    ex = _executor(low)
    return ex.run(random_inputs(low, dims, ex.inputs, flags.SEARCH_SEED.as_int()), **dims)


def compile(  # noqa: A001
    graph: Graph,
    backend: str = "cpu",
    search: bool = True,
    progress: Callable[[str], None] | None = None,
) -> CompiledGraph:
    """Compile ``graph`` into a plan for ``backend`` and load it. With ``search`` (the
    default), kernels with a library alternative (GEMM) are timed both ways and the faster
    kept, and on the CPU reduction kernels are timed under a few schedules; what is kept is
    checked against the kernel as lowered, and decisions are cached on disk (bounds:
    LUMINAL_SEARCH_* flags). ``progress`` receives a line per stage."""
    say = progress or PROGRESS.get() or (lambda msg: None)
    say(f"lowering {len(graph.nodes)} nodes")
    t0 = time.perf_counter()
    graph = fold_scales(graph, say)  # block scales of quantized weights: stored as f32
    low = lower(run_passes(graph))  # compiler/passes.py: the e-graph rewrites
    if backend == "cpu" and search:
        tuner = Tuner(_measure_cpu, _cpu_target(), _evaluate_cpu)
        low = choose_library_calls(low, tuner)
        if flags.SEARCH_SCHEDULES.as_int():
            low = choose_schedules(low, tuner, _signature)
        tuner.summary()
    elif backend == "cuda" and search:
        from . import cuda as cuda_rt

        # measured on the device when there is one (no outputs kept there: unchecked)
        tuner = Tuner(*cuda_rt.search_measure())
        low = choose_library_calls(low, tuner)
        tuner.summary()
    say(f"generating code for {len(low.kernels)} kernels")
    plan = build_plan(low, graph.name, backend)
    say(f"loading the plan ({len(plan.kernels)} kernels; compiled C is cached on disk)")
    t1 = time.perf_counter()
    cg = CompiledGraph(plan, backend, lazy=backend == "cuda")
    level = flags.debug()
    if level >= 1:
        t2 = time.perf_counter()
        print(f"luminal: compiled {graph.name!r}: {len(graph.nodes)} nodes -> "
              f"{len(plan.kernels)} kernels, lower+codegen {1e3 * (t1 - t0):.1f} ms, "
              f"load {1e3 * (t2 - t1):.1f} ms",
              file=sys.stderr)  # fmt: skip
    if level >= 4:
        for k in plan.kernels:
            if k.format in (KernelFormat.c_source, KernelFormat.cuda_source):
                print(bytes(k.code).decode().rsplit("#endif\n", 1)[-1], file=sys.stderr)
    if level >= 5:
        print(plan.describe(), file=sys.stderr)
    return cg
