"""One partition call without per-call Python work that can be done once.

When a partition's plan is built, ``Call`` works out which argument feeds each plan input, how
each tensor crosses to the runtime (a numpy view of the torch memory: no copy), which dims
the plan takes and in which order, and how the weights are checked. A call then does only
what depends on the arguments: a view per input, an array per output (new memory: torch owns
it afterwards), the native run, and ``torch.from_numpy`` per output.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import ml_dtypes
import numpy as np
import torch

from ..plan import Role

_is = operator.is_
_version = operator.attrgetter("_version")
_data_ptr = torch.Tensor.data_ptr
_numpy = torch.Tensor.numpy
_contiguous = torch.Tensor.is_contiguous

# numpy has no such dtype: the bits cross as integers of the same width
_BITS_VIEWED = {torch.bfloat16: torch.int16, torch.float8_e4m3fn: torch.uint8,
                torch.float8_e5m2: torch.uint8}  # fmt: skip
_ML_DTYPES = {torch.bfloat16: ml_dtypes.bfloat16, torch.float8_e4m3fn: ml_dtypes.float8_e4m3fn,
              torch.float8_e5m2: ml_dtypes.float8_e5m2}  # fmt: skip


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A numpy array over ``t``'s memory (bf16/fp8 as integers of the same width)."""
    ints = _BITS_VIEWED.get(t.dtype)
    if ints is not None:
        t = t.view(ints)
    if not (t.requires_grad or t.is_conj() or t.is_neg()):
        return t.numpy()  # the common case: shares memory, no new tensor
    return t.detach().resolve_conj().resolve_neg().numpy()


def plan_array(t: torch.Tensor) -> np.ndarray:
    """A numpy array over ``t``'s memory in the dtype luminal's runtime checks (ml_dtypes' for
    bf16 / fp8)."""
    a = to_numpy(t)
    return a.view(_ML_DTYPES[t.dtype]) if t.dtype in _ML_DTYPES else a


def weight_array(t: torch.Tensor) -> np.ndarray:
    a = plan_array(t)
    return a if a.flags.c_contiguous else a.copy()  # ascontiguousarray makes 0-d 1-d


def to_torch(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """``a`` as a torch tensor of ``dtype`` over the same memory."""
    if dtype in _BITS_VIEWED:
        return torch.from_numpy(a.view(_np_bits(a.dtype))).view(dtype)
    return torch.from_numpy(a)  # shares the plan's output array: no copy


def _np_bits(dtype: np.dtype) -> np.dtype:
    """The integer dtype that carries the bits of a dtype numpy lacks (ml_dtypes' bf16, fp8)."""
    return np.dtype(np.int16) if dtype.itemsize == 2 else np.dtype(np.uint8)


def _scalar(x: Any) -> np.ndarray:
    return np.asarray(float(x), np.float32)


def _input_converter(dtype: torch.dtype) -> Callable[[torch.Tensor], np.ndarray]:
    return to_numpy if dtype in _BITS_VIEWED else _numpy  # the method itself: no Python frame


class Call:
    """A compiled partition's run, prepared once (see ``prepare``)."""

    __slots__ = ("rt", "native_shapes", "dim_names", "inputs", "order", "is_out", "shapes",
                 "out_dtypes", "in_place", "wget", "ws", "versions", "ptrs")  # fmt: skip

    def __init__(self, executor: Any, inputs: Sequence[tuple[int, str]],
                 scalars: Sequence[tuple[int, str]], weights: Sequence[tuple[int, torch.Tensor]],
                 in_dtypes: dict[int, torch.dtype]) -> None:  # fmt: skip
        ios = executor.io  # the runtime's per-buffer facts, in the native run's array order
        where = {name: k for k, name in inputs}
        scalar_at = {name: k for k, name in scalars}
        self.rt: Callable[[tuple[int, ...], list[np.ndarray]], None] = executor.native_run
        self.native_shapes: Callable[[list[int]], list[tuple[int, ...]]] = executor.native_shapes
        self.dim_names = tuple(executor.dims)  # the native run takes dims in plan order
        self.inputs: list[tuple[int, Callable[[Any], np.ndarray]]] = []
        order: list[int] = []
        self.out_dtypes: list[np.dtype] = []
        n_in = sum(io.role == Role.input for io in ios)
        in_pos: dict[str, int] = {}
        for io in ios:
            if io.role == Role.input:
                if io.name in where:
                    k = where[io.name]
                    self.inputs.append((k, _input_converter(in_dtypes[k])))
                else:
                    self.inputs.append((scalar_at[io.name], _scalar))
                in_pos[io.name] = len(self.inputs) - 1
                order.append(len(self.inputs) - 1)
        for io in ios:
            if io.role == Role.input:
                continue
            if io.updates is not None:  # written through the input's own array
                order.insert(ios.index(io), in_pos[io.updates])
            else:
                order.insert(ios.index(io), n_in + len(self.out_dtypes))
                self.out_dtypes.append(_np_bits(io.np_dtype) if io.raw else io.np_dtype)
        self.is_out = [io.role != Role.input and io.updates is None for io in ios]
        updated = [where[io.updates] for io in ios if io.updates is not None]
        # the kernels write these arguments' memory: a copy on the way in would lose the write
        self.in_place = operator.itemgetter(*updated) if len(updated) > 1 else (
            (lambda args, k=updated[0]: (args[k],)) if updated else None)  # fmt: skip
        # None: inputs come first, the arrays need no reordering
        self.order = None if order == list(range(len(ios))) else order
        self.shapes: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
        self.ws = tuple(t for _, t in weights)
        positions = tuple(k for k, _ in weights)
        self.wget: Callable[[Sequence[Any]], tuple[Any, ...]] | None = None
        if len(positions) > 1:
            self.wget = operator.itemgetter(*positions)
        elif positions:
            k0 = positions[0]
            self.wget = lambda args: (args[k0],)
        try:
            self.versions: list[int] | None = list(map(_version, self.ws))
        except RuntimeError:  # inference tensors have no version counter: nothing to compare
            self.versions = None
        self.ptrs = list(map(_data_ptr, self.ws))

    def weights_same(self, args: Sequence[Any]) -> bool:
        """The weight arguments are the tensors the plan was built from, unchanged: the same
        objects, memory and version counters (an in-place change bumps the counter)."""
        wget = self.wget
        if wget is None:
            return True
        ws = wget(args)
        if not all(map(_is, ws, self.ws)) or list(map(_data_ptr, ws)) != self.ptrs:
            return False
        return self.versions is None or list(map(_version, ws)) == self.versions

    def out_shapes(self, vals: tuple[int, ...]) -> list[tuple[int, ...]]:
        shapes = self.shapes.get(vals)
        if shapes is None:
            every = self.native_shapes(list(vals))
            shapes = [s for s, out in zip(every, self.is_out, strict=True) if out]
            if len(self.shapes) >= 256:  # dims of many sizes: keep the table small
                self.shapes.clear()
            self.shapes[vals] = shapes
        return shapes

    def run(self, args: Sequence[Any], dims: dict[str, int]) -> list[np.ndarray]:
        """Run the plan on ``args``; the output arrays in plan order. The native run's errors
        (a dim out of range, an array too small) propagate."""
        vals = tuple(map(dims.__getitem__, self.dim_names))
        shapes = self.shapes.get(vals) or self.out_shapes(vals)
        try:
            arrays = [conv(args[k]) for k, conv in self.inputs]
        except RuntimeError:  # an input that requires grad, or has a lazy conj/neg bit
            arrays = [to_numpy(args[k]) if conv is _numpy else conv(args[k])
                      for k, conv in self.inputs]  # fmt: skip
        if self.in_place is not None and not all(map(_contiguous, self.in_place(args))):
            raise ValueError("a tensor the plan updates in place is not contiguous")
        outs = list(map(np.empty, shapes, self.out_dtypes))
        arrays += outs
        if self.order is not None:
            arrays = [arrays[j] for j in self.order]
        self.rt(vals, arrays)
        return outs


def prepare(executor: Any, inputs: Sequence[tuple[int, str]], scalars: Sequence[tuple[int, str]],
            weights: Sequence[tuple[int, torch.Tensor]],
            in_dtypes: dict[int, torch.dtype]) -> Call | None:  # fmt: skip
    """The prepared run of ``executor``'s plan, or None when the plan needs what only the
    general path does (4-bit packed buffers)."""
    if any(io.packed for io in executor.io):
        return None
    return Call(executor, inputs, scalars, weights, in_dtypes)
