"""Element types.

Each dtype has a stable code (the plan format's dtype table), a storage width in bits (4-bit
types are packed two per byte, low nibble first), and the numpy type the reference
interpreter computes with. Types numpy lacks (bf16, fp8, e8m0, fp4, i4/u4) come from
``ml_dtypes``, which implements their rounding exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np


@dataclass(frozen=True)
class DType:
    name: str
    code: int
    bits: int
    kind: str  # "float" | "int" | "uint" | "bool"
    np_type: Any  # numpy scalar type used by the interpreter (one element per item)
    c_type: str  # storage type in generated C (packed types: their byte type)

    def __repr__(self) -> str:
        return f"luminal.{self.name}"

    def __reduce__(self) -> tuple:
        # one object per dtype (graphs compare them by identity): unpickled, a dtype is the
        # module's own
        return (_by_name, (self.name,))

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_int(self) -> bool:
        return self.kind in ("int", "uint")

    @property
    def packed(self) -> bool:
        return self.bits < 8

    @property
    def itemsize(self) -> int:
        """Bytes per element for byte-sized types; packed types report 1 (see ``nbytes``)."""
        return max(self.bits // 8, 1)

    def nbytes(self, numel: int) -> int:
        return (numel * self.bits + 7) // 8


f32 = DType("f32", 0, 32, "float", np.float32, "float")
f16 = DType("f16", 1, 16, "float", np.float16, "uint16_t")
bf16 = DType("bf16", 2, 16, "float", ml_dtypes.bfloat16, "uint16_t")
f64 = DType("f64", 3, 64, "float", np.float64, "double")
i32 = DType("i32", 4, 32, "int", np.int32, "int32_t")
i64 = DType("i64", 5, 64, "int", np.int64, "int64_t")
bool_ = DType("bool", 6, 8, "bool", np.bool_, "uint8_t")
i8 = DType("i8", 7, 8, "int", np.int8, "int8_t")
u8 = DType("u8", 8, 8, "uint", np.uint8, "uint8_t")
f8e4m3 = DType("f8e4m3", 9, 8, "float", ml_dtypes.float8_e4m3fn, "uint8_t")
f8e5m2 = DType("f8e5m2", 10, 8, "float", ml_dtypes.float8_e5m2, "uint8_t")
e8m0 = DType("e8m0", 11, 8, "float", ml_dtypes.float8_e8m0fnu, "uint8_t")
fp4e2m1 = DType("fp4e2m1", 12, 4, "float", ml_dtypes.float4_e2m1fn, "uint8_t")
i4 = DType("i4", 13, 4, "int", ml_dtypes.int4, "uint8_t")
u4 = DType("u4", 14, 4, "uint", ml_dtypes.uint4, "uint8_t")

ALL: tuple[DType, ...] = (
    f32,
    f16,
    bf16,
    f64,
    i32,
    i64,
    bool_,
    i8,
    u8,
    f8e4m3,
    f8e5m2,
    e8m0,
    fp4e2m1,
    i4,
    u4,
)
BY_NAME: dict[str, DType] = {d.name: d for d in ALL}
BY_CODE: dict[int, DType] = {d.code: d for d in ALL}


def _by_name(name: str) -> DType:
    return BY_NAME[name]


_ALIASES = {
    "float32": f32, "float": f32, "float16": f16, "half": f16, "bfloat16": bf16,
    "float64": f64, "double": f64, "int32": i32, "int64": i64, "long": i64, "int": i32,
    "int8": i8, "uint8": u8, "float8_e4m3fn": f8e4m3, "float8_e5m2": f8e5m2,
    "float8_e8m0fnu": e8m0, "float4_e2m1fn": fp4e2m1, "int4": i4, "uint4": u4,
}  # fmt: skip


def to_dtype(x: Any) -> DType:
    """Accept a DType, a name ('f32', 'float32', 'bool'), a numpy dtype or a torch dtype."""
    if isinstance(x, DType):
        return x
    if isinstance(x, str):
        key = x.removeprefix("torch.")
        if key in BY_NAME:
            return BY_NAME[key]
        if key in _ALIASES:
            return _ALIASES[key]
        raise TypeError(f"unknown dtype {x!r}; known: {', '.join(BY_NAME)}")
    mod = type(x).__module__
    if mod.startswith("torch"):
        return to_dtype(str(x))
    try:
        npd = np.dtype(x)
    except TypeError:
        raise TypeError(f"cannot interpret {x!r} as a luminal dtype") from None
    for d in ALL:
        if np.dtype(d.np_type) == npd:
            return d
    raise TypeError(f"numpy dtype {npd} has no luminal equivalent")


def promote(a: DType, b: DType) -> DType:
    """PyTorch-like type promotion for binary high-level ops."""
    if a is b:
        return a
    rank = {bool_: 0, u8: 1, i8: 1, i4: 1, u4: 1, i32: 2, i64: 3}
    if a.is_float and b.is_float:
        if {a, b} == {f16, bf16}:
            return f32
        return a if a.bits >= b.bits else b
    if a.is_float:
        return a
    if b.is_float:
        return b
    if a in rank and b in rank:
        return a if rank[a] >= rank[b] else b
    return i64


def np_cast(x: np.ndarray, dtype: DType) -> np.ndarray:
    """Value conversion as Cast defines it: floats to ints truncate toward zero, and any
    value to bool is ``x != 0``."""
    if dtype is bool_:
        return x != 0
    src_float = x.dtype.kind == "f" or x.dtype in _EXOTIC_FLOATS
    if dtype.is_int and src_float:
        x = np.trunc(x.astype(np.float64))
    return x.astype(dtype.np_type)


_EXOTIC_FLOATS = {
    np.dtype(d.np_type) for d in ALL if d.is_float and d.name not in ("f32", "f64", "f16")
}
