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
    """Runs one graph many times with different dims: compiled once when the compiler exists
    (``backend='compiled'`` or ``'auto'``), else the reference interpreter."""

    def __init__(self, graph: Graph, backend: str = "auto", quiet: bool = True) -> None:
        self.graph = graph
        self.compiles = 0
        self._run: Callable[[Mapping[str, Any], Mapping[str, int]], dict[str, np.ndarray]]
        compile_fn = _find_compile()
        if backend == "compiled" and compile_fn is None:
            raise RuntimeError("backend='compiled' asked for, but luminal.compile is not available")
        if backend in ("compiled", "auto") and compile_fn is not None:
            progress(f"compiling {graph.name} ...", quiet)
            plan = compile_fn(graph)
            self.compiles += 1
            self.backend = "compiled"
            self._run = lambda inputs, dims: dict(plan.run(dict(inputs), **dims))
        elif backend in ("interp", "auto"):
            self.backend = "interp"
            self._run = lambda inputs, dims: graph.run(inputs, **dims)
        else:
            raise ValueError(f"unknown backend {backend!r} (auto, compiled, interp)")

    def __call__(self, inputs: Mapping[str, Any], **dims: int) -> dict[str, np.ndarray]:
        return self._run(inputs, dims)


def _find_compile() -> Callable[[Graph], Any] | None:
    import luminal

    fn = getattr(luminal, "compile", None)
    if fn is not None:
        return fn  # type: ignore[no-any-return]
    try:
        from luminal import compile as mod  # type: ignore[attr-defined]
    except ImportError:
        return None
    return getattr(mod, "compile", None)
