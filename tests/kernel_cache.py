"""A test's own kernel cache, seeded with the session's precompiled prelude.

Tests that count or clear compiled kernels point LUMINAL_CACHE_DIR at a folder of their own.
Each such folder used to precompile the prelude again: about 2 s and 25 MB a test, 1.5 GB
of temporary files in one run. The prelude is compiled once per session here and hard-linked
into each folder (the compiler finds it by name, as if it had made it there).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

_SHARED: list[str] | None = None


def _shared_prelude() -> list[str]:
    """The session's precompiled prelude (its header and .gch), or [] when it cannot be made."""
    global _SHARED
    if _SHARED is None:
        from luminal import _rt
        from luminal.codegen.cpu.kernel import PRELUDE

        folder = tempfile.mkdtemp(prefix="luminal-test-prelude-")
        atexit.register(shutil.rmtree, folder, True)
        before = os.environ.get("LUMINAL_CACHE_DIR")
        os.environ["LUMINAL_CACHE_DIR"] = folder
        try:
            header = _rt.precompile_prelude(PRELUDE)
        except RuntimeError:
            header = ""
        finally:
            if before is None:
                del os.environ["LUMINAL_CACHE_DIR"]
            else:
                os.environ["LUMINAL_CACHE_DIR"] = before
        _SHARED = [header, header + ".gch"] if header else []
    return _SHARED


def use_kernel_cache(monkeypatch: pytest.MonkeyPatch, folder: Path) -> Path:
    """Points LUMINAL_CACHE_DIR at `folder`, with the precompiled prelude already in it."""
    folder.mkdir(parents=True, exist_ok=True)
    for path in _shared_prelude():
        target = folder / os.path.basename(path)
        if not target.exists():
            try:
                os.link(path, target)
            except OSError:  # another file system: a copy still saves the compile
                shutil.copy2(path, target)
    monkeypatch.setenv("LUMINAL_CACHE_DIR", str(folder))
    return folder
