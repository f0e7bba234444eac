"""Is CUDA usable here, and on which device? (Compiling for CUDA needs only NVRTC.)

    >>> luminal.cuda_status()
    'CUDA unavailable: the NVIDIA driver library libcuda.so.1 cannot be loaded (...)'

Running a CUDA plan needs the NVIDIA driver (``libcuda.so.1``) and a GPU; building one needs
NVRTC (``pip install 'nvidia-cuda-nvrtc==13.0.*' cuda-pathfinder``). Neither is needed to
import luminal. cuBLASLt (``libcublasLt.so.13``, e.g. from ``pip install nvidia-cublas``) is
optional: a gemm runs as a generated tensor-core kernel unless cuBLASLt measured faster.

This module also holds what compiling for CUDA measures on the device (it sits above the
compiler and the runtime, so it may use both): ``search_measure`` for the search, and
``library_steps``, which decides per gemm call between the generated kernel and cuBLASLt.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from .compiler.lower import Lowered

__all__ = ["Device", "available", "device", "device_arch", "status", "unavailable_reason",
           "cublaslt_path", "library_steps", "search_measure"]  # fmt: skip


class Device(NamedTuple):
    name: str
    arch: str  # e.g. "sm_90"
    sms: int
    memory: int  # bytes
    driver_version: int  # e.g. 13000


def unavailable_reason() -> str | None:
    """None when a CUDA device can run plans, else why not."""
    try:
        from . import _rt
    except ImportError as e:
        return f"the luminal runtime is not built ({e})"
    return _rt.cuda_unavailable_reason() or None


def available() -> bool:
    return unavailable_reason() is None


def device(ordinal: int = -1) -> Device:
    """The device plans run on (``$LUMINAL_CUDA_DEVICE``, default 0) or device ``ordinal``.
    Raises RuntimeError("CUDA unavailable: ...") without one."""
    from . import _rt

    return Device(*_rt.cuda_device(ordinal))


def device_arch() -> str | None:
    """The device's ``sm_XY``, or None when there is no usable device."""
    return device().arch if available() else None


def status() -> str:
    """One line: the device CUDA plans run on, or why CUDA is unavailable; and NVRTC's state."""
    from .codegen import nvrtc

    why = unavailable_reason()
    if why is None:
        d = device()
        v = d.driver_version
        run = (f"CUDA available: {d.name} ({d.arch}, {d.sms} SMs, {d.memory / 2**30:.0f} GiB, "
               f"driver CUDA {v // 1000}.{v % 1000 // 10})")  # fmt: skip
    else:
        run = f"CUDA unavailable: {why}"
    nv = nvrtc.available()
    if nv is None:
        major, minor = nvrtc.version()
        return f"{run}; NVRTC {major}.{minor} can build CUDA plans"
    return f"{run}; {nv}"


def cublaslt_path() -> str | None:
    """Where cuda-pathfinder finds ``libcublasLt.so.13`` (None: let the runtime try the plain
    soname). The runtime loads it on the first gemm that uses it."""
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib

        return str(load_nvidia_dynamic_lib("cublasLt").abs_path)
    except Exception:  # not installed, or no pathfinder: the soname may still resolve
        return None


def _pass_cublaslt_path() -> None:
    from . import _rt

    path = cublaslt_path()
    if path:
        _rt.cuda_set_cublaslt_path(path)


# ------------------------------------------------------------------------- measuring


def _random_inputs(low: Lowered, dims: dict[str, int]) -> dict[str, Any]:
    import numpy as np

    from .graph import symbolic as sym
    from .runtime import numpy_dtype

    rng = np.random.default_rng(0)
    out = {}
    for b in low.buffers:
        if b.role == "input":
            shape = tuple(int(sym.evaluate(s, dims)) for s in b.shape)
            a = rng.standard_normal(shape).astype(numpy_dtype(b.dtype.name))
            out[b.name] = a
    return out


def _time_plan(plan: Any, low: Lowered, dims: dict[str, int], repeats: int = 7) -> float:
    """Median seconds of one run of ``plan`` on the device (inputs staged both ways alike)."""
    import numpy as np

    from . import runtime

    _pass_cublaslt_path()
    ex = runtime.Executor(plan, "cuda")
    inputs = _random_inputs(low, dims)
    ex.run(inputs, dims)  # warm-up: loads modules, binds, captures the CUDA graph
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        ex.run(inputs, dims)
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def _measure_device(low: Lowered, dims: dict[str, int]) -> float:
    from .compile import build_plan

    return _time_plan(build_plan(low, "measure", "cuda"), low, dims)


# Without a device the search still has to rank a generated kernel against a gemm call: a
# roofline estimate (H100-class numbers; the ratio is what matters). Generated kernels run
# reductions on CUDA cores; the gemm kernel uses tensor cores (three passes for f32).
_BANDWIDTH = 3.0e12  # bytes/s
_SCALAR_FLOPS = 2.0e12  # what a generated reduction kernel reaches
_TENSOR_FLOPS = 1.5e14
_LAUNCH = 4e-6  # seconds per launch


def _estimate(low: Lowered, dims: dict[str, int]) -> float:
    from .compiler import kernel_ir as K
    from .graph import symbolic as sym

    total = 0.0
    nbytes = {b.id: float(sym.evaluate(b.nbytes(), dims)) for b in low.buffers}
    for step in low.kernels:
        written, read = K.step_buffers(step)
        moved = sum(nbytes[b] for b in written + read)
        if isinstance(step, K.LibCall):
            f = step.fields
            work = 2.0 * float(sym.evaluate(
                sym.mul(sym.mul(sym.mul(f["m"], f["n"]), f["k"]), f.get("batch", 1)),  # type: ignore[arg-type]
                dims))  # fmt: skip
            rate = _TENSOR_FLOPS
        else:
            points = 1.0
            for s in step.shape:
                points *= float(sym.evaluate(s, dims))
            inner = 1.0
            for x in K.walk(step.value):
                if isinstance(x, K.Reduce):
                    inner *= float(sym.evaluate(x.extent, dims))
            work, rate = 2.0 * points * inner, _SCALAR_FLOPS
        total += max(moved / _BANDWIDTH, work / rate) + _LAUNCH
    return total


def search_measure() -> tuple[Callable[[Lowered, dict[str, int]], float], str]:
    """(measure, target) for the search: timed on the device when there is one, else the
    roofline estimate (a target of its own, so cached decisions never mix)."""
    if available():
        d = device()
        return _measure_device, f"cuda-{d.name}-{d.arch}"
    return _estimate, "cuda-estimate-v1"


def _decision_path(key: str) -> str:
    from . import flags

    base = flags.CACHE_DIR.get() or os.path.join(os.path.expanduser("~"), ".cache", "luminal")
    return os.path.join(base, "search", f"gemm-impl-{key}.json")


def _choose_gemm(low: Lowered, i: int) -> str:
    """ "kernel" or "cublaslt" for gemm step ``i``, by measurement on the device (cached);
    "kernel" when there is no device to measure on."""
    from . import flags
    from .compile import build_plan
    from .compiler import kernel_ir as K
    from .compiler.search.select import _sub_fp, representative_dims, subprogram

    if not available():
        return "kernel"
    sub = subprogram(low, [low.kernels[i]])
    dims = {n: v for n, v in representative_dims(low).items() if n in sub.dims}
    d = device()
    parts = [d.name, d.arch, repr(sorted(dims.items())), _sub_fp(sub)]
    key = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]
    path = _decision_path(key)
    try:
        with open(path) as f:
            return str(json.load(f)["impl"])
    except (OSError, ValueError, KeyError):
        pass
    times = {}
    for impl in ("kernel", "cublaslt"):
        try:
            times[impl] = _time_plan(build_plan(sub, "measure", "cuda", gemm_impl=impl), sub, dims)
        except Exception as e:  # e.g. no libcublasLt: that alternative is out
            if flags.debug() >= 3:
                print(f"luminal search: {low.kernels[i].name}: {impl} failed: {e}", file=sys.stderr)
    choice = min(times, key=lambda k: times[k]) if times else "kernel"
    if flags.debug() >= 3:
        step = low.kernels[i]
        assert isinstance(step, K.LibCall)
        shown = ", ".join(f"{k} {1e6 * v:.1f} us" for k, v in times.items())
        print(f"luminal search: {step.name}: {shown} at {dims} -> {choice}", file=sys.stderr)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump({"gemm": low.kernels[i].name, "times": times, "impl": choice}, f)
    os.replace(tmp, path)
    return choice


def library_steps(low: Lowered, gemm_impl: str | None = None) -> list[int]:
    """Indices of the library-call steps a CUDA plan keeps as LibCall steps (run by cuBLASLt
    in the runtime); every other one becomes a generated kernel. ``gemm_impl`` ("kernel" or
    "cublaslt") forces the choice for every gemm the generated kernel supports."""
    from .codegen import cuda_gemm
    from .compiler import kernel_ir as K

    if gemm_impl not in (None, "kernel", "cublaslt"):
        raise ValueError(f"gemm_impl must be 'kernel' or 'cublaslt', not {gemm_impl!r}")
    dtypes = {b.id: b.dtype for b in low.buffers}
    keep = []
    for i, step in enumerate(low.kernels):
        if not isinstance(step, K.LibCall):
            continue
        if cuda_gemm.supports(step, dtypes) is not None:
            keep.append(i)  # only the library can run it
        elif (gemm_impl or _choose_gemm(low, i)) == "cublaslt":
            keep.append(i)
    return keep
