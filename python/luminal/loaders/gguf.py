"""GGUF files: metadata, tensors (mapped) and the tokenizer.

The file is mapped and its header parsed here; tensors are numpy views of the mapping.
Quantized tensors enter a graph as their raw blocks with a dequantization expression
(``quants.py``), F32/F16/BF16 as mapped arrays cast to f32 in the graph. ``GGUFWeights`` serves a
model's ``WeightSource``; ``dequant="load"`` instead dequantizes at load time with
``gguf.quants`` (f32 arrays: the fast path for the reference interpreter, which re-evaluates
every expression on each run).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import mmap
import os
import struct
import weakref
import zlib
from typing import Any

import ml_dtypes
import numpy as np

from .. import flags
from ..functional import embedding
from ..graph import dtypes as dt
from ..tensor import Graph, Tensor
from . import lowp, mapped, quants


class GGUFError(ValueError):
    """A truncated, corrupt or unsupported GGUF file."""


_FLOAT_TYPES = {"F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16}
# block formats whose graph dequantization gives exactly gguf.quants.dequantize's values
_EXACT_F32 = ("Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K")


# ggml tensor types: code -> (name, values per block, bytes per block) (ggml.h, ggml-quants.h)
_GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17),
    40: ("NVFP4", 64, 36),
}  # fmt: skip
# GGUF metadata value types: code -> struct format (8 string, 9 array)
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
            12: "d"}  # fmt: skip
_NP_SCALARS = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32,
               6: np.float32, 7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}  # fmt: skip
_NP_TENSOR = {"F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16, "F64": np.float64,
              "I8": np.int8, "I16": np.int16, "I32": np.int32, "I64": np.int64}  # fmt: skip


class GGUFTensor:
    """One tensor's entry: ``name``, ``type_name`` (``Q4_1``), ``shape`` (GGUF order,
    innermost first), ``data_offset`` (from the file start), ``n_bytes``, ``data`` (a view of
    the mapping: typed for float/int types, else uint8 rows of blocks) and ``tensor_type``
    (the ``gguf`` package's enum, imported when asked for)."""

    __slots__ = ("name", "type_code", "type_name", "shape", "data_offset", "n_bytes", "data")

    def __init__(self, name: str, code: int, shape: tuple[int, ...], offset: int, n_bytes: int,
                 data: np.ndarray) -> None:  # fmt: skip
        self.name, self.type_code, self.shape = name, code, shape
        self.type_name = _GGML_TYPES[code][0]
        self.data_offset, self.n_bytes, self.data = offset, n_bytes, data

    @property
    def tensor_type(self) -> Any:
        from gguf import GGMLQuantizationType

        return GGMLQuantizationType(self.type_code)


class _Cursor:
    """Reads GGUF header values from the mapping; running past its end is a GGUFError."""

    def __init__(self, buf: mmap.mmap, path: str) -> None:
        self.buf, self.pos, self.path, self.size = buf, 0, path, len(buf)

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise GGUFError(
                f"{self.path}: truncated or corrupt GGUF file ({what} at byte {self.pos} needs "
                f"{n} bytes; the file has {self.size})"
            )

    def scalar(self, fmt: str, what: str) -> Any:
        n = struct.calcsize("<" + fmt)
        self.need(n, what)
        (v,) = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += n
        return v

    def string(self, what: str) -> str:
        n = self.scalar("Q", what)
        self.need(n, what)
        raw = self.buf[self.pos : self.pos + n]
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def value(self, vtype: int, what: str) -> Any:
        if vtype in _SCALARS:
            v = self.scalar(_SCALARS[vtype], what)
            return bool(v) if vtype == 7 else v
        if vtype == 8:
            return self.string(what)
        if vtype != 9:
            raise GGUFError(f"{self.path}: corrupt GGUF file ({what}: value type {vtype})")
        etype, count = self.scalar("I", what), self.scalar("Q", what)
        if etype == 8:
            buf, pos, out = self.buf, self.pos, []
            unpack = struct.Struct("<Q").unpack_from
            try:
                for _ in range(count):
                    (n,) = unpack(buf, pos)
                    pos += 8
                    if pos + n > self.size:
                        raise struct.error("string past the end")
                    out.append(buf[pos : pos + n].decode("utf-8", errors="replace"))
                    pos += n
            except struct.error:
                raise GGUFError(
                    f"{self.path}: truncated or corrupt GGUF file ({what}: string array)"
                ) from None
            self.pos = pos
            return out
        if etype == 9:  # nested arrays: not used by the models here; skipped
            for _ in range(count):
                self.value(9, what)
            return None
        if etype not in _NP_SCALARS:
            raise GGUFError(f"{self.path}: corrupt GGUF file ({what}: array of type {etype})")
        dt = np.dtype(_NP_SCALARS[etype]).newbyteorder("<")
        self.need(count * dt.itemsize, what)
        arr = np.frombuffer(self.buf, dt, count, self.pos).copy()
        self.pos += count * dt.itemsize
        return arr


# metadata, metadata types, tensor infos (name, dims, ggml type, offset), header end
_Header = tuple[
    dict[str, Any], dict[str, tuple[int, int | None]], list[tuple[str, tuple[int, ...], int, int]],
    int,
]  # fmt: skip


class _HeaderCache:
    """Parsed GGUF headers kept beside the plan cache (``<plan cache>/headers``), so a warm
    start does not walk a 49k-token vocabulary string by string in Python. An entry is used
    only for a file of the same size whose header bytes have the CRC-32 recorded (a file
    rewritten in place within one timestamp tick is still seen); anything else, and any
    unreadable entry, parses the file again. ``LUMINAL_PLAN_CACHE=0`` turns it off."""

    FORMAT = 1

    def _path(self, path: str) -> str | None:
        # the plan cache's switch and folder, read from the flags (the plan cache module sits
        # above the loaders in the layer order)
        if flags.PLAN_CACHE.get().strip().lower() in ("0", "off", "false", "no"):
            return None
        root = flags.PLAN_CACHE_DIR.get() or os.path.join(
            flags.cache_base(),
            "plans",
        )
        real = os.path.realpath(path)
        name = hashlib.sha1(real.encode()).hexdigest()[:24]
        return os.path.join(root, "headers", name + ".json")

    def load(self, path: str, mm: mmap.mmap) -> _Header | None:
        where = self._path(path)
        if where is None:
            return None
        try:
            with open(where, "rb") as fh:
                d = json.loads(fh.read())
            end = int(d["end"])
            if (d["format"] != self.FORMAT or d["size"] != len(mm) or not 0 < end <= len(mm)
                    or zlib.crc32(memoryview(mm)[:end]) != d["crc32"]):  # fmt: skip
                return None
            metadata, types = {}, {}
            for key, vtype, etype, value in d["metadata"]:
                types[key] = (vtype, etype)
                metadata[key] = _decode_value(value)
            infos = [(n, tuple(dims), code, off) for n, dims, code, off in d["tensors"]]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return metadata, types, infos, end

    def store(self, path: str, mm: mmap.mmap, header: _Header) -> None:
        where = self._path(path)
        if where is None:
            return
        metadata, types, infos, end = header
        d = {
            "format": self.FORMAT, "size": len(mm), "end": end,
            "crc32": zlib.crc32(memoryview(mm)[:end]),
            "metadata": [[k, *types[k], _encode_value(v)] for k, v in metadata.items()],
            "tensors": [[n, list(dims), code, off] for n, dims, code, off in infos],
        }  # fmt: skip
        tmp = f"{where}.{os.getpid()}.tmp"
        try:
            os.makedirs(os.path.dirname(where), exist_ok=True)
            with open(tmp, "w") as fh:
                json.dump(d, fh)
            os.replace(tmp, where)  # readers see a whole entry or none
        except OSError:  # a read-only or full disk: parse every time, as without the cache
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _encode_value(v: Any) -> Any:
    if isinstance(v, np.ndarray):  # numeric arrays: their bytes (exact, and fast to load)
        return {"dtype": v.dtype.str, "data": base64.b64encode(v.tobytes()).decode()}
    return v


def _decode_value(v: Any) -> Any:
    if isinstance(v, dict):
        return np.frombuffer(base64.b64decode(v["data"]), np.dtype(v["dtype"])).copy()
    return v


_headers = _HeaderCache()


class GGUFFile:
    """A mapped GGUF file: ``metadata`` (key -> Python value), ``tensors`` (name -> info),
    ``array(name)`` (raw mapped data), ``architecture``. The header is parsed here (the
    ``gguf`` package's reader takes seconds on a 49k-token vocabulary) and kept in the header
    cache unless ``cache_header`` is False."""

    def __init__(self, path: str | os.PathLike[str], cache_header: bool = True) -> None:
        self.path = os.fspath(path)
        self._luminal: dict[str, tuple[str, tuple[int, int]]] | None = None
        size = os.path.getsize(self.path)
        with open(self.path, "rb") as fh:
            magic = fh.read(4)
            if magic != b"GGUF":
                raise GGUFError(f"{self.path}: not a GGUF file (magic {magic!r}, expected b'GGUF')")
            self._mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        # every tensor's data is a view of this array: it keeps the mapping (and its
        # registration) alive while any is used
        self.data = np.frombuffer(self._mm, np.uint8)
        mapped.register(self.data, self.path)  # plans refer to its tensors by offset
        c = _Cursor(self._mm, self.path)
        c.pos = 4
        version = c.scalar("I", "version")
        if version not in (2, 3):
            raise GGUFError(
                f"{self.path}: GGUF version {version} is not supported (2 and 3 are; a "
                "big-endian file reads as a huge version)"
            )
        self.metadata: dict[str, Any]
        # key -> (GGUF value type, element type of an array or None): what a writer copying
        # the metadata needs
        self.metadata_types: dict[str, tuple[int, int | None]]
        header = _headers.load(self.path, self._mm) if cache_header else None
        if header is None:
            header = self._parse_header(c, size)
            if cache_header:  # not for a transient file (a quantizer's intermediate)
                _headers.store(self.path, self._mm, header)
        self.metadata, self.metadata_types, infos, header_end = header
        align = int(self.metadata.get("general.alignment", 32) or 32)
        start = (header_end + align - 1) // align * align
        self.tensors: dict[str, GGUFTensor] = {}
        for name, dims, code, off in infos:
            if code not in _GGML_TYPES:
                raise GGUFError(f"{self.path}: tensor {name!r} has unknown ggml type {code}")
            kind, block, type_size = _GGML_TYPES[code]
            count = int(np.prod(dims, dtype=np.int64)) if dims else 1
            if not dims or dims[0] % block:
                raise GGUFError(
                    f"{self.path}: corrupt GGUF file (tensor {name!r}: {dims[:1]} values per "
                    f"row, not a multiple of {kind}'s block of {block})"
                )
            n_bytes = count // block * type_size
            begin = start + off
            if begin + n_bytes > size:
                raise GGUFError(
                    f"{self.path}: tensor {name!r} ends at byte {begin + n_bytes} "
                    f"but the file has {size} bytes (truncated)"
                )
            raw = self.data[begin : begin + n_bytes]
            np_shape = tuple(reversed(dims))
            if kind in _NP_TENSOR:
                data = raw.view(_NP_TENSOR[kind]).reshape(np_shape)
            else:
                data = raw.reshape(*np_shape[:-1], dims[0] // block * type_size)
            self.tensors[name] = GGUFTensor(name, code, dims, begin, n_bytes, data)

    def _parse_header(self, c: _Cursor, size: int) -> _Header:
        """Metadata, metadata types, tensor infos and the header's end, read from the file."""
        n_tensors, n_kv = c.scalar("Q", "tensor count"), c.scalar("Q", "metadata count")
        if n_tensors > size or n_kv > size:
            raise GGUFError(f"{self.path}: corrupt GGUF file ({n_tensors} tensors, {n_kv} keys)")
        metadata: dict[str, Any] = {}
        types: dict[str, tuple[int, int | None]] = {}
        for _ in range(n_kv):
            key = c.string("metadata key")
            vtype = c.scalar("I", key)
            etype = None
            if vtype == 9 and c.pos + 4 <= c.size:
                (etype,) = struct.unpack_from("<I", self._mm, c.pos)
            types[key] = (vtype, etype)
            metadata[key] = c.value(vtype, key)
        infos = []
        for _ in range(n_tensors):
            name = c.string("tensor name")
            nd = c.scalar("I", name)
            if nd > 8:
                raise GGUFError(f"{self.path}: corrupt GGUF file (tensor {name!r}: {nd} dims)")
            dims = tuple(c.scalar("Q", name) for _ in range(nd))
            code, off = c.scalar("I", name), c.scalar("Q", name)
            infos.append((name, dims, code, off))
        return metadata, types, infos, c.pos

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", "?"))

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def arch_key(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(f"{self.architecture}.{key}", default)

    def need_arch_key(self, key: str) -> Any:
        """``arch_key(key)``, or a ValueError naming the file and the missing key."""
        v = self.arch_key(key)
        if v is None:
            raise ValueError(f"{self.path}: metadata {self.architecture}.{key} is missing")
        return v

    def type_name(self, name: str) -> str:
        return self._tensor(name).type_name

    def shape(self, name: str) -> tuple[int, ...]:
        """PyTorch-order shape (GGUF stores dims innermost first); a luminal-format weight's
        logical shape."""
        if name not in self.tensors and name in self.luminal:
            return self.luminal[name][1]
        return tuple(int(s) for s in reversed(self._tensor(name).shape))

    @property
    def luminal(self) -> dict[str, tuple[str, tuple[int, int]]]:
        """``{weight: (format, (rows, cols))}`` for luminal-format weights (see below)."""
        if self._luminal is None:
            self._luminal = luminal_tensors(self)
        return self._luminal

    def _tensor(self, name: str) -> Any:
        try:
            return self.tensors[name]
        except KeyError:
            raise KeyError(f"{self.path}: no tensor {name!r}") from None

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes, a view of the mapping."""
        t = self._tensor(name)
        return self.data[t.data_offset : t.data_offset + t.n_bytes]

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


# luminal's own formats in a GGUF file (``lowp.py``): metadata ``luminal.quant.<name>`` holds
# '{"format": ..., "shape": [rows, cols]}' and the parts are tensors ``<name>.<part>`` (u8
# parts stored as I8); the weight's own name is absent, so llama.cpp refuses such a file by
# name instead of misreading it
LUMINAL_QUANT_KEY = "luminal.quant."


def luminal_tensors(f: GGUFFile) -> dict[str, tuple[str, tuple[int, int]]]:
    """``{weight name: (format, (rows, cols))}`` for the luminal-format weights of ``f``."""
    out = {}
    for key, val in f.metadata.items():
        if not key.startswith(LUMINAL_QUANT_KEY) or key == LUMINAL_QUANT_KEY + "version":
            continue
        name = key[len(LUMINAL_QUANT_KEY) :]
        try:
            info = json.loads(val)
            fmt, (rows, cols) = str(info["format"]), info["shape"]
            out[name] = (fmt, (int(rows), int(cols)))
        except (TypeError, ValueError, KeyError) as e:
            raise GGUFError(f"{f.path}: bad metadata {key!r} = {val!r} ({e})") from None
        if fmt not in lowp.FORMATS:  # an error here, not at first use
            raise GGUFError(
                f"{f.path}: tensor {name!r} uses luminal format {fmt!r}, which this luminal "
                f"does not know (known: {', '.join(lowp.FORMATS)})"
            )
    return out


class GGUFWeights:
    """A ``WeightSource`` over a GGUF file. ``dequant='graph'`` (default) puts packed blocks in
    the graph with their dequantization expression; ``dequant='load'`` gives f32 arrays."""

    def __init__(self, f: GGUFFile, dequant: str = "graph") -> None:
        if dequant not in ("graph", "load"):
            raise ValueError(f"dequant must be 'graph' or 'load', got {dequant!r}")
        self.file = f
        self.dequant = dequant
        self.lowp = f.luminal
        owned = set()
        for name, (fmt, _) in self.lowp.items():
            for p in lowp.get(fmt).parts:
                pname = f"{name}.{p.name}"
                if pname not in f.tensors:
                    raise GGUFError(f"{f.path}: {fmt} weight {name!r} lacks its part {pname!r}")
                owned.add(pname)
        for name in f.tensors:
            if name in owned:
                continue
            kind = f.type_name(name)
            if kind not in _FLOAT_TYPES and kind not in quants.FORMATS:
                raise GGUFError(
                    f"{f.path}: tensor {name!r} uses quantization {kind}, which luminal does not "
                    f"support (supported: {', '.join([*_FLOAT_TYPES, *quants.FORMATS])})"
                )
        # per graph: weight name -> (node id, layout) of the tensor built for it. Not the
        # Tensor: its node refers to the graph, so the weak key would never die and every
        # graph built from this file (with its folded weights) would stay in memory.
        self._cache: weakref.WeakKeyDictionary[Graph, dict[str, tuple[int, Any]]] = (
            weakref.WeakKeyDictionary()
        )

    def has(self, name: str) -> bool:
        return name in self.file.tensors or name in self.lowp

    def parts(self, name: str) -> dict[str, np.ndarray]:
        """A luminal-format weight's parts, as mapped arrays of the dtypes ``lowp`` defines."""
        fmt, (rows, _) = self.lowp[name]
        out = {}
        for p in lowp.get(fmt).parts:
            raw = self.file.raw(f"{name}.{p.name}").view(p.dtype)
            lead = rows if p.per_row else 1
            if raw.size % lead:
                raise GGUFError(
                    f"{self.file.path}: part {name}.{p.name} has {raw.size} values, not "
                    f"{lead} rows of a {fmt} weight of shape {self.lowp[name][1]}"
                )
            out[p.name] = raw.reshape(lead, -1)
        return out

    def values(self, name: str) -> np.ndarray:
        """The weight's f32 values from the numpy references (``gguf.quants``, ``lowp``):
        what tools such as the quantizer read."""
        if name in self.lowp:
            fmt, shape = self.lowp[name]
            return lowp.get(fmt).dequantize(self.parts(name)).reshape(shape)
        return self.file.dequantize(name)

    def f32(self, name: str) -> np.ndarray | None:
        """The f32 array that evaluating ``get(name)``'s dequantization gives, computed by the
        numpy reference (``gguf.quants``) where that is bit-exact with the graph expression
        (float types and the block formats ``_EXACT_F32``, checked on random blocks in
        tests/test_loaders.py); None for other weights. What folding the expression at
        compile time would make, without interpreting it."""
        if name in self.lowp or name not in self.file.tensors:
            return None
        kind = self.file.type_name(name)
        if kind not in _FLOAT_TYPES and kind not in _EXACT_F32:
            return None
        return np.ascontiguousarray(self.file.dequantize(name), dtype=np.float32)

    def identity(self) -> str:
        """The file's identity (path, size, mtime, inode) and the dequantization mode: what
        the plan cache keys these weights by (no reading)."""
        fid = mapped.file_id(self.file.path)
        return f"gguf:{fid.path}:{fid.size}:{fid.mtime_ns}:{fid.inode}:{self.dequant}"

    def shape(self, name: str) -> tuple[int, ...]:
        if name in self.lowp:
            return self.lowp[name][1]
        return self.file.shape(name)

    def get(self, g: Graph, name: str) -> Tensor:
        per_graph = self._cache.setdefault(g, {})
        hit = per_graph.get(name)
        if hit is not None:
            return Tensor(g.nodes[hit[0]], hit[1])
        t = self._build(g, name)
        per_graph[name] = (t.node.id, t.layout)
        return t

    def _build(self, g: Graph, name: str) -> Tensor:
        if name in self.lowp:
            fmt, lshape = self.lowp[name]
            if self.dequant == "load":
                return g.weight(name, data=self.values(name))
            return lowp.weight(g, name, fmt, self.parts(name), lshape)
        f, kind, shape = self.file, self.file.type_name(name), self.file.shape(name)
        if kind in _FLOAT_TYPES:
            return g.weight(name, data=f.array(name)).cast(dt.f32)
        if self.dequant == "load":
            return g.weight(name, data=f.dequantize(name))
        rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
        return quants.quantized_weight(g, name, kind, f.raw(name), (rows, shape[-1])).reshape(shape)

    def rows(self, g: Graph, name: str, idx: Tensor) -> Tensor:
        """Embedding rows: for packed weights only the blocks of the rows read are dequantized."""
        if name in self.lowp and self.dequant == "graph":
            fmt, lshape = self.lowp[name]
            return lowp.rows(g, name, fmt, self.parts(name), lshape, idx)
        if name in self.lowp:
            return embedding(idx, self.get(g, name))
        f, kind, shape = self.file, self.file.type_name(name), self.file.shape(name)
        if kind in ("F16", "BF16") and len(shape) == 2:
            self.get(g, name)  # registers the stored array once; the rows are cast after
            return embedding(idx, Tensor(g.inputs[name])).cast(dt.f32)
        if kind in _FLOAT_TYPES or self.dequant == "load" or len(shape) != 2:
            return embedding(idx, self.get(g, name))
        return quants.quantized_rows(g, name, kind, f.raw(name), shape, idx)
