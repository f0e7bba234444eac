"""The Metal runtime (csrc/metal/, Objective-C++, built only on macOS) passes a syntax check
with clang against stub Metal/Foundation/MPS headers (csrc/metal/stub/), and the check fails
on broken calls. Nothing here runs Metal."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = os.path.join(ROOT, "csrc", "metal", "metal_backend.mm")
CLANGXX = shutil.which("clang++-19")
FLAGS = ["-x", "objective-c++", "-std=c++20", "-fsyntax-only", "-fobjc-runtime=gnustep-2.0",
         "-fobjc-arc", "-Wall", "-Wextra", "-Werror", "-I", os.path.join(ROOT, "csrc", "metal"),
         "-I", os.path.join(ROOT, "csrc", "metal", "stub")]  # fmt: skip

pytestmark = pytest.mark.skipif(CLANGXX is None, reason="clang++-19 not installed")


def _check(source: str, tmp_path) -> subprocess.CompletedProcess:
    # its includes ("metal_backend.hpp", "../backend.hpp") resolve through -I csrc/metal
    path = tmp_path / "metal_backend.mm"
    path.write_text(source)
    return subprocess.run([CLANGXX, *FLAGS, str(path)], capture_output=True, text=True)


def test_runtime_syntax_checks(tmp_path) -> None:
    with open(SOURCE) as f:
        r = _check(f.read(), tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]


@pytest.mark.parametrize(
    "old,new",
    [
        ("[device_ newCommandQueue]", "[device_ newCommandQueu]"),  # misspelled selector
        ("atIndex:k->nargs];", "atIndex:k->nargs length:0];"),  # wrong arguments
    ],
)
def test_broken_runtime_fails(old: str, new: str, tmp_path) -> None:
    with open(SOURCE) as f:
        src = f.read()
    assert old in src
    r = _check(src.replace(old, new, 1), tmp_path)
    assert r.returncode != 0 and "error" in r.stderr
