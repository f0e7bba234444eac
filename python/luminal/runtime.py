"""Running plans from Python: a checked, documented front of the native runtime ``luminal._rt``.

    ex = luminal.runtime.load("model.lmp")          # kernels compiled once (cached on disk)
    out = ex.run({"x": x}, seq=7)                  # dict of output arrays

Inputs that are C-contiguous with the right dtype are used in place; outputs are new arrays
written directly by the kernels, or the caller's own (``ex.run(inputs, out={"y": y})``). Dims
not given are taken from inputs whose shape entry is a bare dim. The GIL is released while the
plan runs.

An output that updates an input in place (``Graph.output(name, t, updates=input)``, a KV
cache) is not a new array: the kernels write the caller's input array, which must be a
writable, C-contiguous numpy array of the plan's dtype, and ``run`` returns that same array
under the output's name.
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import ml_dtypes
import numpy as np
import scipy_openblas32  # noqa: F401  (loads OpenBLAS with RTLD_GLOBAL before _rt needs it)

from . import _rt, flags
from .plan import DType, InlineWeight, Plan, PlanError, Role, pack_nibbles, unpack_nibbles

__all__ = ["Executor", "IOInfo", "PlanError", "backends", "load", "luminal_run_path",
           "numpy_dtype"]  # fmt: skip

_NUMPY: dict[DType, Any] = {
    DType.f32: np.float32,
    DType.f16: np.float16,
    DType.bf16: ml_dtypes.bfloat16,
    DType.f64: np.float64,
    DType.i32: np.int32,
    DType.i64: np.int64,
    DType.bool: np.bool_,
    DType.i8: np.int8,
    DType.u8: np.uint8,
    DType.f8e4m3: ml_dtypes.float8_e4m3fn,
    DType.f8e5m2: ml_dtypes.float8_e5m2,
    DType.e8m0: ml_dtypes.float8_e8m0fnu,
    DType.fp4e2m1: ml_dtypes.float4_e2m1fn,
    DType.i4: ml_dtypes.int4,
    DType.u4: ml_dtypes.uint4,
}


def numpy_dtype(dtype: DType | str | int) -> np.dtype[Any]:
    """The numpy (or ml_dtypes) dtype that carries a plan dtype in Python."""
    return np.dtype(_NUMPY[DType.of(dtype)])


def backends() -> list[str]:
    """Names of the backends this build of luminal can run."""
    return list(_rt.backends())


_PROFILED: list[Executor] = []


@atexit.register
def _print_profiles() -> None:
    for ex in _PROFILED:
        if any(calls for _, calls in ex._ex.profile()):
            print(f"[luminal] per-step time:\n{ex.profile_table()}", file=sys.stderr)


def luminal_run_path() -> Path:
    """Path of the ``luminal-run`` program (runs a plan on .npy files without Python)."""
    # the package's folders (an editable install has two: sources and built files)
    for d in sys.modules[__package__ or "luminal"].__path__:
        p = Path(d) / "bin" / "luminal-run"
        if p.is_file():
            return p
    raise FileNotFoundError("luminal-run is not installed with this luminal package")


class _IO:
    """What run() needs to know about one input or output, computed once: ``name``, ``role``,
    plan ``dtype``, ``np_dtype``, ``bare`` (axis, dim index) pairs, ``raw`` (crosses as bytes:
    bf16 / fp8), ``packed`` (4-bit) and ``updates`` (the input an output is written into)."""

    __slots__ = ("name", "role", "dtype", "np_dtype", "bare", "raw", "packed", "updates")

    def __init__(self, name: str, role: int, dtype: int, bare: list[int]) -> None:
        self.name = name
        self.updates: str | None = None  # output: the input it is written into in place
        self.role = Role(role)
        self.dtype = DType(dtype)
        self.np_dtype = numpy_dtype(self.dtype)
        self.bare = [(axis, d) for axis, d in enumerate(bare) if d >= 0]
        self.packed = self.dtype.bits == 4  # ml_dtypes keeps one 4-bit value per byte
        # DLPack and the buffer protocol know no bf16/fp8: those cross as raw bytes.
        self.raw = self.np_dtype.kind == "V"


IOInfo = _IO  # the public name of an entry of ``Executor.io``


def _share_inline_weights(plan: Plan, loaded: Any) -> None:
    """Point ``plan``'s inline weights at the bytes ``loaded`` (the runtime's parsed copy)
    holds, dropping the plan's own arrays (the runtime copies a plan's bytes when it loads
    it; without this a compiled model would hold every weight twice)."""
    for i, wt in enumerate(plan.weights):
        if isinstance(wt, InlineWeight):
            view = loaded.weight_view(i)
            if view is not None:
                wt.data = view


class Executor:
    """A plan loaded on a backend, ready to run many times with different dims.

    ``plan`` is a path to a ``.lmp`` file, plan bytes, or a :class:`luminal.plan.Plan`. A Plan
    object's inline weights become read-only views of the runtime's copy of them (the same
    bytes), so a compiled model holds its weights once.
    External weight files resolve against the plan file's folder, or ``base_dir`` for bytes
    and Plan objects. Raises :class:`luminal.plan.PlanError` for a bad plan and RuntimeError
    when kernels cannot be built (the message holds the compiler's log).
    """

    def __init__(
        self,
        plan: str | os.PathLike[str] | bytes | Plan,
        backend: str = "cpu",
        *,
        base_dir: str | os.PathLike[str] = ".",
    ) -> None:
        if isinstance(plan, Plan):
            self._plan = _rt.Plan.from_parts(plan.parts(), os.fspath(base_dir))
            _share_inline_weights(plan, self._plan)
        elif isinstance(plan, (bytes, bytearray, memoryview)):
            self._plan = _rt.Plan.from_bytes(bytes(plan), os.fspath(base_dir))
        elif isinstance(plan, (str, os.PathLike)):
            self._plan = _rt.Plan.load(os.fspath(plan))
        else:
            raise TypeError(f"plan must be a path, bytes or a luminal.plan.Plan, not {plan!r}")
        self._ex = _rt.Executor(self._plan, backend)
        self._dims: list[tuple[str, int, int]] = list(self._plan.dims)
        self._dim_index = {name: i for i, (name, _, _) in enumerate(self._dims)}
        io_table = self._plan.io
        self._io = [_IO(name, role, dt, bare) for _, name, role, dt, bare, _ in io_table]
        names = {bid: name for bid, name, *_ in io_table}
        for io, (*_, alias) in zip(self._io, io_table, strict=True):
            if alias >= 0:
                io.updates = names[alias]
        self._inputs = [io for io in self._io if io.role == Role.input]
        # input name -> the output that updates it in place
        self._in_place = {io.updates: io.name for io in self._io if io.updates is not None}
        self._input_names = {io.name for io in self._inputs}
        self._shape_cache: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
        if flags.debug() >= 2:
            self.set_profiling(True)
            _PROFILED.append(self)

    # -- profiling ---------------------------------------------------------------------------

    def set_profiling(self, on: bool = True) -> None:
        """Time every step of later runs (resets the counters). ``LUMINAL_DEBUG=2`` turns it on
        for every executor and prints :meth:`profile_table` at exit."""
        self._ex.set_profiling(on)

    def profile(self) -> list[dict[str, Any]]:
        """Per step, in plan order: ``{"step", "name", "calls", "total_ms", "mean_us"}``."""
        rows = []
        for i, (name, (ns, calls)) in enumerate(
            zip(self._plan.step_names, self._ex.profile(), strict=True)
        ):
            rows.append({"step": i, "name": name, "calls": calls, "total_ms": ns / 1e6,
                         "mean_us": ns / 1e3 / calls if calls else 0.0})  # fmt: skip
        return rows

    def profile_table(self, top: int = 25) -> str:
        """The ``top`` slowest steps by total time, with their share of the whole."""
        rows = self.profile()
        total = sum(r["total_ms"] for r in rows) or 1.0
        lines = [f"{'step':>5} {'share':>6} {'total ms':>10} {'mean us':>10} {'calls':>6}  name"]
        for r in sorted(rows, key=lambda r: -r["total_ms"])[:top]:
            share = 100 * r["total_ms"] / total
            lines.append(f"{r['step']:>5} {share:>5.1f}% {r['total_ms']:>10.3f} "
                         f"{r['mean_us']:>10.1f} {r['calls']:>6}  {r['name']}")  # fmt: skip
        lines.append(f"total {total:.3f} ms over {len(rows)} steps "
                     f"({self.metadata.get('graph', '')})")  # fmt: skip
        return "\n".join(lines)

    # -- facts -------------------------------------------------------------------------------

    @property
    def backend(self) -> str:
        return str(self._ex.backend)

    @property
    def dims(self) -> dict[str, tuple[int, int]]:
        """Each dim's inclusive range ``(min, max)``."""
        return {name: (lo, hi) for name, lo, hi in self._dims}

    @property
    def inputs(self) -> dict[str, np.dtype[Any]]:
        return {io.name: io.np_dtype for io in self._inputs}

    @property
    def outputs(self) -> dict[str, np.dtype[Any]]:
        return {io.name: io.np_dtype for io in self._io if io.role == Role.output}

    @property
    def updates(self) -> dict[str, str]:
        """Output name -> the input it updates in place (its array is the input's array)."""
        return {io.name: io.updates for io in self._io if io.updates is not None}

    @property
    def metadata(self) -> dict[str, str]:
        return dict(self._plan.metadata)

    @property
    def arena_bytes(self) -> int:
        """Scratch memory held now (grows to the largest dims run so far)."""
        return int(self._ex.arena_bytes)

    # -- the unchecked path, for front ends that prepare their calls once --------------------

    @property
    def io(self) -> tuple[IOInfo, ...]:
        """Every input and output in the order ``native_run`` takes their arrays."""
        return tuple(self._io)

    @property
    def native_run(self) -> Callable[[Sequence[int], list[np.ndarray]], None]:
        """The runtime's run itself, with none of ``run``'s Python checks: dim values in
        ``dims`` order and one array per ``io`` entry (outputs allocated by the caller with
        ``native_shapes``; an output that ``updates`` an input gets that input's array; raw
        dtypes as bytes). The GIL is released while it runs. The runtime still checks each
        array's size and dtype width and each dim's range (ValueError / RuntimeError)."""
        return cast(Callable[[Sequence[int], list[np.ndarray]], None], self._ex.run)

    @property
    def native_run_addresses(self) -> Callable[[Sequence[int], list[int]], None]:
        """``native_run`` over memory addresses instead of arrays, for memory another library
        owns (torch tensors): one C-contiguous buffer per ``io`` entry. Nothing checks the
        sizes: the caller guarantees each holds its entry's ``native_shapes`` bytes. The
        dims' ranges are still checked."""
        return cast(Callable[[Sequence[int], list[int]], None], self._ex.run_addresses)

    @property
    def native_shapes(self) -> Callable[[Sequence[int]], list[tuple[int, ...]]]:
        """Shapes of every ``io`` entry for dim values in ``dims`` order (no caching)."""
        return cast(Callable[[Sequence[int]], list[tuple[int, ...]]], self._ex.shapes)

    def shapes(self, dims: Mapping[str, int] | None = None, /, **more: int) -> dict[str, tuple]:
        """Shapes of every input and output for fully given dims."""
        vals = self._dim_values({}, dims, more)
        return {io.name: s for io, s in zip(self._io, self._shapes(vals), strict=True)}

    # -- running -----------------------------------------------------------------------------

    def run(
        self,
        inputs: Mapping[str, Any],
        dims: Mapping[str, int] | None = None,
        /,
        *,
        out: Mapping[str, np.ndarray] | None = None,
        **more: int,
    ) -> dict[str, np.ndarray]:
        """Runs the plan. ``dims`` (a dict, keywords or both) may leave out dims that an
        input's shape gives. Raises ValueError/TypeError naming the input or dim at fault.

        ``out`` maps output names to arrays the kernels write instead of new ones (C-contiguous,
        writable, of the output's dtype and shape, sharing no memory with the inputs): a caller
        running a plan repeatedly saves allocating and first-touching every output each call,
        which for a large output costs as much as the kernel. (A dim named ``out`` goes in
        ``dims``.)"""
        if len(inputs) != len(self._inputs) or not self._input_names.issuperset(inputs):
            self._check_names(inputs)
        vals = self._dim_values(inputs, dims, more)
        shapes = self._shapes(vals)
        if out:
            self._check_out(out, shapes, inputs)
        arrays: list[np.ndarray] = []
        outputs: list[tuple[_IO, np.ndarray, tuple[int, ...]]] = []
        passed: dict[str, np.ndarray] = {}  # in-place inputs as passed to the runtime
        late: list[tuple[int, str]] = []
        for io, shape in zip(self._io, shapes, strict=True):
            if io.role == Role.input:
                a = self._prepare_input(io, inputs[io.name], shape)
                if io.name in self._in_place:
                    self._check_in_place(io, inputs[io.name])
                    passed[io.name] = a
                arrays.append(a)
            elif io.updates is not None:
                # the runtime writes this output through its input's pointer; same array here
                late.append((len(arrays), io.updates))
                arrays.append(inputs[io.updates])
                outputs.append((io, inputs[io.updates], shape))
            elif out and io.name in out:
                given = out[io.name]
                arrays.append(given.reshape(-1).view(np.uint8) if io.raw else given)
                outputs.append((io, given, shape))
            elif io.packed:
                raw = np.empty(io.dtype.nbytes(_prod(shape)), np.uint8)
                arrays.append(raw)
                outputs.append((io, raw, shape))
            else:
                new = np.empty(shape, io.np_dtype)
                arrays.append(new.reshape(-1).view(np.uint8) if io.raw else new)
                outputs.append((io, new, shape))
        for k, name in late:
            arrays[k] = passed[name]
        self._ex.run(vals, arrays)
        result = {}
        for io, a, shape in outputs:
            if io.packed:
                count = _prod(shape)
                a = unpack_nibbles(a, count, io.dtype == DType.i4).view(io.np_dtype).reshape(shape)
            result[io.name] = a
        return result

    __call__ = run

    def _prepare_input(self, io: _IO, a: Any, shape: tuple[int, ...]) -> np.ndarray:
        if type(a) is not np.ndarray:
            a = np.asarray(a, dtype=io.np_dtype if not isinstance(a, np.ndarray) else None)
        if a.dtype != io.np_dtype:
            raise TypeError(
                f"input {io.name!r} has dtype {a.dtype}, expected {io.np_dtype} "
                f"(plan dtype {io.dtype.name})"
            )
        if a.shape != shape:
            raise ValueError(f"input {io.name!r} has shape {a.shape}, expected {shape}")
        if not a.flags.c_contiguous:
            a = np.ascontiguousarray(a)
        if io.packed:
            return pack_nibbles(a)
        return a.reshape(-1).view(np.uint8) if io.raw else a

    def _check_in_place(self, io: _IO, given: Any) -> None:
        """The kernels write an in-place input: it must be the caller's own array, as is."""
        out = self._in_place[io.name]
        if io.packed:  # ml_dtypes holds one 4-bit value per byte; the plan packs two
            raise ValueError(f"input {io.name!r}: a {io.dtype.name} array cannot be updated "
                             f"in place (output {out!r})")  # fmt: skip
        if not isinstance(given, np.ndarray) or not given.flags.c_contiguous:
            got = type(given).__name__
            if isinstance(given, np.ndarray):
                got = "a non-contiguous array"
            raise ValueError(
                f"input {io.name!r} is updated in place (output {out!r}): pass a writable, "
                f"C-contiguous numpy array, not {got}"
            )
        if not given.flags.writeable:
            raise ValueError(
                f"input {io.name!r} is updated in place (output {out!r}) but its array is "
                "read-only: pass a writable copy (np.array(a))"
            )

    def _check_out(
        self, out: Mapping[str, Any], shapes: list[tuple[int, ...]], inputs: Mapping[str, Any]
    ) -> None:
        """Each ``out`` array must be one the kernels can write as is, and alias nothing they
        read (kernel arguments are ``restrict``)."""
        ios = {io.name: (io, s) for io, s in zip(self._io, shapes, strict=True)
               if io.role == Role.output}  # fmt: skip
        seen: list[np.ndarray] = []
        for name, a in out.items():
            if name not in ios:
                raise ValueError(f"out: unknown output {name!r}; the plan has {sorted(ios)}")
            io, shape = ios[name]
            if io.updates is not None:
                raise ValueError(f"out: output {name!r} updates input {io.updates!r} in place; "
                                 "its array is that input")  # fmt: skip
            if io.packed:
                raise ValueError(f"out: a {io.dtype.name} output ({name!r}) is unpacked from "
                                 "the plan's bytes and cannot be written in place")  # fmt: skip
            if not isinstance(a, np.ndarray):
                raise TypeError(f"out[{name!r}] must be a numpy array, not {type(a).__name__}")
            if a.dtype != io.np_dtype or a.shape != shape:
                raise ValueError(f"out[{name!r}] is {a.dtype} {a.shape}, expected "
                                 f"{io.np_dtype} {shape}")  # fmt: skip
            if not (a.flags.c_contiguous and a.flags.writeable):
                raise ValueError(f"out[{name!r}] must be a writable, C-contiguous array")
            for other in (*seen, *inputs.values()):
                if isinstance(other, np.ndarray) and np.may_share_memory(a, other):
                    raise ValueError(f"out[{name!r}] shares memory with an input or another "
                                     "output")  # fmt: skip
            seen.append(a)

    def _check_names(self, inputs: Mapping[str, Any]) -> None:
        missing = sorted(self._input_names - set(inputs))
        unknown = sorted(set(inputs) - self._input_names)
        if missing:
            raise ValueError(
                f"missing input(s) {missing}; the plan takes {sorted(self._input_names)}"
            )
        if unknown:
            raise ValueError(
                f"unknown input(s) {unknown}; the plan takes {sorted(self._input_names)}"
            )

    def _dim_values(
        self, inputs: Mapping[str, Any], dims: Mapping[str, int] | None, more: Mapping[str, int]
    ) -> list[int]:
        vals: list[int | None] = [None] * len(self._dims)
        for given in (dims or {}, more):
            for name, v in given.items():
                i = self._dim_index.get(name)
                if i is None:
                    raise ValueError(f"unknown dim {name!r}; the plan has {list(self._dim_index)}")
                if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
                    raise TypeError(f"dim {name!r} must be an int, got {v!r}")
                vals[i] = int(v)
        if None in vals:
            for io in self._inputs:
                a = inputs.get(io.name)
                shape = getattr(a, "shape", None)
                if shape is None:
                    continue
                for axis, d in io.bare:
                    if vals[d] is None and axis < len(shape):
                        vals[d] = int(shape[axis])
            for i, val in enumerate(vals):
                if val is None:
                    name = self._dims[i][0]
                    raise ValueError(f"dim {name!r} is not given and no input shape implies it")
        return cast(list[int], vals)

    def _shapes(self, vals: list[int]) -> list[tuple[int, ...]]:
        key = tuple(vals)
        shapes = self._shape_cache.get(key)
        if shapes is None:
            shapes = self._ex.shapes(vals)
            if len(self._shape_cache) >= 256:
                self._shape_cache.clear()
            self._shape_cache[key] = shapes
        return shapes


def load(
    plan: str | os.PathLike[str] | bytes | Plan,
    backend: str = "cpu",
    *,
    base_dir: str | os.PathLike[str] = ".",
) -> Executor:
    """Loads a plan for running; see :class:`Executor`."""
    return Executor(plan, backend, base_dir=base_dir)


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
