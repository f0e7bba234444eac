"""One partition call without per-call Python work that can be done once.

When a partition's plan is built, ``Call`` works out which argument feeds each plan input, which
dims the plan takes and in which order, and how the weights are checked. A call then does only
what depends on the arguments: the weight check, one address per input tensor (no numpy view:
``Tensor.numpy()`` costs ten times ``data_ptr()``), a new tensor per output (numpy's allocation
wrapped by ``torch.from_numpy``: cheaper than ``torch.empty``), and one native run over the
addresses.
"""

from __future__ import annotations

import math
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
_contiguous = torch.Tensor.is_contiguous
_from_numpy = torch.from_numpy

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
    """``a`` as a torch tensor of ``dtype`` over the same memory (a complex dtype from its
    real pairs)."""
    if dtype.is_complex:
        return complex_of(torch.from_numpy(a), dtype)
    if dtype in _BITS_VIEWED:
        return torch.from_numpy(a.view(_np_bits(a.dtype))).view(dtype)
    return torch.from_numpy(a)  # shares the plan's output array: no copy


def complex_of(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The complex tensor whose real pairs ``t`` holds (its last axis), over the same memory."""
    if not t.numel():  # numpy's empty arrays may carry strides view_as_complex refuses
        return torch.empty(t.shape[:-1], dtype=dtype)
    return torch.view_as_complex(t)


def _np_bits(dtype: np.dtype) -> np.dtype:
    """The integer dtype that carries the bits of a dtype numpy lacks (ml_dtypes' bf16, fp8)."""
    return np.dtype(np.int16) if dtype.itemsize == 2 else np.dtype(np.uint8)


def _scalar(x: Any) -> torch.Tensor:
    return torch.tensor(float(x), dtype=torch.float32)


def _getter(positions: Sequence[int]) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    """``args`` -> the tuple of these positions' arguments (itemgetter's, also for one)."""
    if len(positions) == 1:
        k0 = positions[0]
        return lambda args: (args[k0],)
    return operator.itemgetter(*positions) if positions else (lambda args: ())


class Call:
    """A compiled partition's run, prepared once (see ``prepare``)."""

    __slots__ = ("rt", "native_shapes", "dim_names", "in_get", "scalar_slots", "in_place_slots",
                 "in_sizes", "order", "is_out", "shapes", "out_np", "out_viewed", "wget", "ws",
                 "versions", "ptrs")  # fmt: skip

    def __init__(self, executor: Any, inputs: Sequence[tuple[int, str]],
                 scalars: Sequence[tuple[int, str]],
                 weights: Sequence[tuple[int, torch.Tensor]]) -> None:  # fmt: skip
        ios = executor.io  # the runtime's per-buffer facts, in the native run's order
        where = {name: k for k, name in inputs}
        scalar_at = {name: k for k, name in scalars}
        self.rt: Callable[[tuple[int, ...], list[int]], None] = executor.native_run_addresses
        self.native_shapes: Callable[[list[int]], list[tuple[int, ...]]] = executor.native_shapes
        self.dim_names = tuple(executor.dims)  # the native run takes dims in plan order
        positions: list[int] = []
        self.scalar_slots: list[int] = []  # run-time floats: no tensor of their own
        order: list[int] = []
        in_pos: dict[str, int] = {}
        # bytes per element of each input, in input order (checked once per dims)
        self.in_sizes: list[tuple[int, int]] = []  # (io index, itemsize)
        for j, io in enumerate(ios):
            if io.role == Role.input:
                if io.name in where:
                    positions.append(where[io.name])
                else:
                    self.scalar_slots.append(len(positions))
                    positions.append(scalar_at[io.name])
                in_pos[io.name] = len(positions) - 1
                order.append(len(positions) - 1)
                self.in_sizes.append((j, io.np_dtype.itemsize))
        n_in = len(positions)
        self.in_get = _getter(positions)
        self.out_np: list[np.dtype] = []
        self.out_viewed: list[tuple[int, torch.dtype]] = []  # outputs numpy cannot type
        for io in ios:
            if io.role == Role.input:
                continue
            if io.updates is not None:  # written through the input's own memory
                order.insert(ios.index(io), in_pos[io.updates])
            else:
                order.insert(ios.index(io), n_in + len(self.out_np))
                if io.raw:  # bf16 / fp8: the bits, typed by torch
                    self.out_viewed.append((len(self.out_np), _torch_dtype(io.np_dtype)))
                self.out_np.append(_np_bits(io.np_dtype) if io.raw else io.np_dtype)
        self.is_out = [io.role != Role.input and io.updates is None for io in ios]
        # the kernels write these inputs' memory: a copy on the way in would lose the write
        self.in_place_slots = {in_pos[io.updates] for io in ios if io.updates is not None}
        # None: inputs come first, the addresses need no reordering
        self.order = None if order == list(range(len(ios))) else order
        self.shapes: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
        self.ws = tuple(t for _, t in weights)
        positions = [k for k, _ in weights]
        self.wget = _getter(positions) if positions else None
        try:
            self.versions: list[int] | None = list(map(_version, self.ws))
        except RuntimeError:  # inference tensors have no version counter: nothing to compare
            self.versions = None
        self.ptrs = list(map(_data_ptr, self.ws))

    def out_shapes(self, vals: tuple[int, ...], ins: Sequence[Any]) -> list[tuple[int, ...]]:
        """The output shapes for these dim values, after checking that the inputs hold the
        bytes the plan reads at them (once per dim values: dynamo's guards and the graph's
        fake tensors fix the shapes of the tensors a partition is called with)."""
        every = self.native_shapes(list(vals))
        for t, (j, itemsize) in zip(ins, self.in_sizes, strict=True):
            if not isinstance(t, torch.Tensor):
                continue
            want = math.prod(every[j])
            if t.numel() != want or t.element_size() != itemsize or t.is_neg() or t.is_conj():
                raise ValueError(f"a partition input has shape {tuple(t.shape)} and dtype "
                                 f"{t.dtype}; the plan reads {want} elements of {itemsize} "
                                 "bytes")  # fmt: skip
        shapes = [s for s, out in zip(every, self.is_out, strict=True) if out]
        if len(self.shapes) >= 256:  # dims of many sizes: keep the table small
            self.shapes.clear()
        self.shapes[vals] = shapes
        return shapes

    def run(self, args: Sequence[Any], dims: dict[str, int]) -> list[torch.Tensor] | None:
        """Run the plan on ``args``: the output tensors in plan order, or None (nothing run)
        when the weight arguments are not the tensors the plan was built from, unchanged (the
        same objects, memory and version counters: an in-place change bumps the counter).
        The native run's errors (a dim out of range) propagate."""
        wget = self.wget
        if wget is not None:
            ws = wget(args)
            if (
                not all(map(_is, ws, self.ws))
                or list(map(_data_ptr, ws)) != self.ptrs
                or (self.versions is not None and list(map(_version, ws)) != self.versions)
            ):
                return None
        vals = tuple(map(dims.__getitem__, self.dim_names))
        ins = self.in_get(args)
        if self.scalar_slots:
            ins = self._with_scalars(ins)
        shapes = self.shapes.get(vals)
        if shapes is None:
            shapes = self.out_shapes(vals, ins)
        if not all(map(_contiguous, ins)):
            ins = self._contiguous(ins)
        outs = list(map(_from_numpy, map(np.empty, shapes, self.out_np)))
        addresses = list(map(_data_ptr, ins))
        addresses += map(_data_ptr, outs)
        if self.order is not None:
            addresses = [addresses[j] for j in self.order]
        self.rt(vals, addresses)  # ``ins`` and ``outs`` hold the memory until it returns
        for j, dtype in self.out_viewed:
            outs[j] = outs[j].view(dtype)
        return outs

    def _with_scalars(self, ins: tuple[Any, ...]) -> tuple[Any, ...]:
        got = list(ins)
        for j in self.scalar_slots:
            got[j] = _scalar(got[j])
        return tuple(got)

    def _contiguous(self, ins: tuple[Any, ...]) -> tuple[Any, ...]:
        """Dense copies of strided inputs (the plan reads row-major memory)."""
        got = list(ins)
        for j, t in enumerate(ins):
            if not t.is_contiguous():
                if j in self.in_place_slots:
                    raise ValueError("a tensor the plan updates in place is not contiguous")
                got[j] = t.contiguous()
        return tuple(got)


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    return next(t for t, m in _ML_DTYPES.items() if np.dtype(m) == dtype)


def prepare(executor: Any, inputs: Sequence[tuple[int, str]], scalars: Sequence[tuple[int, str]],
            weights: Sequence[tuple[int, torch.Tensor]]) -> Call | None:  # fmt: skip
    """The prepared run of ``executor``'s plan, or None when the plan needs what only the
    general path does (4-bit packed buffers)."""
    if any(io.packed for io in executor.io):
        return None
    return Call(executor, inputs, scalars, weights)
