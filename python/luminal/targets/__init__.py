"""Targets: the one place that knows a backend (DESIGN.md §1).

Each target owns its renderer, its measure function, its cost constants, its schedule space,
its library calls and its cache id, behind the interface of ``compiler/target.py``. The
registry maps names to factories, so another backend (Metal) is one more entry.

    >>> luminal.targets.names()
    ['cpu', 'cuda', 'metal']
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..compiler.target import Target

_REGISTRY: dict[str, Callable[..., Target]] = {}


def register(name: str, factory: Callable[..., Target]) -> None:
    """Makes ``factory(**options)`` the target called ``name``."""
    _REGISTRY[name] = factory


def names() -> list[str]:
    return sorted(_REGISTRY)


def get(name: str, **options: Any) -> Target:
    """The target ``name`` (``options`` go to its factory, e.g. ``gemm_impl`` for cuda)."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown target {name!r} (have: {', '.join(map(repr, names()))})")
    return _REGISTRY[name](**options)


def _cpu(**options: Any) -> Target:
    from .cpu import CpuTarget

    return CpuTarget(**options)


def _cuda(**options: Any) -> Target:
    from .cuda import CudaTarget

    return CudaTarget(**options)


def _metal(**options: Any) -> Target:
    from .metal import MetalTarget

    return MetalTarget(**options)


register("cpu", _cpu)
register("cuda", _cuda)
register("metal", _metal)
