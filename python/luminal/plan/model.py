"""A plan's data model: dims with bounds, postfix integer expressions, buffers, kernels,
ordered steps and weights (the bytes are ``io.py``'s; the layout is ``docs/plan-format.md``).

Wherever the format holds an expression, the dataclasses accept an ``int`` or any object with
``to_postfix(dim_index) -> list[tuple[int, int]]`` (the symbolic-shape module's expressions);
programs are interned into one table on save. This module imports neither torch nor the graph
package.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast, runtime_checkable

import numpy as np

__all__ = [
    "ALIGN",
    "FORMAT_VERSION",
    "MAGIC",
    "Copy",
    "DType",
    "Dim",
    "Buffer",
    "Expr",
    "FileWeight",
    "InlineWeight",
    "Kernel",
    "KernelFormat",
    "Launch",
    "LibCall",
    "Op",
    "PlanData",
    "PlanError",
    "Postfix",
    "Role",
    "Step",
    "SupportsPostfix",
    "Weight",
    "check_program",
    "eval_program",
    "pack_nibbles",
    "program_of",
    "render",
    "unpack_nibbles",
]

MAGIC = b"LMPL"
FORMAT_VERSION = 3
# versions this reader accepts: 1 has no buffer alias field (nothing is updated in place)
READ_VERSIONS = (1, 2, 3)
HEADER_SIZE = 32
ALIGN = 64
NONE = 0xFFFFFFFF
MAX_STACK = 256


class PlanError(ValueError):
    """A plan that is malformed, corrupt or inconsistent."""


class DType(enum.IntEnum):
    """Element types; codes are fixed by the plan format."""

    f32 = 0
    f16 = 1
    bf16 = 2
    f64 = 3
    i32 = 4
    i64 = 5
    bool = 6
    i8 = 7
    u8 = 8
    f8e4m3 = 9
    f8e5m2 = 10
    e8m0 = 11
    fp4e2m1 = 12
    i4 = 13
    u4 = 14

    @property
    def bits(self) -> int:
        return _BITS[self]

    def nbytes(self, count: int) -> int:
        """Bytes for ``count`` elements (4-bit types pack two per byte, low nibble first)."""
        return (count + 1) // 2 if self.bits == 4 else count * (self.bits // 8)

    @classmethod
    def of(cls, v: object) -> DType:
        """Accepts a DType, its code, its name, or an object with a ``name`` (graph dtypes)."""
        if isinstance(v, DType):
            return v
        if isinstance(v, int):
            return cls(v)
        name = v if isinstance(v, str) else getattr(v, "name", None)
        if isinstance(name, str) and name in cls.__members__:
            return cls[name]
        raise PlanError(f"unknown dtype {v!r}")


_BITS = dict(zip(DType, (32, 16, 16, 64, 32, 64, 8, 8, 8, 8, 8, 8, 4, 4, 4), strict=True))


class Role(enum.IntEnum):
    input = 0
    output = 1
    weight = 2
    scratch = 3


class KernelFormat(enum.IntEnum):
    c_source = 0
    shared_object = 1
    cuda_source = 2
    ptx = 3
    cubin = 4
    msl = 5
    metallib = 6


class Op(enum.IntEnum):
    """Postfix opcodes. Binary ops pop b, then a, and push ``a OP b``."""

    CONST = 0
    DIM = 1
    ADD = 2
    SUB = 3
    MUL = 4
    FLOORDIV = 5
    MOD = 6
    MIN = 7
    MAX = 8
    LT = 9
    EQ = 10


Program = tuple[tuple[int, int], ...]


@runtime_checkable
class SupportsPostfix(Protocol):
    def to_postfix(self, dim_index: dict[str, int]) -> list[tuple[int, int]]: ...


Expr = int | SupportsPostfix


@dataclass(frozen=True)
class Postfix:
    """An expression as read back from a plan: a postfix program over plan dim indices."""

    program: Program

    def to_postfix(self, dim_index: dict[str, int]) -> list[tuple[int, int]]:
        return list(self.program)

    def render(self, dim_names: Sequence[str] = ()) -> str:
        return render(self.program, dim_names)


# ---- dataclasses ---------------------------------------------------------------------------


@dataclass
class Dim:
    name: str
    min: int
    max: int


@dataclass
class Buffer:
    """``nbytes`` defaults to the packed size of ``shape``; ``offset`` is for scratch only.
    ``alias``: for an output, the id of the input buffer it updates in place (the output
    *is* that input's memory: same dtype, shape and size)."""

    name: str
    dtype: DType
    role: Role
    shape: tuple[Expr, ...] = ()
    nbytes: Expr | None = None
    offset: Expr | None = None
    alias: int | None = None

    def __post_init__(self) -> None:
        self.dtype = DType.of(self.dtype)
        self.role = Role(self.role)
        self.shape = tuple(self.shape)


@dataclass
class Kernel:
    name: str
    format: KernelFormat
    entry: str
    code: bytes

    def __post_init__(self) -> None:
        self.format = KernelFormat(self.format)
        if isinstance(self.code, str):
            self.code = self.code.encode()


@dataclass
class Launch:
    """Runs kernel ``kernel`` on buffers ``args``. On CPU grid[0] is the task count and
    block[0] a minimum number of tasks per thread chunk."""

    kernel: int
    args: list[int]
    grid: tuple[Expr, Expr, Expr] = (1, 1, 1)
    block: tuple[Expr, Expr, Expr] = (1, 1, 1)
    shared_mem: Expr = 0
    when: Expr | None = None  # runs only where this evaluates nonzero (a plan variant)


@dataclass
class LibCall:
    """A library function with a named descriptor; float values are stored as f64 fields."""

    func: str
    fields: dict[str, Expr | float]
    args: list[int]
    when: Expr | None = None


@dataclass
class Copy:
    """Copies ``nbytes`` bytes from ``src`` + src_offset to ``dst`` + dst_offset."""

    dst: int
    src: int
    nbytes: Expr
    dst_offset: Expr = 0
    src_offset: Expr = 0
    when: Expr | None = None


Step = Launch | LibCall | Copy


@dataclass
class InlineWeight:
    """Weight bytes stored in the plan's aligned blob. 4-bit ml_dtypes arrays are packed."""

    buffer: int
    data: bytes | memoryview | np.ndarray


@dataclass
class FileWeight:
    """Weight bytes that stay in another file (mapped, not copied, by the runtime). A
    relative path resolves against the folder holding the plan."""

    buffer: int
    path: str
    offset: int
    nbytes: int


Weight = InlineWeight | FileWeight


@dataclass
class PlanData:
    """A plan's contents; ``luminal.plan.Plan`` adds reading and writing its bytes."""

    backend: str = "cpu"
    arch: str = ""
    dims: list[Dim] = field(default_factory=list)
    buffers: list[Buffer] = field(default_factory=list)
    kernels: list[Kernel] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    weights: list[Weight] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)

    # -- building --------------------------------------------------------------------------

    def add_dim(self, name: str, min: int, max: int) -> Dim:
        d = Dim(name, min, max)
        self.dims.append(d)
        return d

    def add_buffer(self, *args: Any, **kwargs: Any) -> int:
        """Appends ``Buffer(*args, **kwargs)`` and returns its id."""
        self.buffers.append(Buffer(*args, **kwargs))
        return len(self.buffers) - 1

    def add_kernel(self, *args: Any, **kwargs: Any) -> int:
        self.kernels.append(Kernel(*args, **kwargs))
        return len(self.kernels) - 1

    def buffer_id(self, name: str) -> int:
        for i, b in enumerate(self.buffers):
            if b.name == name:
                return i
        raise KeyError(name)


# ---- expressions ---------------------------------------------------------------------------


def program_of(e: Expr, dim_index: dict[str, int]) -> Program:
    """The postfix program of an int or a symbolic expression."""
    if isinstance(e, (bool, np.bool_)):
        e = int(e)
    if isinstance(e, (int, np.integer)):
        v = int(e)
        if not -(2**63) <= v < 2**63:
            raise PlanError(f"constant {v} does not fit in int64")
        return ((Op.CONST, v),)
    if isinstance(e, SupportsPostfix):
        try:
            return tuple((int(op), int(arg)) for op, arg in e.to_postfix(dim_index))
        except (KeyError, ValueError) as err:
            raise PlanError(f"cannot serialize {e}: {err}") from None
    raise PlanError(f"not an expression: {e!r} (int or object with to_postfix)")


def check_program(p: Program, n_dims: int, what: str) -> None:
    depth = 0
    for i, (op, arg) in enumerate(p):
        if not 0 <= op <= 10:
            raise PlanError(f"{what}, instruction {i}: unknown opcode {op}")
        if op == Op.DIM and not 0 <= arg < n_dims:
            raise PlanError(f"{what}, instruction {i}: DIM index {arg} out of range")
        if op in (Op.CONST, Op.DIM):
            depth += 1
            if depth > MAX_STACK:
                raise PlanError(f"{what}: stack deeper than {MAX_STACK}")
        else:
            if arg != 0:
                raise PlanError(f"{what}, instruction {i}: operand of a binary op must be 0")
            if depth < 2:
                raise PlanError(f"{what}, instruction {i}: stack underflow")
            depth -= 1
    if depth != 1:
        raise PlanError(f"{what}: program leaves {depth} values (expected 1)")


def _floordiv(a: int, b: int) -> int:
    if b == 0:
        raise ZeroDivisionError("division by zero")
    return a // b


def _mod(a: int, b: int) -> int:
    if b == 0:
        raise ZeroDivisionError("modulo by zero")
    return a % b


_BINARY: dict[Op, Callable[[int, int], int]] = {
    Op.ADD: lambda a, b: a + b,
    Op.SUB: lambda a, b: a - b,
    Op.MUL: lambda a, b: a * b,
    Op.FLOORDIV: _floordiv,
    Op.MOD: _mod,
    Op.MIN: min,
    Op.MAX: max,
    Op.LT: lambda a, b: int(a < b),
    Op.EQ: lambda a, b: int(a == b),
}


def eval_program(p: Program, dims: Sequence[int] = ()) -> int:
    """Evaluates like the runtime: floor division/modulo, int64 overflow is an error."""
    st: list[int] = []
    for op, arg in p:
        if op == Op.CONST:
            st.append(arg)
        elif op == Op.DIM:
            st.append(dims[arg])
        else:
            b = st.pop()
            v = _BINARY[Op(op)](st.pop(), b)
            if not -(2**63) <= v < 2**63:
                raise OverflowError(f"int64 overflow in {Op(op).name}")
            st.append(v)
    return st[0]


def render(p: Program, dim_names: Sequence[str] = ()) -> str:
    """Infix text of a program, e.g. ``(seq * 64)``."""
    sym = {Op.ADD: "+", Op.SUB: "-", Op.MUL: "*", Op.FLOORDIV: "//", Op.MOD: "%", Op.LT: "<"}
    st: list[str] = []
    for op, arg in p:
        if op == Op.CONST:
            st.append(str(arg))
        elif op == Op.DIM:
            st.append(dim_names[arg] if arg < len(dim_names) else f"dim{arg}")
        else:
            b, a = st.pop(), st.pop()
            o = Op(op)
            if o in (Op.MIN, Op.MAX):
                st.append(f"{o.name.lower()}({a}, {b})")
            else:
                st.append(f"({a} {sym.get(o, '==')} {b})")
    return st[0] if len(st) == 1 else "<invalid>"


def _const(p: Program) -> int | None:
    return p[0][1] if len(p) == 1 and p[0][0] == Op.CONST else None


def _nbytes_program(dtype: DType, shape: Sequence[Program]) -> Program:
    """Builds ``packed bytes of prod(shape)`` as a program, constant factors folded."""
    const, prog = 1, cast(list[tuple[int, int]], [])
    for s in shape:
        c = _const(s)
        if c is not None:
            const *= c
        else:
            prog += [*s, (Op.MUL, 0)] if prog else list(s)
    if not prog:
        return ((Op.CONST, dtype.nbytes(const)),)
    factor = const if dtype.bits == 4 else const * (dtype.bits // 8)
    if factor != 1:
        prog += [(Op.CONST, factor), (Op.MUL, 0)]
    if dtype.bits == 4:
        prog += [(Op.CONST, 1), (Op.ADD, 0), (Op.CONST, 2), (Op.FLOORDIV, 0)]
    return tuple(prog)


# ---- 4-bit packing ---------------------------------------------------------------------------


def pack_nibbles(a: np.ndarray) -> np.ndarray:
    """Packs a 4-bit array stored one element per byte (ml_dtypes) two per byte."""
    flat = np.ascontiguousarray(a).reshape(-1).view(np.uint8) & 0xF
    if flat.size % 2:
        flat = np.concatenate([flat, np.zeros(1, np.uint8)])
    return (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8)


def unpack_nibbles(raw: np.ndarray, count: int, signed: bool) -> np.ndarray:
    """The inverse of pack_nibbles: ``count`` bytes, one element each (sign-extended)."""
    raw = raw.reshape(-1).view(np.uint8)
    out = np.empty(raw.size * 2, np.uint8)
    out[0::2] = raw & 0xF
    out[1::2] = raw >> 4
    out = out[:count]
    if signed:
        out = np.where(out & 8, out | 0xF0, out).astype(np.uint8)
    return out


def _weight_bytes(w: InlineWeight, buf: Buffer) -> memoryview:
    d = w.data
    if isinstance(d, np.ndarray):
        if buf.dtype.bits == 4 and d.dtype.itemsize == 1 and d.dtype.kind == "V":
            d = pack_nibbles(d)
        d = np.ascontiguousarray(d).reshape(-1).view(np.uint8)
    return memoryview(cast(bytes, d)).cast("B")
