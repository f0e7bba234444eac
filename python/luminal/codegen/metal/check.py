"""Type-check generated MSL without a Mac: clang (C++ for OpenCL, which knows address
spaces) against a stub ``metal_stdlib`` (``csrc/metal/stub/``) that declares only what the
kernels use. It catches syntax and type errors, a pointer in the wrong address space
(``device`` vs ``threadgroup``), undeclared or misspelled functions and any use of
``double`` (Metal has none); an allowlist catches misspelled ``[[attributes]]``, which clang
ignores, and each kernel's ``[[buffer(i)]]`` indices must be 0, 1, 2, ... in order. What it
cannot catch: anything only Apple's compiler knows (MSL-version features, resource limits),
and wrong results.

    python -m luminal.targets.metal FILE.lmp ...   # the MSL kernels of saved plans
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .kernel import PRELUDE

CLANG = "clang-19"  # Debian's clang 14 cannot parse the stub; 19 is in CI
FLAGS = ("-x", "clcpp", "-cl-std=clc++2021", "-target", "x86_64-unknown-linux-gnu",
         "-cl-no-stdinc", "-fsyntax-only", "-Wno-unknown-attributes", "-ferror-limit=0")  # fmt: skip
ATTRIBUTES = frozenset({
    "buffer", "threadgroup_position_in_grid", "thread_position_in_threadgroup",
    "threadgroups_per_grid", "thread_index_in_simdgroup", "simdgroup_index_in_threadgroup",
})  # fmt: skip
BATCH = 400  # kernels per clang call (one translation unit)


@dataclass
class Failure:
    kernel: str
    message: str


def stub_dir() -> Path:
    """The folder of the stub ``metal_stdlib`` (in the source tree, beside the runtime)."""
    here = Path(__file__).resolve()
    for up in here.parents:
        d = up / "csrc" / "metal" / "stub"
        if (d / "metal_stdlib").is_file():
            return d
    raise FileNotFoundError(
        "the stub metal_stdlib (csrc/metal/stub/) is not here: the MSL check runs from a "
        "source checkout of luminal"
    )


def clang() -> str | None:
    """The clang that can run the check, or None."""
    return shutil.which(CLANG)


_ATTR = re.compile(r"\[\[\s*([A-Za-z_]\w*)\s*(?:\(([^)]*)\))?\s*\]\]")
_KERNEL = re.compile(r"\bkernel\s+void\s+(\w+)\s*\(")


def lint(name: str, source: str) -> list[str]:
    """What clang does not check: attribute names, buffer indices in order."""
    out = []
    buffers = []
    for m in _ATTR.finditer(source):
        if m.group(1) not in ATTRIBUTES:
            out.append(f"unknown attribute [[{m.group(1)}]]")
        elif m.group(1) == "buffer":
            buffers.append(m.group(2).strip() if m.group(2) else "")
    want = [str(i) for i in range(len(buffers))]
    if buffers != want:
        out.append(f"[[buffer(i)]] indices are {buffers}, not {want}")
    return out


def typecheck(kernels: Sequence[tuple[str, str]], batch: int = BATCH) -> tuple[int, list[Failure]]:
    """Type-check ``(name, msl)`` kernels (identical sources once); returns how many distinct
    kernels were checked and what failed, each failure naming its kernel."""
    exe = clang()
    if exe is None:
        raise RuntimeError(f"{CLANG} is not installed: it type-checks MSL (apt install clang-19)")
    unique = list({src: name for name, src in kernels}.items())
    failures: list[Failure] = []
    for name_src in [unique[i : i + batch] for i in range(0, len(unique), batch)]:
        failures += _check_batch(exe, [(n, s) for s, n in name_src])
    return len(unique), failures


def join(kernels: Sequence[tuple[str, str]]) -> tuple[str, list[tuple[int, str]], list[str]]:
    """One translation unit of many kernels: the prelude once, then each kernel with its
    entry points renamed apart (kernels of different plans share names). Returns the text,
    (first line, kernel name) of each, and each kernel's first entry point's new name."""
    parts = [PRELUDE]
    starts: list[tuple[int, str]] = []
    entries: list[str] = []
    line = PRELUDE.count("\n") + 1
    for i, (name, src) in enumerate(kernels):
        body = src[len(PRELUDE) :] if src.startswith(PRELUDE) else src
        renamed: list[str] = []

        def rename(m: re.Match[str], i: int = i, renamed: list[str] = renamed) -> str:
            renamed.append(f"{m.group(1)}__lm{i}")
            return f"kernel void {renamed[-1]}("

        body = _KERNEL.sub(rename, body)
        entries.append(renamed[0] if renamed else "")
        starts.append((line, name))
        parts.append(body if body.endswith("\n") else body + "\n")
        line += parts[-1].count("\n")
    return "".join(parts), starts, entries


def _check_batch(exe: str, kernels: list[tuple[str, str]]) -> list[Failure]:
    """One translation unit (``join``); clang's errors are mapped back to kernels by line."""
    failures = [Failure(name, msg) for name, src in kernels for msg in lint(name, src)]
    text, starts, _ = join(kernels)
    with tempfile.TemporaryDirectory(prefix="luminal-msl-") as tmp:
        path = os.path.join(tmp, "kernels.metal")
        with open(path, "w") as f:
            f.write(text)
        r = subprocess.run([exe, *FLAGS, "-I", str(stub_dir()), path],
                           capture_output=True, text=True)  # fmt: skip
    if r.returncode == 0:
        return failures
    seen = False
    for m in re.finditer(rf"^{re.escape(path)}:(\d+):\d+: (error: .*)$", r.stderr, re.M):
        seen = True
        ln = int(m.group(1))
        owner = "prelude"
        for start, name in starts:
            if ln >= start:
                owner = name
        failures.append(Failure(owner, m.group(2)))
    if not seen:  # an error in the stub itself, or clang failed to run
        failures.append(Failure("(clang)", r.stderr.strip()[-2000:]))
    return failures
