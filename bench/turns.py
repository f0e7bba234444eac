"""Contenders timed in turns, for the benchmark scripts: each turn runs one contender untimed
for a settling time (at least one call), then times a few calls; the order rotates from turn
to turn. A library's threads keep spinning for a while after its calls (PyTorch's OpenMP
threads about 10 ms, OpenBLAS's longer) and take the cores from whatever runs next, and the
machine's load drifts: taking turns makes both hit every contender alike, and the calls timed
follow calls of the same contender, as in a loop over one model."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable


def time_turns(fns: dict[str, Callable[[], object]], repeats: int, err: dict[str, str],
               settle_s: float, per_turn: int = 3,
               budget: float = math.inf) -> dict[str, tuple[float, int, float]]:  # fmt: skip
    """(median seconds, calls, best seconds) per contender. A turn is ``settle_s`` of untimed
    calls (at least one), then up to ``per_turn`` timed calls. A contender gets turns until
    it has ``repeats`` timed calls or has spent ``budget`` seconds, untimed calls included (at
    least one timed call). One that raises gets its error in ``err``, no time and no more
    turns. The caller has made the warm-up calls."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    spent = dict.fromkeys(fns, 0.0)
    live = list(fns)
    turn = 0
    while live:
        order = live[turn % len(live) :] + live[: turn % len(live)]
        turn += 1
        for k in order:
            fn, ts = fns[k], times[k]
            t0 = time.perf_counter()
            try:
                fn()
                while time.perf_counter() < t0 + settle_s:
                    fn()
                for _ in range(min(per_turn, repeats - len(ts))):
                    t = time.perf_counter()
                    fn()
                    ts.append(time.perf_counter() - t)
                    if spent[k] + time.perf_counter() - t0 > budget:
                        break
            except Exception as e:  # one contender failing must not hide the others
                err[k] = f"{type(e).__name__}: {e}"[:200]
                live.remove(k)
                continue
            spent[k] += time.perf_counter() - t0
            if len(ts) >= repeats or spent[k] > budget:
                live.remove(k)
    return {k: (statistics.median(ts), len(ts), min(ts)) for k, ts in times.items() if k not in err}
