"""What every model shares: where weights come from, and how a built graph is run.

A model definition asks a ``WeightSource`` for tensors by canonical name (GGUF names:
``blk.0.attn_q.weight``); the source decides whether a weight enters the graph as an f32
array, a mapped f16/bf16 array cast in the graph, or packed quantized blocks dequantized by
a graph expression. ``Runner`` executes a graph with a compiled plan when ``luminal.compile``
is available and with the reference interpreter otherwise, and says which.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np

from ..functional import embedding
from ..tensor import Graph, Tensor


class WeightSource(Protocol):
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
    """Weights held as numpy arrays (f32/f16/bf16) under canonical names."""

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
        return t if t.dtype.name in ("f32", "f64") else t.float()

    def rows(self, g: Graph, name: str, idx: Tensor) -> Tensor:
        return embedding(idx, self.get(g, name))


def progress(msg: str, quiet: bool = False) -> None:
    if not quiet:
        print(msg, file=sys.stderr, flush=True)


class Runner:
    """Runs one graph many times with different dims. ``backend='compiled'`` compiles it once
    with ``luminal.compile`` (a CPU plan run by the C++ runtime); ``'interp'`` uses the
    reference interpreter; ``'auto'`` compiles when the compiler and runtime are available and
    falls back to the interpreter otherwise. ``backend`` says which one runs. A compiled
    runner lets go of its graph (``graph`` is None): the plan holds all it needs, and a graph
    with weights folded at build time would otherwise keep a second copy of them."""

    def __init__(self, graph: Graph, backend: str = "auto", quiet: bool = True) -> None:
        if backend not in ("auto", "compiled", "interp"):
            raise ValueError(f"unknown backend {backend!r} (auto, compiled, interp)")
        self.graph: Graph | None = graph
        self.compiles = 0
        self.backend = "interp"
        self._plan: Any = None
        compile_fn = find_compile()
        if backend == "compiled" and compile_fn is None:
            raise RuntimeError("backend='compiled': luminal.compile is not available")
        if backend != "interp" and compile_fn is not None:
            progress(f"compiling {graph.name} ...", quiet)
            try:
                self._plan = compile_fn(graph)
            except ImportError as e:  # the C++ runtime is not built
                if backend == "compiled":
                    raise
                progress(f"luminal: no compiled runtime ({e}); using the interpreter", quiet)
            else:
                self.compiles += 1
                self.backend = "compiled"
                self.graph = None

    def __call__(self, inputs: Mapping[str, Any], **dims: int) -> dict[str, np.ndarray]:
        if self._plan is not None:
            return dict(self._plan.run(dict(inputs), **dims))
        assert self.graph is not None
        return self.graph.run(inputs, **dims)


def find_compile() -> Callable[[Graph], Any] | None:
    """``luminal.compile`` when the compiler exists (it may still lack a built runtime)."""
    import luminal

    fn = getattr(luminal, "compile", None)
    return fn if callable(fn) else None
