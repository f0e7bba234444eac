"""Which batched plan runs a step of n rows: the one with packed (quantized) weights, whose
projections dequantize every weight again per row, or the one with weights folded to f32,
whose projections are GEMMs over the rows. Which wins, and from how many rows, depends on
the kernels the compiler chose and on the machine, so the engine measures both plans once at
the row counts its steps take and remembers the answer, keyed by the two plan files and the
thread setting, in the plan cache's folder (``serve/plan_choice.json``): a reload after an
idle unload does not measure again."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..models import crossing
from ..models.crossing import measure, threshold

__all__ = ["choose_f32_from", "measure", "step_sizes", "threshold"]

_MEMO = os.path.join("serve", "plan_choice.json")


def step_sizes(max_rows: int) -> list[int]:
    """Powers of two below ``max_rows``, and ``max_rows``."""
    sizes, n = [], 1
    while n < max_rows:
        sizes.append(n)
        n *= 2
    return [*sizes, max_rows]


def _memo_key(runners: dict[str, Any]) -> str | None:
    """The plans' files and the thread setting; None when a plan has no file (no plan cache,
    or the interpreter): nothing is remembered then."""
    parts: list[str] = []
    for k, r in sorted(runners.items()):
        path = getattr(getattr(r, "_plan", None), "path", None)
        if path is None:
            return None
        parts.append(f"{k}={os.path.basename(str(path))}")
    return crossing.memo_key(parts)


def _memo_file() -> str:
    return crossing.memo_path(_MEMO)


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
        got = crossing.read_memo(_MEMO).get(key)
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
    times = measure(step, runners, step_sizes(max_rows))  # this module's name: tests patch it
    f32_from = threshold(times["packed"], times["folded"])
    ms = {k: {n: round(1e3 * s, 1) for n, s in v.items()} for k, v in times.items()}
    log(
        f"f32 plan from {f32_from or 'no'} rows (step ms by rows {ms}; measured in "
        f"{time.perf_counter() - t0:.1f} s)"
    )
    if key is not None:
        crossing.write_memo(_MEMO, key, {"f32_from": f32_from, "ms": ms})
    return f32_from
