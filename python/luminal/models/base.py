"""What every model shares: where weights come from, and how a built graph is run.

A model definition asks a ``WeightSource`` for tensors by canonical name (GGUF names:
``blk.0.attn_q.weight``); the source decides whether a weight enters the graph as an f32
array, a mapped f16/bf16 array cast in the graph, or packed quantized blocks dequantized by
a graph expression. ``Runner`` executes a graph with a compiled plan when ``luminal.compile``
is available and with the reference interpreter otherwise, and says which.
"""

from __future__ import annotations

import ctypes
import gc
import hashlib
import json
import sys
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np

from ..functional import embedding
from ..tensor import Graph, Tensor


class WeightSource(Protocol):
    """Where a model's weights come from. A source may also have ``identity() -> str``, a
    cheap name of its contents (file identity, dequantization mode); models whose source has
    one key their compiled plans in the plan cache by it and skip building the graph on a
    hit."""

    def has(self, name: str) -> bool: ...

    def shape(self, name: str) -> tuple[int, ...]:
        """Logical (PyTorch-order) shape."""
        ...

    def get(self, g: Graph, name: str) -> Tensor:
        """The weight as a float tensor of ``shape(name)`` in graph ``g``."""
        ...

    def rows(self, g: Graph, name: str, idx: Tensor) -> Tensor:
        """``get(name)[idx]`` for a 2-D weight (an embedding lookup), dequantizing only the
        rows read."""
        ...


class DictWeights:
    """Weights held as numpy arrays (f32/f16/bf16) under canonical names; f16/bf16 enter the
    graph as stored and are cast to f32 there."""

    def __init__(self, arrays: Mapping[str, np.ndarray], prefix: str = "") -> None:
        self.arrays = dict(arrays)
        self.prefix = prefix

    def has(self, name: str) -> bool:
        return name in self.arrays

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.arrays[name].shape)

    def get(self, g: Graph, name: str) -> Tensor:
        key = self.prefix + name
        t = Tensor(g.inputs[key]) if key in g.inputs else g.weight(key, data=self.arrays[name])
        # f16/bf16 (and integer) arrays compute in f32; f64 stays f64
        return t if t.dtype.name in ("f32", "f64") else t.cast("f32")

    def rows(self, g: Graph, name: str, idx: Tensor) -> Tensor:
        return embedding(idx, self.get(g, name))

    def identity(self) -> str:
        """A digest naming these weights for the plan cache: mapped arrays by file and
        offset, others by a hash of their bytes."""
        from ..plan_cache import weight_identity

        h = hashlib.sha1(self.prefix.encode())
        for name in sorted(self.arrays):
            h.update(json.dumps([name, weight_identity(self.arrays[name])]).encode())
        return h.hexdigest()


def progress(msg: str, quiet: bool = False) -> None:
    if not quiet:
        print(msg, file=sys.stderr, flush=True)


class Runner:
    """Runs one graph many times with different dims. ``backend='compiled'`` compiles it once
    with ``luminal.compile`` (a CPU plan run by the C++ runtime); ``'interp'`` uses the
    reference interpreter; ``'auto'`` compiles when the compiler and runtime are available and
    falls back to the interpreter otherwise. ``backend`` says which one runs. A compiled
    runner lets go of its graph (``graph`` is None): the plan holds all it needs, and a graph
    with weights folded at build time would otherwise keep a second copy of them.

    ``graph`` may be a function that builds it. With ``key`` (a JSON description of what the
    function builds: model config, build options, weight identities) the compiled plan is
    looked up in the plan cache (``luminal.plan_cache``) first; on a hit the graph is never
    built, and the plan is mapped from the cache when it first runs."""

    def __init__(
        self,
        graph: Graph | Callable[[], Graph],
        backend: str = "auto",
        quiet: bool = True,
        key: dict[str, Any] | None = None,
        name: str | None = None,
    ) -> None:
        if backend not in ("auto", "compiled", "interp"):
            raise ValueError(f"unknown backend {backend!r} (auto, compiled, interp)")
        self.graph: Graph | None = graph if isinstance(graph, Graph) else None
        self._build = None if isinstance(graph, Graph) else graph
        self.name = name or (graph.name if isinstance(graph, Graph) else "graph")
        self.compiles = 0
        self.cached = False  # the plan came from the plan cache
        self.backend = "interp"
        self._plan: Any = None
        compile_fn = find_compile()
        if backend == "compiled" and compile_fn is None:
            raise RuntimeError("backend='compiled': luminal.compile is not available")
        if backend != "interp" and compile_fn is not None:
            try:
                self._plan = self._compiled(compile_fn, key, quiet)
            except ImportError as e:  # the C++ runtime is not built
                if backend == "compiled":
                    raise
                progress(f"luminal: no compiled runtime ({e}); using the interpreter", quiet)
            else:
                self.backend = "compiled"
                self.graph = None
        if self._plan is None and self.graph is None:
            self.graph = self._graph()

    def _graph(self) -> Graph:
        if self.graph is None:
            assert self._build is not None
            self.graph = self._build()
            self.name = self.graph.name
        return self.graph

    def _compiled(self, compile_fn: Callable[..., Any], key: dict[str, Any] | None,
                  quiet: bool) -> Any:  # fmt: skip
        from .. import plan_cache

        cache = plan_cache.default_cache() if key is not None else None
        if cache is None or key is None:
            graph = self._graph()
            progress(f"compiling {graph.name} ...", quiet)
            self.compiles += 1
            return compile_fn(graph)
        full = plan_cache.make_key(key, "cpu", {"search": True})
        built: list[int] = []

        def build() -> Any:
            graph = self._graph()
            progress(f"compiling {graph.name} ...", quiet)
            self.compiles += 1
            weights = dict(graph.weights)  # mapped arrays: plans refer to them in their file
            # cached here, under the model's key; not loaded: the stored file is what runs
            cg = compile_fn(graph, cache=False, load=False)
            built.append(1)
            return cg.plan, weights

        path, _ = cache.get_or_build(full, build)
        if built:
            self.graph = None  # the stored plan runs (its weights mapped from the cache)
            del _
            release_memory()
        # the plan file runs (mapped): this process holds no copy of the weights it made
        plan = CachedPlan(path)
        # a missing runtime raises ImportError here, not later; the executor (its kernels'
        # C compile) is made on first run: a plan merged into another never needs its own
        from .. import runtime  # noqa: F401

        if not built:
            progress(f"{self.name}: using the cached plan {path.name}", quiet)
            self.cached = True
        return plan

    def __call__(self, inputs: Mapping[str, Any], **dims: int) -> dict[str, np.ndarray]:
        if self._plan is not None:
            return dict(self._plan.run(dict(inputs), **dims))
        assert self.graph is not None
        return self.graph.run(inputs, **dims)


class CachedPlan:
    """A plan file from the plan cache, loaded (mapped, kernels loaded) on first use:
    ``run(inputs, **dims)`` like a ``CompiledGraph``; ``plan`` reads the file."""

    def __init__(self, path: Any) -> None:
        self.path = path
        self._executor: Any = None

    @property
    def executor(self) -> Any:
        if self._executor is None:
            from .. import runtime

            self._executor = runtime.Executor(self.path)
        return self._executor

    @property
    def plan(self) -> Any:
        from ..plan import Plan

        return Plan.load(self.path)

    def run(self, inputs: Mapping[str, Any], **dims: int) -> dict[str, np.ndarray]:
        return self.executor.run(inputs, **dims)


def release_memory() -> None:
    """Gives the memory of a finished compile back to the system. Its graphs hold reference
    cycles (collected now, not at some later collection), and glibc keeps freed heap pages
    (the compile's arrays, SmolLM2's prefill: ~0.4 GB) mapped unless asked to trim them; the
    plan that runs is mapped from the plan cache, so none of it is needed."""
    gc.collect()
    if not sys.platform.startswith("linux"):
        return
    try:
        trim = ctypes.CDLL(None).malloc_trim  # glibc; other C libraries have no such call
    except (OSError, AttributeError):
        return
    trim(0)


def find_compile() -> Callable[[Graph], Any] | None:
    """``luminal.compile`` when the compiler exists (it may still lack a built runtime)."""
    import luminal

    fn = getattr(luminal, "compile", None)
    return fn if callable(fn) else None
