"""luminal: an ahead-of-time inference compiler.

Record a model as a static graph of 15 primitive ops over symbolically shaped tensors,
compile it to a plan, run the plan with the C++ runtime. See README.md and DESIGN.md.
"""

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
from .tensor import Graph, Tensor


def cuda_status() -> str:
    """Whether CUDA plans can run here (and on which GPU), or why not; and NVRTC's state."""
    from . import cuda

    return cuda.status()


def load(path, backend: str = "cpu"):
    """Load a saved plan for running (``luminal.runtime.Executor``)."""
    from . import runtime

    return runtime.load(path, backend)


__version__ = "0.1.0"

__all__ = [
    "CompiledGraph", "DType", "Expr", "Graph", "compile", "cuda_status", "load", "Leaf", "Op",
    "Tensor", "dim",
    "__version__",
    "bf16", "bool_", "e8m0", "f8e4m3", "f8e5m2", "f16", "f32", "f64", "fp4e2m1",
    "i4", "i8", "i32", "i64", "u4", "u8",
]  # fmt: skip
