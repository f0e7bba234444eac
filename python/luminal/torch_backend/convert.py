"""ATen FX graph -> luminal graph: the converter tables, what a converter reads (``Ctx``),
helpers the converter modules share, and ``convert_call``, which runs one node's converter.

The table is keyed by OpOverload objects (``torch.ops.aten.add.Tensor``), never by printed
names. A converter gets the node's arguments with FX nodes replaced by luminal values (Tensor,
or a sint for symbolic ints) and returns a luminal value; the result is cast to the dtype that
torch's fake tensor reports, and its shape is checked against it. A converter raises
``Unsupported`` for argument combinations it does not handle; the node then runs in eager.

The converters live in one module a topic, each registering its own with ``op`` when imported
(the package's ``__init__`` imports them all):

- ``convert_elementwise``: arithmetic, comparisons, activations, special functions, float bits
- ``convert_reduce``: reductions, softmax, scans, sorting and order statistics, searching
  sorted sequences, histograms, segment reductions
- ``convert_views``: casts and copies, views, concatenation and splits, windows, creation
- ``convert_index``: indexing, gathers, scatters and index writes
- ``convert_linalg``: matrix products, distances, factorizations and solves
- ``convert_conv``: convolution, pooling and resampling
- ``convert_nn``: normalizations, attention, losses, embedding bags
- ``convert_complex``: complex values as real pairs, and the FFTs (the ``COMPLEX`` table)
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from .. import functional as F
from ..graph import dtypes as dt
from ..tensor import Graph, Tensor
from .symbols import Dims, Unsupported

Converter = Callable[..., Any]
TABLE: dict[Any, Converter] = {}
# converters of other libraries' custom ops, by the op's name ("namespace.op.overload"): the
# library registers its op when it is imported, which may be after luminal
NAMED: dict[str, Converter] = {}
# converters of nodes that read or make complex values (held as real pairs: convert_complex.py)
COMPLEX: dict[Any, Converter] = {}
# the real dtype of each complex dtype's parts
PARTS = {torch.complex64: dt.f32, torch.complex128: dt.f64, torch.complex32: dt.f16}


def _registrar(table: dict[Any, Converter], targets: tuple[Any, ...]
               ) -> Callable[[Converter], Converter]:  # fmt: skip
    def register(fn: Converter) -> Converter:
        for t in targets:
            table[t] = fn
        return fn

    return register


def op(*targets: Any) -> Callable[[Converter], Converter]:
    return _registrar(TABLE, targets)


def named_op(*names: str) -> Callable[[Converter], Converter]:
    return _registrar(NAMED, names)


def complex_op(*targets: Any) -> Callable[[Converter], Converter]:
    return _registrar(COMPLEX, targets)


def _is_complex(v: Any) -> bool:
    if isinstance(v, (tuple, list)):
        return any(map(_is_complex, v))
    return isinstance(v, torch.Tensor) and v.is_complex()


def touches_complex(node: Any) -> bool:
    """Whether FX ``node`` reads or makes a complex tensor."""
    return node is not None and (
        _is_complex(node.meta.get("val"))
        or any(_is_complex(a.meta.get("val")) for a in node.all_input_nodes)
    )


class Ctx:
    """What a converter may read besides its arguments: the graph, dims, the node's fake value."""

    def __init__(self, graph: Graph, dims: Dims) -> None:
        self.g = graph
        self.dims = dims
        self.val: Any = None  # node.meta["val"] of the node being converted
        self.node: Any = None  # that FX node (a converter may look at its users)
        self.values: dict[Any, Any] = {}  # FX node -> its converted value, so far
        # id of the tensor a written graph input is read as -> that 1-D input (see partition)
        self.flat_inputs: dict[int, Tensor] = {}
        # id of a SCATTER node into such an input -> (that input's node, the layout read back)
        self.flat_writes: dict[int, tuple[Any, Any]] = {}

    def shape(self, k: int | None = None) -> tuple[Any, ...]:
        v = self.val if k is None else self.val[k]
        return self.dims.shape(v)

    @property
    def dtype(self) -> dt.DType:
        return dt.to_dtype(self.val.dtype)


def supported_targets() -> list[str]:
    """Names of the converted overloads (for docs and debugging)."""
    return sorted(str(t) for t in TABLE)


# ----------------------------------------------------------------------------- shared helpers
def need_tensor(x: Any, what: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise Unsupported(f"{what} must be a tensor, got {type(x).__name__}")
    return x


def output_used(cx: Ctx, k: int) -> bool:
    """Whether output ``k`` of the node being converted is read (a user that is not a
    ``getitem`` reads them all)."""
    users = cx.node.users if cx.node is not None else {}
    return any(not (u.target is operator.getitem and u.args[1] != k) for u in users)


def empty_output(cx: Ctx, k: int) -> Tensor:
    """Zeros in the shape and dtype of output ``k`` (an output nothing computes)."""
    return F.full(cx.g, cx.shape(k), 0, dtype=dt.to_dtype(cx.val[k].dtype))


def static_shape(x: Tensor, what: str) -> tuple[int, ...]:
    if not all(isinstance(s, int) for s in x.shape):
        raise Unsupported(f"{what} of a symbolic shape {x.shape}")
    return tuple(int(s) for s in x.shape)  # type: ignore[arg-type]


def constant(cx: Ctx, data: np.ndarray) -> Tensor:
    return cx.g.tensor(np.ascontiguousarray(data))


# ----------------------------------------------------------------------------- structure
@op(operator.getitem)
def _getitem(cx: Ctx, seq: Any, k: int) -> Any:
    if not isinstance(seq, (tuple, list)):
        raise Unsupported("getitem of a non-sequence")
    v = seq[k]
    if v is None:
        raise Unsupported(f"output {k} of a multi-output op (only used in training)")
    return v


def convert_call(cx: Ctx, target: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """Convert one call; the result matches the fake value's dtype and rank."""
    is_complex = touches_complex(cx.node)
    fn = (COMPLEX if is_complex else TABLE).get(target)
    if fn is None and not is_complex:
        fn = NAMED.get(str(target))
    if fn is None:
        raise Unsupported("complex values" if is_complex and target in TABLE else "no converter")
    v = cx.val
    if isinstance(v, torch.Tensor) and all(isinstance(s, int) for s in v.shape) and not v.numel() \
            and not v.is_complex():  # fmt: skip
        return F.full(cx.g, cx.shape(), 0, dtype=cx.dtype)  # an empty result computes nothing
    try:
        out = fn(cx, *args, **kwargs)
    except Unsupported:
        raise
    except Exception as e:  # a converter that cannot build this node: eager runs it correctly
        raise Unsupported(f"{type(e).__name__}: {_short(e)}") from e
    return _match(cx, out, cx.val)


def _short(e: Exception, n: int = 160) -> str:
    s = str(e).splitlines()[0] if str(e) else ""
    return s if len(s) <= n else s[: n - 3] + "..."


def _match(cx: Ctx, out: Any, val: Any) -> Any:
    if isinstance(val, (tuple, list)) and isinstance(out, (tuple, list)):
        if len(val) != len(out):
            raise Unsupported("converter returned the wrong number of outputs")
        return tuple(None if o is None else _match(cx, o, v) for o, v in zip(out, val, strict=True))
    if not isinstance(val, torch.Tensor):
        return out
    if not isinstance(out, Tensor):
        raise Unsupported(f"converter returned {type(out).__name__} for a tensor")
    want = cx.dims.shape(val)
    if val.is_complex():  # real pairs (convert_complex.py)
        want = (*want, 2)
    if len(want) != out.ndim or any(
        isinstance(a, int) and isinstance(b, int) and a != b
        for a, b in zip(want, out.shape, strict=True)
    ):
        # a mismatch is a converter bug; eager is right, so never return this value
        raise Unsupported(f"converted shape {out.shape} differs from torch's {tuple(val.shape)}")
    if val.is_complex():
        if val.dtype not in PARTS:
            raise Unsupported(f"dtype {val.dtype}")
        return out.cast(PARTS[val.dtype])
    return out.cast(dt.to_dtype(val.dtype))
