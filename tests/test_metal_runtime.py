"""The Metal runtime (csrc/metal/, Objective-C++, built only on macOS) passes a syntax check
with clang against stub Metal/Foundation/MPS headers (csrc/metal/stub/), and the check fails
on broken calls. Nothing here runs Metal; the rule for wrapping mapped weights without a copy
(csrc/metal/host_map.hpp, plain C++) runs here."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = os.path.join(ROOT, "csrc", "metal", "metal_backend.mm")
CLANGXX = shutil.which("clang++-19")
# -fblocks: Apple's clang has blocks on by default (the no-copy buffer's deallocator is one)
FLAGS = ["-x", "objective-c++", "-std=c++20", "-fsyntax-only", "-fobjc-runtime=gnustep-2.0",
         "-fobjc-arc", "-fblocks", "-Wall", "-Wextra", "-Werror",
         "-I", os.path.join(ROOT, "csrc", "metal"),
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
        ("deallocator:nil];", "deallocater:nil];"),  # the no-copy buffer's selector
    ],
)
def test_broken_runtime_fails(old: str, new: str, tmp_path) -> None:
    with open(SOURCE) as f:
        src = f.read()
    assert old in src
    r = _check(src.replace(old, new, 1), tmp_path)
    assert r.returncode != 0 and "error" in r.stderr


CXX = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")
# (address, bytes, page) -> the no-copy buffer's length, or the reason it is copied
NOCOPY = [
    ((1 << 20, 1, 16384), 16384),  # a page-aligned start: the length rounds up to pages
    ((1 << 20, 16384, 16384), 16384),
    ((1 << 20, 16385, 16384), 32768),
    ((1 << 20, 3 << 30, 16384), 3 << 30),
    ((1 << 20, 1000, 4096), 4096),
    ((1 << 20 | 64, 4096, 16384), "not page-aligned (64 bytes past a 16384-byte page)"),
    ((1 << 20, 0, 16384), "it is empty"),
    ((1 << 20, 4096, 12288), "page size 12288 is not a power of two"),
    ((1 << 20, 2**64 - 8, 16384), "run past the address space"),
]


@pytest.mark.skipif(CXX is None or sys.maxsize < 2**32, reason="no C++ compiler, or 32-bit")
def test_nocopy_weights_rule(tmp_path) -> None:
    """Page-aligned weights are wrapped (length rounded up to whole pages); anything else
    is refused with the reason the runtime gives when it copies them instead."""
    calls = "".join(f"  show({a}ull, {n}ull, {p}ull);\n" for (a, n, p), _ in NOCOPY)
    src = tmp_path / "nocopy.cpp"
    src.write_text(f"""#include "host_map.hpp"
#include <cstdio>
static void show(unsigned long long a, unsigned long long n, unsigned long long p) {{
  std::string why;
  size_t len = luminal::metal::nocopy_length(uintptr_t(a), size_t(n), size_t(p), &why);
  std::printf("%zu %s\\n", len, why.c_str());
}}
int main() {{
{calls}}}
""")
    exe = tmp_path / "nocopy"
    inc = os.path.join(ROOT, "csrc", "metal")
    r = subprocess.run([CXX, "-std=c++17", "-Wall", "-Werror", "-I", inc, str(src), "-o", str(exe)],
                       capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    assert len(lines) == len(NOCOPY)
    for line, (case, want) in zip(lines, NOCOPY, strict=True):
        length, _, why = line.partition(" ")
        if isinstance(want, int):
            assert (int(length), why) == (want, ""), case
        else:
            assert int(length) == 0 and want in why, (case, why)
