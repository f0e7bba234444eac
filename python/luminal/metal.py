"""Is Metal usable here? Metal plans compile anywhere (their kernels are MSL source, compiled
by the Metal framework when a plan loads); they run only on macOS, with a runtime built with
the Metal backend (``csrc/metal/``, built only on Apple). Compiling for Metal is the
Metal target's (``luminal/targets/metal.py``).

    >>> luminal.metal_status()
    'Metal unavailable: not macOS (this is Linux); Metal plans compile here and run on a Mac'
"""

from __future__ import annotations

import platform


def unavailable_reason() -> str | None:
    """None when Metal plans can run here, else why not."""
    system = platform.system()
    if system != "Darwin":
        return f"not macOS (this is {system or 'an unknown system'})"
    try:
        from . import runtime
    except ImportError as e:
        return f"the luminal runtime is not built ({e})"
    if "metal" not in runtime.backends():
        return "this luminal runtime was built without the Metal backend"
    return None


def available() -> bool:
    return unavailable_reason() is None


def status() -> str:
    """One line: whether Metal plans can run here, or why not."""
    why = unavailable_reason()
    if why is None:
        return "Metal available: plans compile their MSL with the Metal framework at load"
    return f"Metal unavailable: {why}; Metal plans compile here and run on a Mac"
