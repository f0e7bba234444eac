"""Compiled plans cached on disk: compile once, load the plan every time after.

An entry is keyed by everything that determines the plan: what was compiled (a graph's
fingerprint, or a model's definition: config and build options), the identity of the weight
files it reads (real path, size, mtime, inode) or a content hash of in-memory weights, the
compile options, the target (backend, CPU model and features), luminal's version and a digest
of its installed code, and the flags that steer the compiler. Any change misses.

Layout, under ``$LUMINAL_PLAN_CACHE_DIR`` (default ``$LUMINAL_CACHE_DIR/plans``, itself
defaulting to ``~/.cache/luminal``)::

    <digest>.lmp      the plan; weights that are bytes of a mapped GGUF/safetensors file are
                      references to it (file + offset)
    <digest>.weights  weights the compiler made (folded, repacked), mapped by the runtime
    <digest>.json     the key parts, each file's size, CRC-32 and identity, and the identity
                      of the weight files the plan refers to
    <digest>.lock   held while one process compiles that key (others wait, then load)

Writes go to a temporary name and are renamed into place, the metadata last, so a reader
sees a whole entry or none. An entry whose files disagree with its metadata (size; checksum
when a file's identity changed since it was written) or whose weight files changed is
removed and rebuilt, never run. A size limit
(``LUMINAL_PLAN_CACHE_MB``) evicts the least recently used entries; ``luminal cache list``
and ``luminal cache clear`` show and empty it; ``LUMINAL_PLAN_CACHE=0`` turns it off.
The compiled kernels beside it (``$LUMINAL_CACHE_DIR``) have a limit of their own
(``LUMINAL_KERNEL_CACHE_MB``, ``evict_kernels``). See docs/plan-cache.md.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import platform
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import flags
from ._version import __version__
from .loaders import mapped

__all__ = [
    "CacheEntry",
    "Key",
    "PlanCache",
    "code_id",
    "cpu_id",
    "default_cache",
    "enabled",
    "graph_fingerprint",
    "make_key",
    "weight_identity",
]

ENTRY_FORMAT = 2  # of the .json metadata; another value is another cache
# flags that never change what the compiler produces
_NEUTRAL_FLAGS = {"LUMINAL_DEBUG", "LUMINAL_CACHE_DIR", "LUMINAL_PLAN_CACHE",
                  "LUMINAL_PLAN_CACHE_DIR", "LUMINAL_PLAN_CACHE_MB"}  # fmt: skip


def enabled() -> bool:
    v = flags.PLAN_CACHE.get().strip().lower()
    if v in ("0", "off", "false", "no"):
        return False
    if v in ("1", "on", "true", "yes", ""):
        return True
    raise ValueError(f"LUMINAL_PLAN_CACHE must be 1 or 0, got {v!r}")


def cache_root() -> Path:
    d = flags.PLAN_CACHE_DIR.get()
    if d:
        return Path(d)
    base = flags.cache_base()
    return Path(base) / "plans"


# ---------------------------------------------------------------------------- key parts
_CODE_ID: str | None = None
_RENDER_ID: str | None = None


def _digest(roots: list[str]) -> str:
    """Version, then size and mtime of every source and built file under ``roots`` and of the
    native module. Stats only: ~1 ms, no reading."""
    import importlib.util

    h = hashlib.sha1(__version__.encode())
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for fn in sorted(filenames):
                if fn.endswith((".py", ".so", ".pyd", ".dylib", ".egg", ".json")):
                    st = os.stat(os.path.join(dirpath, fn))
                    rel = os.path.relpath(os.path.join(dirpath, fn), root)
                    h.update(f"{rel}:{st.st_size}:{st.st_mtime_ns};".encode())
    spec = importlib.util.find_spec("luminal._rt")
    if spec is not None and spec.origin:
        st = os.stat(spec.origin)
        h.update(f"native:{st.st_size}:{st.st_mtime_ns};".encode())
    return h.hexdigest()[:20]


def _package_roots() -> list[str]:
    # an editable install has two: sources and built files
    return list(sys.modules[__package__ or "luminal"].__path__)


def code_id() -> str:
    """A digest of luminal's installed code: the package's files and the native module. A
    changed compiler is another compiler, so its plans are other plans."""
    global _CODE_ID
    if _CODE_ID is None:
        _CODE_ID = _digest(_package_roots())
    return _CODE_ID


def render_id() -> str:
    """A digest of the code that turns kernel IR into machine code: ``codegen/`` and the
    native module (library calls, the executor). The search's decisions are keyed by the
    kernel IR they compared, so a change there needs no more; a changed renderer makes the
    same IR another program, and decisions measured with the old one must not be reused."""
    global _RENDER_ID
    if _RENDER_ID is None:
        _RENDER_ID = _digest([os.path.join(r, "codegen") for r in _package_roots()])
    return _RENDER_ID


_CPU_ID: str | None = None


def cpu_id() -> str:
    """The CPU model, its feature flags and the core count (generated kernels use
    ``-march=native``; the search measured on these cores)."""
    global _CPU_ID
    if _CPU_ID is None:
        parts = [platform.machine(), platform.system(), str(os.cpu_count())]
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if not line.strip():
                        break  # the first processor says it for all
                    k, _, v = line.partition(":")
                    if k.strip() in ("model name", "flags", "Features", "CPU part"):
                        parts.append(v.strip())
        except OSError:
            parts.append(platform.processor())
        _CPU_ID = hashlib.sha1("|".join(parts).encode()).hexdigest()[:16]
    return _CPU_ID


def _compiler_flags() -> dict[str, str]:
    return {f.name: f.get() for f in flags.ALL if f.name not in _NEUTRAL_FLAGS}


def weight_identity(arr: Any) -> list[Any]:
    """How a key names one weight: its file and byte offset when it is a view of a mapped
    GGUF/safetensors file (no reading), else a hash of its bytes; with dtype and shape."""
    a = np.asarray(arr)
    head = [str(a.dtype), list(a.shape)]
    where = mapped.locate(a)
    if where is not None:
        fid, off = where
        return [*head, "file", fid.path, fid.size, fid.mtime_ns, fid.inode, off]
    data = np.ascontiguousarray(a)
    return [*head, "sha1", hashlib.sha1(data.reshape(-1).view(np.uint8).data).hexdigest()]


def graph_fingerprint(graph: Any) -> dict[str, Any]:
    """A graph's structure (every node: op, dtype, shape, arg, sources with their views),
    its dims with bounds, outputs and in-place updates, and each weight's identity."""
    h = hashlib.sha1()
    for n in graph.nodes:
        srcs = ",".join(f"{m.id}:{v!r}" for m, v in n.srcs)
        h.update(f"{n.id}|{n.op.name}|{n.dtype.name}|{list(n.shape)}|{n.arg!r}|{srcs}\n".encode())
    dims = {name: [d.lo, d.hi] for name, d in sorted(graph.dims().items())}
    weights = {name: weight_identity(a) for name, a in sorted(graph.weights.items())}
    wh = hashlib.sha1(json.dumps(weights, sort_keys=True).encode()).hexdigest()
    files = sorted({w[4] for w in weights.values() if w[2] == "file"})
    return {"graph": graph.name, "nodes": h.hexdigest(), "dims": dims,
            "outputs": list(graph.outputs), "state": dict(sorted(graph.state.items())),
            "weights": wh, "weight_files": files}  # fmt: skip


@dataclass(frozen=True)
class Key:
    """The parts of a cache key (JSON values) and their digest, the entry's file name."""

    parts: dict[str, Any]

    @property
    def digest(self) -> str:
        text = json.dumps(self.parts, sort_keys=True, default=str)
        return hashlib.sha1(text.encode()).hexdigest()[:32]


def make_key(what: dict[str, Any], backend: str, options: dict[str, Any] | None = None) -> Key:
    """The key of compiling ``what`` (a graph fingerprint or a model description) for
    ``backend`` with compile ``options``, on this machine with this luminal."""
    from .plan import FORMAT_VERSION

    return Key({
        "entry_format": ENTRY_FORMAT,
        "what": what,
        "backend": backend,
        "options": dict(sorted((options or {}).items())),
        "luminal": __version__,
        "code": code_id(),
        "cpu": cpu_id(),
        "flags": _compiler_flags(),
        "plan_format": FORMAT_VERSION,
    })  # fmt: skip


# ---------------------------------------------------------------------------- the store
@dataclass
class CacheEntry:
    digest: str
    path: Path  # the .lmp file
    size: int  # bytes of the plan file and its weights file
    last_used: float  # seconds since the epoch
    name: str  # what was compiled (graph name)
    meta: dict[str, Any]


def _stat_id(st: os.stat_result) -> list[int]:
    return [st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size]


def _write_blob(path: Path, parts: Any) -> dict[str, Any]:
    """Writes ``parts`` (bytes-like pieces) atomically to ``path``; its metadata entry."""
    crc, size = 0, 0

    def chunks() -> Iterator[bytes | memoryview]:
        nonlocal crc, size
        for part in parts:
            b = part if isinstance(part, bytes) else memoryview(part).cast("B")
            crc = zlib.crc32(b, crc)
            size += len(b)
            yield b

    _write_atomic(path, chunks())
    # as written: a later change of the file is checksummed before it is used
    return {"name": path.name, "size": size, "crc32": crc, "stat": _stat_id(path.stat())}


# inline weights at least this large go to the entry's weights file
_WEIGHTS_FILE_MIN = 1 << 16


def _weights_file(plan: Any, name: str) -> tuple[Any, list[Any] | None]:
    """``plan`` with its large inline weights moved to a file ``name`` beside it (64-byte
    aligned, referred to by a relative path), and that file's pieces; (plan, None) when it
    has none. The runtime maps that file and checks no checksum of it: the cache checks it
    (by file identity, or its checksum once it changed), and the plan file stays small, so
    the runtime's checksum of the plan file costs nothing next to a 0.5 GB weight blob."""
    from .plan import FileWeight, InlineWeight, Plan
    from .plan.model import _weight_bytes

    pieces: list[Any] = []
    at = 0
    weights: list[Any] = []
    for w in plan.weights:
        if isinstance(w, InlineWeight):
            data = _weight_bytes(w, plan.buffers[w.buffer])
            if data.nbytes >= _WEIGHTS_FILE_MIN:
                pad = -at % 64
                if pad:
                    pieces.append(bytes(pad))
                    at += pad
                weights.append(FileWeight(w.buffer, name, at, data.nbytes))
                pieces.append(data)
                at += data.nbytes
                continue
        weights.append(w)
    if not pieces:
        return plan, None
    out = Plan(backend=plan.backend, arch=plan.arch, dims=plan.dims, buffers=plan.buffers,
               kernels=plan.kernels, steps=plan.steps, weights=weights,
               metadata=plan.metadata)  # fmt: skip
    return out, pieces


def _crc32_file(path: Path, size: int) -> int:
    """CRC-32 of a file read in chunks (into one reused buffer: no resident copy of it)."""
    crc = 0
    buf = bytearray(8 << 20)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        left = size
        while left:
            n = f.readinto(view[: min(len(buf), left)])
            if not n:
                break
            crc = zlib.crc32(view[:n], crc)
            left -= n
    return crc


@contextlib.contextmanager
def _flock(path: Path, exclusive: bool = True) -> Iterator[None]:
    """An advisory lock on ``path`` (created if missing), released on exit."""
    try:
        import fcntl
    except ImportError:  # no fcntl (Windows): atomic renames still keep entries whole
        yield
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _write_atomic(path: Path, chunks: Any) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        if hasattr(os, "fchmod"):  # mkstemp makes it private; entries are plain cache files
            os.fchmod(fd, 0o644)
        with os.fdopen(fd, "wb") as f:
            for c in chunks:
                f.write(c)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class PlanCache:
    """A folder of cached plans (see the module docstring). ``limit_bytes`` defaults to
    ``LUMINAL_PLAN_CACHE_MB``."""

    def __init__(self, root: str | os.PathLike[str] | None = None,
                 limit_bytes: int | None = None) -> None:  # fmt: skip
        self.root = Path(root) if root is not None else cache_root()
        if limit_bytes is None:
            limit_bytes = int(flags.PLAN_CACHE_MB.as_float() * 2**20)
        if limit_bytes < 0:
            raise ValueError(f"plan cache size limit must be >= 0 bytes, got {limit_bytes}")
        self.limit_bytes = limit_bytes

    def _paths(self, digest: str) -> tuple[Path, Path]:
        return self.root / f"{digest}.lmp", self.root / f"{digest}.json"

    def _files(self, digest: str) -> list[Path]:
        """Every file of an entry (the weights file exists for plans with large weights the
        compiler made)."""
        plan, meta = self._paths(digest)
        return [plan, meta, self.root / f"{digest}.weights"]

    def _ensure_root(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)

    # -- reading -----------------------------------------------------------------------------
    def lookup(self, key: Key) -> Path | None:
        """The plan file of ``key`` when a whole, unchanged entry exists (its last use is
        updated); None otherwise. A damaged entry is removed."""
        plan, meta_path = self._paths(key.digest)
        try:
            with open(meta_path) as f:
                meta = json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            self._remove(key.digest, "unreadable metadata")
            return None
        problem = self._check(meta, key, plan)
        if problem is not None:
            self._remove(key.digest, problem)
            return None
        with contextlib.suppress(OSError):
            os.utime(meta_path)  # last use, for eviction
        return plan

    def _check(self, meta: Any, key: Key, plan: Path) -> str | None:
        if not isinstance(meta, dict) or meta.get("entry_format") != ENTRY_FORMAT:
            return "metadata of another format"
        if meta.get("key") != json.loads(json.dumps(key.parts, sort_keys=True, default=str)):
            return "metadata of another key"  # a digest collision, or tampering
        for f in meta.get("files", []):
            fid = mapped.FileId(f["path"], f["size"], f["mtime_ns"], f["inode"])
            if not fid.current():
                return f"weight file {fid.path} changed or is missing"
        blobs = meta.get("blobs")
        if not isinstance(blobs, list) or not blobs:
            return "metadata lists no files"
        changed = False
        allowed = {plan.name, plan.stem + ".weights"}
        for b in blobs:
            if not isinstance(b, dict) or b.get("name") not in allowed:
                return "metadata names a file outside the entry"
            problem = self._check_blob(plan.parent / str(b["name"]), b)
            if problem == "rechecked":
                changed = True
            elif problem is not None:
                return problem
        if changed:  # the same bytes (touched or copied): fast again next time
            with contextlib.suppress(OSError):
                text = json.dumps(meta, sort_keys=True).encode()
                _write_atomic(plan.with_suffix(".json"), [text])
        return None

    @staticmethod
    def _check_blob(path: Path, b: dict[str, Any]) -> str | None:
        """None when ``path`` is the file ``b`` describes, ``"rechecked"`` when its bytes
        are but its times changed (``b`` updated), else what is wrong."""
        try:
            st = path.stat()
        except OSError:
            return f"{path.name} is missing"
        if st.st_size != b.get("size"):
            return f"{path.name} is {st.st_size} bytes, expected {b.get('size')} (truncated?)"
        # A file untouched since it was written and checked (same inode, mtime and ctime: any
        # write or rename changes ctime) is not read again: reading a 0.5 GB prefill plan
        # costs more than the rest of a warm start. Anything else is checksummed.
        if b.get("stat") == _stat_id(st):
            return None
        if _crc32_file(path, st.st_size) != b.get("crc32"):
            return f"{path.name}: checksum mismatch (corrupt)"
        b["stat"] = _stat_id(st)
        return "rechecked"

    def _remove(self, digest: str, why: str) -> None:
        if flags.debug() >= 1:
            import sys

            print(f"luminal: plan cache: dropping {digest}: {why}", file=sys.stderr)
        for p in self._files(digest):
            with contextlib.suppress(OSError):
                p.unlink()

    # -- writing -----------------------------------------------------------------------------
    def store(self, key: Key, plan: Any, sources: Mapping[str, np.ndarray] | None = None) -> Path:
        """Writes ``plan`` (a ``luminal.plan.Plan``) under ``key`` and returns its file. Weights
        that are bytes of a mapped file are stored as references to it (``externalize``)."""
        self._ensure_root()
        plan, files = externalize(plan, sources)
        files += self._entry_files(plan)
        path, meta_path = self._paths(key.digest)
        blobs = []
        plan, weights = _weights_file(plan, f"{key.digest}.weights")
        if weights is not None:
            wpath = self.root / f"{key.digest}.weights"
            blobs.append(_write_blob(wpath, weights))
        blobs.insert(0, _write_blob(path, plan.parts()))
        meta = {
            "entry_format": ENTRY_FORMAT,
            "key": key.parts,
            "blobs": blobs,
            "name": plan.metadata.get("graph", ""),
            "kernels": len(plan.kernels),
            "created": time.time(),
            "files": [f.__dict__ for f in files],
        }
        text = json.dumps(meta, sort_keys=True, default=str).encode()
        _write_atomic(meta_path, [text])
        self.evict(keep=key.digest)
        return path

    def _entry_files(self, plan: Any) -> list[mapped.FileId]:
        """The weights files of other entries that ``plan`` refers to (by a name relative to
        this folder: a plan made of cached plans, such as one of their variants). They are
        checked like model files: when one is rebuilt or evicted, this entry is too."""
        from .plan import FileWeight

        names = {w.path for w in plan.weights if isinstance(w, FileWeight)}
        return [mapped.file_id(self.root / n) for n in sorted(names) if not os.path.isabs(n)]

    def get_or_build(self, key: Key, build: Callable[[], Any]) -> tuple[Path, Any]:
        """``(plan file, None)`` on a hit; on a miss ``build()`` runs and returns a Plan, or a
        (Plan, the graph's weights by name) pair (see ``externalize``); the plan is stored, and
        ``(plan file, what build returned)`` comes back. One process builds a key at a time;
        the others wait for it and then load its entry."""
        hit = self.lookup(key)
        if hit is not None:
            return hit, None
        self._ensure_root()
        with _flock(self.root / f"{key.digest}.lock"):
            hit = self.lookup(key)  # built by another process while we waited
            if hit is not None:
                return hit, None
            built = build()
            plan, sources = built if isinstance(built, tuple) else (built, None)
            return self.store(key, plan, sources), built

    # -- listing and eviction ----------------------------------------------------------------
    def entries(self) -> list[CacheEntry]:
        """Whole entries, most recently used first."""
        out: list[CacheEntry] = []
        if not self.root.is_dir():
            return out
        for meta_path in self.root.glob("*.json"):
            digest = meta_path.stem
            plan = self.root / f"{digest}.lmp"
            try:
                with open(meta_path) as f:
                    meta = json.load(f)
                used = meta_path.stat().st_mtime
                size = sum(p.stat().st_size for p in self._files(digest) if p.exists())
                size -= meta_path.stat().st_size
            except (OSError, ValueError):
                continue
            name = str(meta.get("name", "")) if isinstance(meta, dict) else ""
            out.append(CacheEntry(digest, plan, size, used, name, meta))
        return sorted(out, key=lambda e: -e.last_used)

    def total_bytes(self) -> int:
        return sum(e.size for e in self.entries())

    def evict(self, keep: str | None = None) -> list[str]:
        """Removes least recently used entries until the total fits the limit (never
        ``keep``), and leftovers of interrupted writes; returns the removed digests."""
        if not self.root.is_dir():
            return []
        removed: list[str] = []
        with _flock(self.root / ".lock"):
            entries = self.entries()
            total = sum(e.size for e in entries)
            for e in reversed(entries):  # oldest first
                if total <= self.limit_bytes:
                    break
                if e.digest == keep:
                    continue
                self._remove(e.digest, "evicted (size limit)")
                total -= e.size
                removed.append(e.digest)
            self._sweep()
        evict_kernels(every_s=KERNEL_SCAN_EVERY_S)
        return removed

    def _sweep(self, older_than_s: float = 3600.0) -> None:
        """Deletes temporary files of writes that died, and plans, weights and build locks
        without metadata (an hour old: a build may still be writing them)."""
        now = time.time()
        for p in self.root.iterdir():
            try:
                age = now - p.stat().st_mtime
            except OSError:
                continue
            orphan = p.suffix in (".lmp", ".weights", ".lock") and p.name != ".lock"
            orphan = orphan and not p.with_suffix(".json").exists()
            if (p.suffix == ".tmp" or orphan) and age > older_than_s:
                with contextlib.suppress(OSError):
                    p.unlink()

    def clear(self) -> int:
        """Removes every entry, and the parsed GGUF headers kept beside them
        (``headers/``, see ``loaders.gguf``); returns how many entries there were."""
        if not self.root.is_dir():
            return 0
        n = 0
        with _flock(self.root / ".lock"):
            for p in self.root.iterdir():
                if p.suffix in (".lmp", ".json", ".weights", ".tmp", ".lock") and p.name != ".lock":
                    n += p.suffix == ".json"
                    with contextlib.suppress(OSError):
                        p.unlink()
            headers = self.root / "headers"
            for p in headers.iterdir() if headers.is_dir() else []:
                if p.suffix in (".json", ".tmp"):
                    with contextlib.suppress(OSError):
                        p.unlink()
        return n


# A compiled kernel used this recently is never removed: a process may be about to load it
# (the runtime checks a library exists, then opens it).
KERNEL_IDLE_S = 3600.0
# The plan cache's evictions look at the kernels at most this often (a folder of 20k kernels
# takes 0.2 s to list), noted by the time of a stamp file in it.
KERNEL_SCAN_EVERY_S = 600.0


def evict_kernels(limit_bytes: int | None = None, every_s: float = 0.0) -> list[str]:
    """Removes compiled kernel libraries (``cpu-*.so``, the ``.ref`` files naming a group's
    library, device binaries) unused longest until their total fits ``limit_bytes`` (default
    ``LUMINAL_KERNEL_CACHE_MB``); returns the removed paths. Nothing breaks: the runtime
    compiles a missing kernel again from the plan's source. Last use is the file's access
    time (or its write time, if later; file systems mounted ``relatime`` update access times
    about daily, which is as fine as this needs). With ``every_s``, nothing is done when
    the last look was more recent."""
    if limit_bytes is None:
        limit_bytes = int(flags.KERNEL_CACHE_MB.as_float() * 2**20)
    base = Path(flags.cache_base())
    stamp = base / "kernels-checked"
    now = time.time()
    with contextlib.suppress(OSError):
        if every_s > 0 and now - stamp.stat().st_mtime < every_s:
            return []
    if base.is_dir():
        with contextlib.suppress(OSError):
            stamp.touch()
    files: list[tuple[float, int, Path]] = []
    for folder, pattern in ((base, "cpu-*"), (base / "cuda", "*")):
        for p in folder.glob(pattern) if folder.is_dir() else []:
            try:
                st = p.stat()
            except OSError:
                continue
            files.append((max(st.st_atime, st.st_mtime), st.st_size, p))
    total = sum(f[1] for f in files)
    removed: list[str] = []
    for used, size, p in sorted(files, key=lambda f: f[0]):
        if total <= limit_bytes or now - used < KERNEL_IDLE_S:
            break
        with contextlib.suppress(OSError):
            p.unlink()
            removed.append(str(p))
            total -= size
    return removed


def default_cache() -> PlanCache | None:
    """The cache the entry points use, or None when ``LUMINAL_PLAN_CACHE=0`` or its folder
    cannot be created (then everything compiles, as without a cache)."""
    if not enabled():
        return None
    cache = PlanCache()
    try:
        cache._ensure_root()
    except OSError as e:
        if e.errno not in (errno.EACCES, errno.EROFS, errno.EPERM, errno.ENOSPC):
            raise
        return None
    return cache


def externalize(
    plan: Any, sources: Mapping[str, np.ndarray] | None = None
) -> tuple[Any, list[mapped.FileId]]:
    """``plan`` with each inline weight that is exactly the bytes of a mapped weight file
    replaced by a reference to that file (absolute path, offset), and the files referred to.
    The runtime maps those files: the page cache holds one copy for every process. A weight is
    found in a file when its data is a view of the mapping, or when ``sources`` (the graph's
    weights by name) has a mapped array of that name with the same bytes."""
    from .plan import FileWeight, InlineWeight, Plan

    files: dict[str, mapped.FileId] = {}
    weights: list[Any] = []
    for w in plan.weights:
        buf = plan.buffers[w.buffer]
        ref = _file_bytes(w, buf, sources) if isinstance(w, InlineWeight) else None
        if ref is not None:
            fid, off, n = ref
            files[fid.path] = fid
            weights.append(FileWeight(w.buffer, fid.path, off, n))
        else:
            weights.append(w)
    if not files:
        return plan, []
    out = Plan(backend=plan.backend, arch=plan.arch, dims=plan.dims, buffers=plan.buffers,
               kernels=plan.kernels, steps=plan.steps, weights=weights,
               metadata=plan.metadata)  # fmt: skip
    return out, list(files.values())


def _file_bytes(
    w: Any, buf: Any, sources: Mapping[str, np.ndarray] | None
) -> tuple[mapped.FileId, int, int] | None:
    # 4-bit types are packed in a plan but one value per byte in numpy: never a plain view
    if buf.dtype.bits < 8 or not isinstance(w.data, (np.ndarray, memoryview)):
        return None
    data = np.asarray(w.data)
    where = mapped.locate(data)
    if where is not None:
        return where[0], where[1], data.nbytes
    src = sources.get(buf.name) if sources is not None else None
    where = mapped.locate(src) if isinstance(src, np.ndarray) else None
    if where is None or src is None or src.nbytes != data.nbytes:
        return None
    # the plan's copy of a graph weight of the same name: the same bytes, or transformed
    if not np.array_equal(src.reshape(-1).view(np.uint8), data.reshape(-1).view(np.uint8)):
        return None
    return where[0], where[1], data.nbytes
