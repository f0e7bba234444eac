"""Plans: what the compiler produces and the C++ runtime runs (``.lmp`` files).

``model.py`` is the data model, ``io.py`` the bytes (writer, validating reader, dump); the
layout is documented byte by byte in ``docs/plan-format.md``.

    python -m luminal.plan show model.lmp

This package imports neither torch nor the graph package.
"""

from __future__ import annotations

import mmap
import os
import struct

from . import io as _io
from .model import *  # noqa: F403  (the data model is this package's public surface)
from .model import PlanData, PlanError
from .model import __all__ as _model_all


class Plan(PlanData):
    """A plan with its bytes: ``save`` / ``load`` / ``to_bytes`` / ``from_bytes`` /
    ``describe``."""

    def to_bytes(self) -> bytes:
        return b"".join(self.parts())

    def parts(self) -> list[bytes | memoryview]:
        """The plan's bytes in pieces (header, body, then each inline weight as a view of its
        data, not a copy): ``b"".join(parts)`` is ``to_bytes()``."""
        return list(_io._serialize(self))

    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes the plan, streaming the weight blob (nothing is copied twice)."""
        with open(path, "wb") as f:
            _io._write(self, f)

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview | mmap.mmap) -> Plan:
        try:
            return _io._parse(memoryview(data).cast("B"), cls())
        except PlanError:
            raise
        except (struct.error, ValueError, IndexError, UnicodeDecodeError) as e:
            raise PlanError(f"corrupt plan: {e}") from None

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Plan:
        """Reads a plan; inline weights are views of a read-only mapping of the file."""
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                raise PlanError(f"{os.fspath(path)!r}: empty file, not a luminal plan")
            m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            return cls.from_bytes(m)
        except PlanError as e:
            raise PlanError(f"{os.fspath(path)!r}: {e}") from None

    def describe(self) -> str:
        return _io._describe(self)


from .variants import by_dim  # noqa: E402  (needs the data model above)

__all__ = [*_model_all, "Plan", "by_dim"]
