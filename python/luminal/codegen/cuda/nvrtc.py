"""CUDA C -> cubin (or PTX) with NVRTC, at compile time, through ctypes.

NVRTC comes from the ``nvidia-cuda-nvrtc==13.0.*`` wheel (found with ``cuda-pathfinder``,
which also loads the ``libnvrtc-builtins`` sibling that NVRTC opens by soname) or from the
system. No GPU and no driver are needed. Pin 13.0: newer NVRTC emits PTX that a CUDA 13.0
driver cannot load, and plans ship cubins built here. Results are cached on disk under
``$LUMINAL_CACHE_DIR/cuda`` keyed by source, target, options and NVRTC version.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ... import flags

DEFAULT_ARCH = "sm_90a"
OPTIONS = ("--std=c++17",)


class NvrtcUnavailable(RuntimeError):
    """NVRTC could not be loaded (the message says why)."""


class NvrtcError(RuntimeError):
    """A kernel failed to compile; the message holds the kernel name and NVRTC's log."""


_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_why: str | None = None


def _load() -> ctypes.CDLL:
    global _lib, _why
    with _lock:
        if _lib is not None:
            return _lib
        if _why is not None:
            raise NvrtcUnavailable(_why)
        errors = []
        path = None
        try:
            from cuda.pathfinder import load_nvidia_dynamic_lib

            path = load_nvidia_dynamic_lib("nvrtc").abs_path
        except ImportError:
            errors.append("cuda-pathfinder is not installed")
        except Exception as e:  # DynamicLibNotFoundError and friends
            errors.append(f"cuda-pathfinder: {e}")
        if path is None:
            path = _site_packages_nvrtc()
        try:
            lib = ctypes.CDLL(path or "libnvrtc.so.13")
        except OSError as e:
            errors.append(str(e))
            _why = ("NVRTC unavailable (pip install 'nvidia-cuda-nvrtc==13.0.*' "
                    "cuda-pathfinder): " + "; ".join(errors))  # fmt: skip
            raise NvrtcUnavailable(_why) from None
        c_void_pp = ctypes.POINTER(ctypes.c_void_p)
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        lib.nvrtcCreateProgram.argtypes = [
            c_void_pp, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p,
            ctypes.c_void_p,
        ]  # fmt: skip
        lib.nvrtcCompileProgram.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
        lib.nvrtcDestroyProgram.argtypes = [c_void_pp]
        for fn in ("nvrtcGetProgramLogSize", "nvrtcGetCUBINSize", "nvrtcGetPTXSize"):
            getattr(lib, fn).argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
        for fn in ("nvrtcGetProgramLog", "nvrtcGetCUBIN", "nvrtcGetPTX"):
            getattr(lib, fn).argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        _lib = lib
        return lib


def _site_packages_nvrtc() -> str | None:
    """libnvrtc.so.13 from an ``nvidia-cuda-nvrtc`` wheel on sys.path (e.g. one PyTorch pulled
    in), with its builtins sibling loaded first; None when there is none."""
    import glob
    import sys

    for base in sys.path:
        lib = os.path.join(base, "nvidia", "cu13", "lib", "libnvrtc.so.13")
        if os.path.isfile(lib):
            pattern = os.path.join(os.path.dirname(lib), "libnvrtc-builtins.so.13.*")
            for b in sorted(glob.glob(pattern)):
                ctypes.CDLL(b, mode=ctypes.RTLD_GLOBAL)
            return lib
    return None


def available() -> str | None:
    """None when NVRTC can be used, else the reason it cannot."""
    try:
        _load()
        return None
    except NvrtcUnavailable as e:
        return str(e)


def version() -> tuple[int, int]:
    lib = _load()
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check(lib, lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
    return major.value, minor.value


def _check(lib: ctypes.CDLL, rc: int, what: str) -> None:
    if rc != 0:
        msg = lib.nvrtcGetErrorString(rc).decode()
        raise NvrtcError(f"{what} failed: {msg} ({rc})")


def _cache_dir() -> Path:
    base = flags.cache_base()
    return Path(base) / "cuda"


def compile_source(
    source: str, name: str, arch: str = DEFAULT_ARCH, *, ptx: bool = False, cache: bool = True
) -> bytes:
    """Compile one CUDA C translation unit to a cubin for ``arch`` (e.g. ``sm_90a``), or to
    PTX for the matching virtual arch when ``ptx``. ``name`` only labels errors."""
    lib = _load()
    target = arch.replace("sm_", "compute_") if ptx else arch
    opts = (f"--gpu-architecture={target}", *OPTIONS)
    key = hashlib.sha256("\0".join((source, *opts, repr(version()))).encode()).hexdigest()
    path = _cache_dir() / f"{key[:32]}.{'ptx' if ptx else 'cubin'}"
    if cache and path.is_file():
        return path.read_bytes()
    prog = ctypes.c_void_p()
    _check(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(),
                                       f"{name}.cu".encode(), 0, None, None),
           f"nvrtcCreateProgram({name})")  # fmt: skip
    try:
        argv = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
        rc = lib.nvrtcCompileProgram(prog, len(opts), argv)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        if rc != 0:
            raise NvrtcError(
                f"NVRTC could not compile kernel {name!r} for {target}: "
                f"{lib.nvrtcGetErrorString(rc).decode()}\n{log.value.decode(errors='replace')}"
            )
        get_size, get = (
            (lib.nvrtcGetPTXSize, lib.nvrtcGetPTX)
            if ptx
            else (lib.nvrtcGetCUBINSize, lib.nvrtcGetCUBIN)
        )
        _check(lib, get_size(prog, ctypes.byref(size)), f"nvrtcGet{'PTX' if ptx else 'CUBIN'}Size")
        buf = ctypes.create_string_buffer(size.value)
        _check(lib, get(prog, buf), f"nvrtcGet{'PTX' if ptx else 'CUBIN'}")
        out = buf.raw[: size.value]
        if ptx:
            out = out.rstrip(b"\0")
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
    if cache:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}.{threading.get_ident()}")
            tmp.write_bytes(out)
            os.replace(tmp, path)
        except OSError:
            pass  # a read-only cache only costs time
    return out


def compile_many(
    kernels: Sequence[tuple[str, str]], arch: str = DEFAULT_ARCH, *, ptx: bool = False
) -> list[bytes]:
    """Compile ``(name, source)`` pairs in parallel (NVRTC runs outside the GIL)."""
    if len(kernels) <= 1:
        return [compile_source(s, n, arch, ptx=ptx) for n, s in kernels]
    workers = min(len(kernels), os.cpu_count() or 1, 16)
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda ns: compile_source(ns[1], ns[0], arch, ptx=ptx), kernels))
