"""Which batched plan runs a step of n rows: the one with packed (quantized) weights, whose
projections dequantize every weight again per row, or the one with weights folded to f32,
whose projections are GEMMs over the rows. Which wins, and from how many rows, depends on
the kernels the compiler chose and on the machine, so the engine measures both plans once at
the row counts its steps take and remembers the answer, keyed by the two plan files and the
thread setting, in the plan cache's folder (``serve/plan_choice.json``): a reload after an
idle unload does not measure again."""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..plan_cache import cache_root

THREAD_VARS = ("LUMINAL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")


def step_sizes(max_rows: int) -> list[int]:
    """Powers of two below ``max_rows``, and ``max_rows``."""
    sizes, n = [], 1
    while n < max_rows:
        sizes.append(n)
        n *= 2
    return [*sizes, max_rows]


def threshold(packed: dict[int, float], folded: dict[int, float]) -> int:
    """The smallest measured row count from which the folded plan is faster at every measured
    count; 0 when it is never the faster at the largest one (the packed plan runs every
    step)."""
    sizes = sorted(packed)
    best = 0
    for n in reversed(sizes):
        if folded[n] < packed[n]:
            best = n
        else:
            break
    return best


def measure(
    step: Callable[[Any, int], None], runners: dict[str, Any], sizes: list[int], reps: int = 3
) -> dict[str, dict[int, float]]:
    """Seconds of ``step(runner, rows)`` for each runner and size: the fastest of ``reps``
    runs (after one warm-up run each, which loads the plan's kernels), the contenders
    interleaved run by run so that a shared machine's load falls on both alike."""
    for r in runners.values():
        step(r, 1)
    best: dict[str, dict[int, float]] = {k: {} for k in runners}
    for n in sizes:
        for _ in range(reps):
            for k, r in runners.items():
                t0 = time.perf_counter()
                step(r, n)
                dt = time.perf_counter() - t0
                best[k][n] = min(best[k].get(n, dt), dt)
    return best


def _memo_key(runners: dict[str, Any]) -> str | None:
    """The plans' files and the thread setting; None when a plan has no file (no plan cache,
    or the interpreter): nothing is remembered then."""
    parts: list[str] = []
    for k, r in sorted(runners.items()):
        path = getattr(getattr(r, "_plan", None), "path", None)
        if path is None:
            return None
        parts.append(f"{k}={os.path.basename(str(path))}")
    parts += [f"{v}={os.environ.get(v, '')}" for v in THREAD_VARS]
    parts.append(f"cpus={os.cpu_count()}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def _memo_file() -> str:
    return os.path.join(cache_root(), "serve", "plan_choice.json")


def _read_memo() -> dict[str, Any]:
    try:
        with open(_memo_file()) as fh:
            got = json.load(fh)
        return got if isinstance(got, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_memo(key: str, value: dict[str, Any]) -> None:
    memo = _read_memo()
    memo[key] = value
    path = _memo_file()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as fh:
            json.dump(memo, fh)
        os.replace(tmp, path)
    except OSError:  # a read-only cache folder: measured again next load
        pass


def choose_f32_from(
    decoder: Any,
    packed: Any,
    folded: Any,
    cache: dict[str, np.ndarray],
    max_rows: int,
    log: Callable[[str], None],
) -> int:
    """Steps of at least the returned row count run on ``folded`` (0: never), as measured on
    ``decoder`` (a ``BatchedDecoder``) with its ``cache`` (rows written here are past every
    live sequence's position: no sequence is running yet)."""
    runners = {"packed": packed, "folded": folded}
    key = _memo_key(runners)
    if key is not None:
        got = _read_memo().get(key)
        if isinstance(got, dict) and isinstance(got.get("f32_from"), int):
            log(f"f32 plan from {got['f32_from']} rows (measured before: {got.get('ms')})")
            return int(got["f32_from"])
    pos = min(decoder.ctx - 1, 63)  # a mid-length context: attention costs the same in both
    slots = decoder.slots

    def step(r: Any, n: int) -> None:
        ids = np.arange(n) % slots
        picks = list(range(min(n, slots)))  # a step's logits: one row per sequence at most
        decoder.step(r, cache, np.zeros(n, np.int32), np.full(n, pos), ids, picks)

    t0 = time.perf_counter()
    times = measure(step, runners, step_sizes(max_rows))
    f32_from = threshold(times["packed"], times["folded"])
    ms = {k: {n: round(1e3 * s, 1) for n, s in v.items()} for k, v in times.items()}
    log(
        f"f32 plan from {f32_from or 'no'} rows (step ms by rows {ms}; measured in "
        f"{time.perf_counter() - t0:.1f} s)"
    )
    if key is not None:
        _write_memo(key, {"f32_from": f32_from, "ms": ms})
    return f32_from
