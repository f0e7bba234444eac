"""safetensors files, mapped: our own header parse + ``mmap`` + ``np.frombuffer``.

Layout: an 8-byte little-endian header length N, N bytes of JSON (``{name: {dtype, shape,
data_offsets}, "__metadata__": {...}}``), then the raw little-endian data; offsets are
relative to the end of the header. Arrays are read-only views of the mapping (no copy, bf16
through ``ml_dtypes``). Every inconsistency raises ``SafetensorsError`` naming the file.
"""

from __future__ import annotations

import json
import mmap
import os
from collections.abc import Iterator
from typing import Any

import ml_dtypes
import numpy as np

from . import mapped

_DTYPES: dict[str, Any] = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": ml_dtypes.bfloat16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U64": np.uint64,
    "U32": np.uint32,
    "U16": np.uint16,
    "U8": np.uint8,
    "BOOL": np.bool_,
    "F8_E4M3": ml_dtypes.float8_e4m3fn,
    "F8_E5M2": ml_dtypes.float8_e5m2,
}
_MAX_HEADER = 100 * 1024 * 1024  # the reference implementation's limit


class SafetensorsError(ValueError):
    """A truncated, corrupt or unsupported safetensors file."""


class SafetensorsFile:
    """A mapped safetensors file: ``f[name]`` is a read-only numpy view, ``f.metadata`` the
    ``__metadata__`` strings. Use as a context manager or keep it open while arrays live."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        size = os.path.getsize(self.path)
        if size < 8:
            raise self._err(
                f"file is {size} bytes; a safetensors file starts with an 8-byte header length"
            )
        with open(self.path, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            if n > min(size - 8, _MAX_HEADER):
                raise self._err(
                    f"header length {n} exceeds the file ({size} bytes): "
                    "truncated or not safetensors"
                )
            raw = fh.read(n)
            self._mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        # arrays are views of this one array, which keeps the mapping registered while any lives
        self._bytes: np.ndarray | None = np.frombuffer(self._mm, np.uint8)
        mapped.register(self._bytes, self.path)
        try:
            header = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise self._err(f"header is not valid JSON ({e})") from None
        if not isinstance(header, dict):
            raise self._err(f"header must be a JSON object, got {type(header).__name__}")
        meta = header.pop("__metadata__", None) or {}
        if not isinstance(meta, dict):
            raise self._err("__metadata__ must be an object of strings")
        self.metadata: dict[str, str] = {str(k): str(v) for k, v in meta.items()}
        self._start = 8 + n
        self._entries: dict[str, tuple[Any, tuple[int, ...], int, int]] = {}
        for name, info in header.items():
            self._entries[name] = self._check(name, info, size - self._start)

    def _err(self, msg: str) -> SafetensorsError:
        return SafetensorsError(f"{self.path}: {msg}")

    def _check(self, name: str, info: Any, data_size: int) -> tuple[Any, tuple[int, ...], int, int]:
        if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= info.keys():
            raise self._err(
                f"tensor {name!r}: entry needs dtype, shape and data_offsets, got {info!r}"
            )
        dtype = _DTYPES.get(info["dtype"])
        if dtype is None:
            raise self._err(
                f"tensor {name!r}: unknown dtype {info['dtype']!r} (known: {', '.join(_DTYPES)})"
            )
        shape, offs = info["shape"], info["data_offsets"]
        if not (isinstance(shape, list) and all(isinstance(s, int) and s >= 0 for s in shape)):
            raise self._err(f"tensor {name!r}: bad shape {shape!r}")
        if not (
            isinstance(offs, list) and len(offs) == 2 and all(isinstance(o, int) for o in offs)
        ):
            raise self._err(f"tensor {name!r}: bad data_offsets {offs!r}")
        begin, end = offs
        if not 0 <= begin <= end <= data_size:
            raise self._err(
                f"tensor {name!r}: data_offsets [{begin}, {end}) outside the "
                f"{data_size} data bytes "
                "(truncated file?)"
            )
        want = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if end - begin != want:
            raise self._err(
                f"tensor {name!r}: {end - begin} bytes for shape {tuple(shape)} of "
                f"{info['dtype']} (needs {want})"
            )
        return dtype, tuple(shape), begin, end

    def keys(self) -> list[str]:
        return list(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def info(self, name: str) -> tuple[np.dtype, tuple[int, ...]]:
        dtype, shape, _, _ = self._entry(name)
        return np.dtype(dtype), shape

    def _entry(self, name: str) -> tuple[Any, tuple[int, ...], int, int]:
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(f"{self.path}: no tensor {name!r}") from None

    def __getitem__(self, name: str) -> np.ndarray:
        dtype, shape, begin, end = self._entry(name)
        if self._bytes is None:
            raise ValueError(f"{self.path}: the file is closed")
        raw = self._bytes[self._start + begin : self._start + end]
        return raw.view(dtype).reshape(shape)

    def close(self) -> None:
        # arrays still viewing the map keep it alive; closing then would fail, so let GC do it
        self._bytes = None
        try:
            self._mm.close()
        except BufferError:
            pass

    def __enter__(self) -> SafetensorsFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load_safetensors(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """All tensors of a file as read-only arrays mapped from it."""
    f = SafetensorsFile(path)
    return {k: f[k] for k in f.keys()}


def save_safetensors(
    path: str | os.PathLike[str],
    tensors: dict[str, np.ndarray],
    metadata: dict[str, str] | None = None,
) -> None:
    """Write tensors (tests and tools; 8-byte aligned like the reference writer)."""
    names = {np.dtype(v): k for k, v in _DTYPES.items()}
    header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    off = 0
    arrays = []
    for name, a in tensors.items():
        a = np.asarray(a)
        a = a if a.flags.c_contiguous else a.copy()  # (ascontiguousarray would make 0-d arrays 1-d)
        if a.dtype not in names:
            raise SafetensorsError(
                f"{path}: tensor {name!r}: dtype {a.dtype} has no safetensors name"
            )
        header[name] = {
            "dtype": names[a.dtype],
            "shape": list(a.shape),
            "data_offsets": [off, off + a.nbytes],
        }
        off += a.nbytes
        arrays.append(a)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as fh:
        fh.write(len(raw).to_bytes(8, "little"))
        fh.write(raw)
        for a in arrays:
            fh.write(a.tobytes())
