"""GGUF files through the ``gguf`` package: metadata, tensors (mapped) and the tokenizer.

``GGUFReader`` maps the file; tensors are numpy views of the mapping. Quantized tensors enter
a graph as their raw blocks with a dequantization expression (``quants.py``), F32/F16/BF16 as
arrays (cast to f32 in the graph). ``GGUFWeights`` serves a model's ``WeightSource``;
``dequant="load"`` instead dequantizes at load time with ``gguf.quants`` (f32 arrays: the fast
path for the reference interpreter, which re-evaluates every expression on each run).
"""

from __future__ import annotations

import os
import weakref
from typing import Any

import ml_dtypes
import numpy as np

from ..functional import embedding
from ..tensor import Graph, Tensor
from . import mapped, quants


class GGUFError(ValueError):
    """A truncated, corrupt or unsupported GGUF file."""


_FLOAT_TYPES = {"F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16}


class GGUFFile:
    """A mapped GGUF file: ``metadata`` (key -> Python value), ``tensors`` (name -> info),
    ``array(name)`` (raw mapped data), ``architecture``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        try:
            from gguf import GGUFReader
        except ImportError as e:  # pragma: no cover - gguf is a dependency of the models extra
            raise ImportError(
                "reading GGUF files needs the 'gguf' package (pip install gguf)"
            ) from e
        self.path = os.fspath(path)
        size = os.path.getsize(self.path)
        with open(self.path, "rb") as fh:
            magic = fh.read(4)
        if magic != b"GGUF":
            raise GGUFError(f"{self.path}: not a GGUF file (magic {magic!r}, expected b'GGUF')")
        try:
            self.reader = GGUFReader(self.path, "r")
        except Exception as e:  # the reader raises ValueError/IndexError/struct errors on bad bytes
            raise GGUFError(
                f"{self.path}: truncated or corrupt GGUF file ({type(e).__name__}: {e})"
            ) from None
        mapped.register(self.reader.data, self.path)  # plans refer to its tensors by offset
        self.metadata: dict[str, Any] = {
            k: _field_value(f) for k, f in self.reader.fields.items() if not k.startswith("GGUF.")
        }
        self.tensors = {t.name: t for t in self.reader.tensors}
        for t in self.tensors.values():
            if int(t.data_offset) + int(t.n_bytes) > size:
                raise GGUFError(
                    f"{self.path}: tensor {t.name!r} ends at byte "
                    f"{int(t.data_offset) + int(t.n_bytes)} "
                    f"but the file has {size} bytes (truncated)"
                )

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", "?"))

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def arch_key(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(f"{self.architecture}.{key}", default)

    def type_name(self, name: str) -> str:
        return self._tensor(name).tensor_type.name

    def shape(self, name: str) -> tuple[int, ...]:
        """PyTorch-order shape (GGUF stores dims innermost first)."""
        return tuple(int(s) for s in reversed(self._tensor(name).shape))

    def _tensor(self, name: str) -> Any:
        try:
            return self.tensors[name]
        except KeyError:
            raise KeyError(f"{self.path}: no tensor {name!r}") from None

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes, a view of the mapping."""
        t = self._tensor(name)
        off = int(t.data_offset)
        return self.reader.data[off : off + int(t.n_bytes)]

    def array(self, name: str) -> np.ndarray:
        """An F32/F16/BF16 tensor as a mapped array of ``shape(name)``."""
        kind = self.type_name(name)
        if kind not in _FLOAT_TYPES:
            raise GGUFError(f"{self.path}: tensor {name!r} is {kind}, not a plain float type")
        return self.raw(name).view(_FLOAT_TYPES[kind]).reshape(self.shape(name))

    def dequantize(self, name: str) -> np.ndarray:
        """f32 values from ``gguf.quants`` (the reference our graph expressions are tested
        against)."""
        from gguf.quants import dequantize

        t = self._tensor(name)
        if self.type_name(name) in _FLOAT_TYPES:
            return np.asarray(self.array(name), dtype=np.float32)
        return np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(
            self.shape(name)
        )


def _field_value(f: Any) -> Any:
    from gguf import GGUFValueType

    if not f.types:
        return None
    if f.types[0] == GGUFValueType.ARRAY:
        sub = f.types[-1] if len(f.types) > 1 else None
        if sub == GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode("utf-8", errors="replace") for i in f.data]
        if sub == GGUFValueType.ARRAY:
            return None  # nested arrays: not used by the models here
        return np.concatenate([f.parts[i] for i in f.data]) if f.data else np.zeros(0)
    if f.types[0] == GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8", errors="replace")
    v = f.parts[f.data[0]][0]
    return bool(v) if f.types[0] == GGUFValueType.BOOL else v.item()


class GGUFWeights:
    """A ``WeightSource`` over a GGUF file. ``dequant='graph'`` (default) puts packed blocks in
    the graph with their dequantization expression; ``dequant='load'`` gives f32 arrays."""

    def __init__(self, f: GGUFFile, dequant: str = "graph") -> None:
        if dequant not in ("graph", "load"):
            raise ValueError(f"dequant must be 'graph' or 'load', got {dequant!r}")
        self.file = f
        self.dequant = dequant
        for name in f.tensors:
            kind = f.type_name(name)
            if kind not in _FLOAT_TYPES and kind not in quants.FORMATS:
                raise GGUFError(
                    f"{f.path}: tensor {name!r} uses quantization {kind}, which luminal does not "
                    f"support (supported: {', '.join([*_FLOAT_TYPES, *quants.FORMATS])})"
                )
        self._cache: weakref.WeakKeyDictionary[Graph, dict[str, Tensor]] = (
            weakref.WeakKeyDictionary()
        )

    def has(self, name: str) -> bool:
        return name in self.file.tensors

    def identity(self) -> str:
        """The file's identity (path, size, mtime, inode) and the dequantization mode: what
        the plan cache keys these weights by (no reading)."""
        fid = mapped.file_id(self.file.path)
        return f"gguf:{fid.path}:{fid.size}:{fid.mtime_ns}:{fid.inode}:{self.dequant}"

    def shape(self, name: str) -> tuple[int, ...]:
        return self.file.shape(name)

    def get(self, g: Graph, name: str) -> Tensor:
        per_graph = self._cache.setdefault(g, {})
        if name not in per_graph:
            per_graph[name] = self._build(g, name)
        return per_graph[name]

    def _build(self, g: Graph, name: str) -> Tensor:
        f, kind, shape = self.file, self.file.type_name(name), self.file.shape(name)
        if kind in _FLOAT_TYPES:
            return g.weight(name, data=f.array(name)).float()
        if self.dequant == "load":
            return g.weight(name, data=f.dequantize(name))
        rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
        return quants.quantized_weight(g, name, kind, f.raw(name), (rows, shape[-1])).reshape(shape)

    def rows(self, g: Graph, name: str, idx: Tensor) -> Tensor:
        """Embedding rows: for packed weights only the blocks of the rows read are dequantized."""
        f, kind, shape = self.file, self.file.type_name(name), self.file.shape(name)
        if kind in _FLOAT_TYPES or self.dequant == "load" or len(shape) != 2:
            return embedding(idx, self.get(g, name))
        return quants.quantized_rows(g, name, kind, f.raw(name), shape, idx)
