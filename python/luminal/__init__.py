"""luminal: an ahead-of-time inference compiler.

Record a model as a static graph of 15 primitive ops over symbolically shaped tensors,
compile it to a plan, run the plan with the C++ runtime. See README.md and DESIGN.md.
"""

from . import functional as _functional  # noqa: F401  (registers Tensor's methods)
from ._version import __version__
from .compile import CompiledGraph, compile
from .graph.dtypes import (
    DType,
    bf16,
    bool_,
    e8m0,
    f8e4m3,
    f8e5m2,
    f16,
    f32,
    f64,
    fp4e2m1,
    i4,
    i8,
    i32,
    i64,
    u4,
    u8,
)
from .graph.ops import Leaf, Op
from .graph.symbolic import Expr, dim
from .metal import status as metal_status  # noqa: F401  (cheap: imports no compiler)
from .tensor import Graph, Tensor


def cuda_status() -> str:
    """Whether CUDA plans can run here (and on which GPU), or why not; and NVRTC's state."""
    from . import cuda

    return cuda.status()


def grad(loss, wrt):
    """Gradients of the scalar ``loss`` with respect to the tensors ``wrt`` (a graph pass:
    the result is part of the same graph; see ``luminal.train`` and docs/autograd.md)."""
    from .train import grad as _grad

    return _grad(loss, wrt)


def __getattr__(name: str):
    # training modules load on first use: importing luminal stays fast for inference
    if name in ("optim", "train", "targets"):
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'luminal' has no attribute {name!r}")


def load(path, backend: str = "cpu"):
    """Load a saved plan for running (``luminal.runtime.Executor``)."""
    from . import runtime

    return runtime.load(path, backend)


__all__ = [
    "CompiledGraph", "DType", "Expr", "Graph", "compile", "cuda_status", "grad", "load", "Leaf",
    "Op",
    "Tensor", "dim",
    "__version__",
    "bf16", "bool_", "e8m0", "f8e4m3", "f8e5m2", "f16", "f32", "f64", "fp4e2m1",
    "i4", "i8", "i32", "i64", "u4", "u8",
]  # fmt: skip
