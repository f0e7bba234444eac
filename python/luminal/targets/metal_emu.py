"""Run a Metal plan's MSL kernels on the host, to check their numbers without a Mac.

The kernels compile as C++ with the system compiler against a host emulation of the
``metal_stdlib`` subset they use (``csrc/metal/emu/``): threadgroups run one after another,
the threads of each as fibers that meet at every barrier and simdgroup function, as on the
GPU. What this checks: index arithmetic, masks, reductions over threadgroups and simdgroups,
the simdgroup-matrix gemm's tiling and bounds, stores and conversions. What it cannot: Apple's
compiler, its math library's precision, memory ordering on the GPU, speed. For tests only
(slow: every thread switch is a context switch).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..codegen.metal.check import join
from ..plan import Copy, KernelFormat, Launch, Plan, Role
from ..plan.model import eval_program


def emu_dir() -> Path:
    here = Path(__file__).resolve()
    for up in here.parents:
        d = up / "csrc" / "metal" / "emu"
        if (d / "metal_stdlib").is_file():
            return d
    raise FileNotFoundError("the host emulation of metal_stdlib (csrc/metal/emu/) is not here: "
                            "emulation runs from a source checkout of luminal")  # fmt: skip


def compiler() -> str | None:
    return shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")


# kernel source -> (its library, its host entry point)
_ENTRIES: dict[str, tuple[Any, str]] = {}
BATCH = 400  # kernels per compiler call


def prepare(kernels: list[str]) -> None:
    """Compile the kernel sources not compiled yet, many to a shared library (one compiler
    call per BATCH: compiling them one by one costs a second each)."""
    todo = list(dict.fromkeys(k for k in kernels if k not in _ENTRIES))
    for i in range(0, len(todo), BATCH):
        chunk = todo[i : i + BATCH]
        lib, entries = _library([(f"k{j}", src) for j, src in enumerate(chunk)])
        for src, e in zip(chunk, entries, strict=True):
            _ENTRIES[src] = (lib, e)


def _library(kernels: list[tuple[str, str]]) -> tuple[Any, list[str]]:
    """The kernels compiled into one shared library, and each one's host entry point."""
    text, _, entries = join(kernels)
    text += "".join(f"LM_EMU_ENTRY({e})\n" for e in entries)
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler (c++ or g++) to build the Metal emulation")
    tmp = Path(tempfile.mkdtemp(prefix="luminal-metal-emu-"))
    key = hashlib.sha256(text.encode()).hexdigest()[:16]
    src, lib = tmp / f"k{key}.cpp", tmp / f"k{key}.so"
    src.write_text(text)
    # no fortified longjmp: fibers jump between stacks on purpose
    r = subprocess.run([cxx, "-std=c++20", "-O1", "-w", "-U_FORTIFY_SOURCE", "-shared",
                        "-fPIC", "-I", str(emu_dir()), str(src), "-o", str(lib)],
                       capture_output=True, text=True)  # fmt: skip
    if r.returncode != 0:
        raise RuntimeError(f"the Metal emulation did not compile:\n{r.stderr[-4000:]}")
    handle = ctypes.CDLL(str(lib))
    shutil.rmtree(tmp, ignore_errors=True)  # the loaded library stays mapped
    return handle, [f"lm_emu_{e}" for e in entries]


def _np_dtype(d: Any) -> np.dtype[Any]:
    from ..runtime import numpy_dtype

    return numpy_dtype(d)


def run(plan: Plan, inputs: Mapping[str, np.ndarray], **dims: int) -> dict[str, np.ndarray]:
    """Run ``plan`` (a Metal plan of generated kernels) on the host: its outputs by name."""
    names = [d.name for d in plan.dims]
    missing = [n for n in names if n not in dims]
    if missing:
        raise ValueError(f"unbound dims {missing}")
    vals = [int(dims[n]) for n in names]
    index = {n: i for i, n in enumerate(names)}

    def ev(e: Any) -> int:
        return int(e) if isinstance(e, int) else eval_program(tuple(e.to_postfix(index)), vals)

    if any(k.format != KernelFormat.msl for k in plan.kernels):
        raise ValueError("only MSL kernels can be emulated")
    sources = [bytes(k.code).decode() for k in plan.kernels]
    prepare(sources)
    mem: list[np.ndarray] = []
    for b in plan.buffers:
        count = int(np.prod([ev(s) for s in b.shape])) if b.shape else 1
        nbytes = ev(b.nbytes) if b.nbytes is not None else b.dtype.nbytes(count)
        mem.append(np.zeros(max(nbytes, 1) + 64, np.uint8))  # slack: a 4-bit tail byte
    for i, b in enumerate(plan.buffers):
        if b.alias is not None:
            mem[i] = mem[b.alias]
    for w in plan.weights:
        raw = np.frombuffer(np.ascontiguousarray(w.data), np.uint8)  # type: ignore[union-attr]
        mem[w.buffer][: raw.size] = raw
    for i, b in enumerate(plan.buffers):
        if b.dtype.bits == 4 and b.role in (Role.input, Role.output):
            raise NotImplementedError(f"buffer {b.name!r}: 4-bit inputs and outputs")
        if b.role == Role.input:
            raw = np.ascontiguousarray(inputs[b.name]).view(np.uint8).reshape(-1)
            mem[i][: raw.size] = raw
    dims_arr = (ctypes.c_int64 * max(1, len(vals)))(*vals)
    for n, step in enumerate(plan.steps):
        if isinstance(step, Launch):
            ptrs = (ctypes.c_void_p * len(step.args))(*[mem[a].ctypes.data for a in step.args])
            grid = (ctypes.c_uint32 * 3)(*[ev(g) for g in step.grid])
            threads = ev(step.block[0]) * ev(step.block[1]) * ev(step.block[2])
            if min(grid) == 0:
                continue
            lib, entry = _ENTRIES[sources[step.kernel]]
            rc = getattr(lib, entry)(ptrs, dims_arr, grid, ctypes.c_uint32(threads))
            if rc != 0:
                raise RuntimeError(f"step {n} ({plan.kernels[step.kernel].name}): some threads "
                                   "ended while others waited at a barrier")  # fmt: skip
        elif isinstance(step, Copy):
            nb, do, so = ev(step.nbytes), ev(step.dst_offset), ev(step.src_offset)
            mem[step.dst][do : do + nb] = mem[step.src][so : so + nb].copy()
        else:
            raise NotImplementedError(f"step {n}: library calls are not emulated")
    out = {}
    for i, b in enumerate(plan.buffers):
        if b.role == Role.output:
            dt = _np_dtype(b.dtype)
            shape = tuple(ev(s) for s in b.shape)
            count = int(np.prod(shape)) if shape else 1
            out[b.name] = mem[i][: count * dt.itemsize].view(dt).reshape(shape).copy()
    return out
