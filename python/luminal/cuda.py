"""Is CUDA usable here, and on which device? (Compiling for CUDA needs only NVRTC.)

    >>> luminal.cuda_status()
    'CUDA unavailable: the NVIDIA driver library libcuda.so.1 cannot be loaded (...)'

Running a CUDA plan needs the NVIDIA driver (``libcuda.so.1``) and a GPU; building one needs
NVRTC (``pip install 'nvidia-cuda-nvrtc==13.0.*' cuda-pathfinder``). Neither is needed to
import luminal. cuBLASLt (``libcublasLt.so.13``, e.g. from ``pip install nvidia-cublas``) is
optional: a gemm runs as a generated tensor-core kernel unless cuBLASLt measured faster.
Compiling for CUDA is the CUDA target's (``luminal/targets/cuda.py``).
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Device", "available", "device", "device_arch", "status", "unavailable_reason",
           "cublaslt_path"]  # fmt: skip


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
    from .codegen.cuda import nvrtc

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
