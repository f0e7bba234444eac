"""Which file a mapped weight array lives in.

The loaders map GGUF and safetensors files and hand out numpy views of the mapping. They
register each mapping here, so that a plan can refer to a weight by (file, offset) instead of
copying its bytes (``luminal.plan_cache``), and so that a cache key can name a weight by the
identity of its file instead of hashing its contents. A mapping is forgotten when its array
is garbage collected (a weak reference), so a reused address is never misattributed.
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass

import numpy as np

__all__ = ["FileId", "file_id", "locate", "register"]


@dataclass(frozen=True)
class FileId:
    """What identifies a file's contents without reading them: its real path, size,
    modification time and inode. A rewritten file changes at least its mtime."""

    path: str
    size: int
    mtime_ns: int
    inode: int

    def current(self) -> bool:
        """Whether the file on disk is still this one."""
        try:
            return file_id(self.path) == self
        except OSError:
            return False


def file_id(path: str | os.PathLike[str]) -> FileId:
    real = os.path.realpath(os.fspath(path))
    st = os.stat(real)
    return FileId(real, st.st_size, st.st_mtime_ns, st.st_ino)


# start address -> (end address, weak reference to the array over the mapping, file)
_MAPS: dict[int, tuple[int, weakref.ref[np.ndarray], FileId]] = {}


def register(whole: np.ndarray, path: str | os.PathLike[str]) -> None:
    """Record that ``whole`` (a 1-D uint8 array over the entire mapping) maps ``path``."""
    start = int(whole.__array_interface__["data"][0])
    ident = file_id(path)

    def forget(_: object, start: int = start) -> None:
        entry = _MAPS.get(start)
        if entry is not None and entry[1]() is None:
            del _MAPS[start]

    _MAPS[start] = (start + whole.nbytes, weakref.ref(whole, forget), ident)


def locate(arr: np.ndarray) -> tuple[FileId, int] | None:
    """``(file, byte offset)`` when ``arr`` is a C-contiguous view of a registered mapping
    whose bytes are exactly ``arr``'s; None otherwise (a copy, a strided view, in memory)."""
    if not isinstance(arr, np.ndarray) or not arr.flags.c_contiguous or arr.nbytes == 0:
        return None
    addr = int(arr.__array_interface__["data"][0])
    for start, (end, ref, ident) in list(_MAPS.items()):
        if start <= addr and addr + arr.nbytes <= end and ref() is not None:
            return ident, addr - start
    return None
