"""Choose between a generated kernel and a library call by measurement.

For every kernel that ``gemm.match_gemm`` can express as a GEMM, both programs are timed on
the target through the same runtime path that runs plans (``measure``, given by the caller, so
this module names no backend). Sizes use each dim at a representative value. Decisions are
cached on disk by (kernel, alternative, sizes, target), so a second compile is fast and the
choice is deterministic once cached. ``LUMINAL_DEBUG>=3`` prints every decision.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace

from ... import flags
from ...graph import symbolic as sym
from .. import kernel_ir as K
from ..lower import BufferInfo, Lowered, Role
from .gemm import match_gemm

# smallest product (m*n*k) worth timing a library call for; below it the call overhead wins
MIN_GEMM_WORK = 1 << 15
REPRESENTATIVE_DIM = 256

Step = K.Kernel | K.LibCall
# measure(lowered_subprogram, dims) -> median seconds
Measure = Callable[[Lowered, dict[str, int]], float]


def representative_dims(low: Lowered) -> dict[str, int]:
    return {n: min(max(REPRESENTATIVE_DIM, d.lo), d.hi) for n, d in low.dims.items()}


def subprogram(low: Lowered, steps: Sequence[Step], extra: Sequence[BufferInfo] = ()) -> Lowered:
    """Just ``steps`` with the buffers they touch: what they read becomes inputs, what they
    write (and nothing later in ``steps`` reads... or not) becomes outputs."""
    buffers = list(low.buffers) + list(extra)
    used: list[int] = []
    written: set[int] = set()
    read: set[int] = set()
    for s in steps:
        w, r = K.step_buffers(s)
        for b in r + w:
            if b not in used:
                used.append(b)
        written |= set(w)
        read |= set(r) - written
    ids = {b: i for i, b in enumerate(used)}
    new_bufs = []
    for b in used:
        info = buffers[b]
        role: Role = "input" if b in read and b not in written else "output"
        new_bufs.append(BufferInfo(ids[b], f"b{ids[b]}", info.dtype, info.shape, role))
    new_steps: list[Step] = []
    for s in steps:
        if isinstance(s, K.LibCall):
            new_steps.append(replace(s, args=[ids[a] for a in s.args], out=ids[s.out]))
        else:
            row = K.remap_buffers(s.scatter_row, ids) if s.scatter_row is not None else None
            new_steps.append(
                replace(s, value=K.remap_buffers(s.value, ids), out=ids[s.out], scatter_row=row)
            )
    return Lowered(new_bufs, new_steps, dict(low.dims), {})  # type: ignore[arg-type]


def _sub_fp(sub: Lowered) -> str:
    bufs = ";".join(
        f"{b.dtype.name}:{b.role}:{','.join(sym.fingerprint(s) for s in b.shape)}"
        for b in sub.buffers
    )
    return bufs + "/" + K.fingerprint(sub.kernels)  # type: ignore[arg-type]


def _key(parts: Sequence[str]) -> str:
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:24]


def _cache_dir() -> str:
    base = flags.CACHE_DIR.get() or os.path.join(os.path.expanduser("~"), ".cache", "luminal")
    return os.path.join(base, "search")


def choose_library_calls(low: Lowered, measure: Measure, target: str) -> Lowered:
    """Replace kernels by library calls where measurement says the call is faster."""
    dims = representative_dims(low)
    debug = flags.debug()
    steps: list[Step] = []
    buffers = list(low.buffers)
    for kern in low.kernels:
        alt = match_gemm(kern, len(buffers)) if isinstance(kern, K.Kernel) else None
        if alt is None:
            steps.append(kern)
            continue
        work = int(sym.evaluate(sym.mul(sym.mul(sym.mul(alt.m, alt.n), alt.k), alt.batch), dims))
        if work < MIN_GEMM_WORK:
            steps.append(kern)
            if debug >= 3:
                print(f"luminal search: {kern.name}: gemm work {work} < {MIN_GEMM_WORK}, "
                      "keeping the generated kernel", file=sys.stderr)  # fmt: skip
            continue
        extra = []
        if alt.scratch_shape is not None:
            extra = [
                BufferInfo(
                    len(buffers), f"{kern.name}_prod", kern.dtype, alt.scratch_shape, "scratch"
                )
            ]
        lib_steps: list[Step] = [alt.call] + ([alt.epilogue] if alt.epilogue else [])
        sub_gen = subprogram(low, [kern])
        sub_lib = subprogram(low, lib_steps, buffers[len(low.buffers) :] + extra)
        # keyed on the cut-out programs (buffer ids renumbered), so identical layers share
        key = _key([target, repr(sorted(dims.items())), _sub_fp(sub_gen), _sub_fp(sub_lib)])
        path = os.path.join(_cache_dir(), key + ".json")
        try:
            with open(path) as f:
                times = json.load(f)["times"]
        except (OSError, ValueError, KeyError):
            times = [measure(sub_gen, dims), measure(sub_lib, dims)]
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = f"{path}.{os.getpid()}"
            with open(tmp, "w") as f:
                json.dump({"kernel": kern.name, "times": times}, f)
            os.replace(tmp, path)
        use_lib = times[1] < times[0]
        if debug >= 3:
            lib = "gemm+epilogue" if alt.epilogue else "gemm"
            print(f"luminal search: {kern.name}: generated {1e6 * times[0]:.1f} us, "
                  f"{lib} {1e6 * times[1]:.1f} us at {dims} -> "
                  f"{'gemm' if use_lib else 'generated'}", file=sys.stderr)  # fmt: skip
        if use_lib:
            buffers += extra
            steps += lib_steps
        else:
            steps.append(kern)
    return Lowered(buffers, steps, low.dims, low.weights)  # type: ignore[arg-type]
