"""From how many rows one of two compiled programs beats the other, measured on this machine
and remembered in the plan cache's folder.

Two programs compute the same step, one suited to few rows (a decode program: quantized
weights dequantized inside the products) and one to many (weights folded to f32, GEMMs).
Where the second starts to win depends on the kernels the compiler chose and on the machine,
so it is a measurement, taken once: the step is timed with both at a ladder of row counts
(contenders interleaved, fastest of a few runs) and the answer is stored under a key naming
both programs and the thread setting (``memo_key``), so the next process reads it.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..plan_cache import cache_root

THREAD_VARS = ("LUMINAL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")


def measure(
    step: Callable[[Any, int], None],
    runners: dict[str, Any],
    sizes: Sequence[int],
    reps: int = 3,
    budget_s: float | None = None,
    done: Callable[[dict[str, dict[int, float]]], bool] | None = None,
    warmup: int = 1,
) -> dict[str, dict[int, float]]:
    """Seconds of ``step(runner, rows)`` for each runner and size: the fastest of ``reps``
    runs (after one warm-up run each of ``warmup`` rows, which loads the plan's kernels), the
    contenders
    interleaved run by run so that a shared machine's load falls on both alike. Sizes are
    taken in order; it stops early once ``budget_s`` seconds are spent or ``done(times so
    far)`` says the answer is known."""
    for r in runners.values():
        step(r, warmup)
    best: dict[str, dict[int, float]] = {k: {} for k in runners}
    t_start = time.perf_counter()
    for n in sizes:
        for _ in range(reps):
            for k, r in runners.items():
                t0 = time.perf_counter()
                step(r, n)
                dt = time.perf_counter() - t0
                best[k][n] = min(best[k].get(n, dt), dt)
        if done is not None and done(best):
            break
        if budget_s is not None and time.perf_counter() - t_start >= budget_s:
            break
    return best


def threshold(few: dict[int, float], many: dict[int, float]) -> int:
    """The smallest measured row count from which ``many`` is faster at every measured count
    above it; 0 when it is not the faster at the largest one."""
    sizes = sorted(set(few) & set(many))
    best = 0
    for n in reversed(sizes):
        if many[n] < few[n]:
            best = n
        else:
            break
    return best


def memo_key(parts: Sequence[str]) -> str:
    """A key for a measured answer: what was measured (``parts``: the programs' plan files or
    cache keys) and the threads it ran on."""
    items = [*parts, *(f"{v}={os.environ.get(v, '')}" for v in THREAD_VARS)]
    items.append(f"cpus={os.cpu_count()}")
    return hashlib.sha256("\n".join(items).encode()).hexdigest()[:32]


def memo_path(name: str) -> str:
    """The memo file ``name`` (a relative path) in the plan cache's folder."""
    return os.path.join(cache_root(), name)


def read_memo(name: str) -> dict[str, Any]:
    try:
        with open(memo_path(name)) as fh:
            got = json.load(fh)
        return got if isinstance(got, dict) else {}
    except (OSError, ValueError):  # none yet, or a torn file: measured again
        return {}


def write_memo(name: str, key: str, value: dict[str, Any]) -> None:
    """Store ``value`` under ``key`` (a whole-file replace: readers never see half a file)."""
    memo = read_memo(name)
    memo[key] = value
    path = memo_path(name)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as fh:
            json.dump(memo, fh)
        os.replace(tmp, path)
    except OSError:  # a read-only cache folder: measured again next time
        pass
