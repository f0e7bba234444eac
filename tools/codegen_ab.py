"""Two settings of the CPU code generator against each other in one process: each variant sets
module constants of ``luminal.codegen.cpu`` (``rows.STRIP=512``), the memory-bound rows of
bench/kernels.py are compiled under each, and the plans run in interleaved rounds (the order
rotating) on the same input and output arrays, so that neither the machine's drifting load nor
where an array's pages landed favours one side.

    python tools/codegen_ab.py "old:rows.STRIP=256" "new:rows.STRIP=512"
    python tools/codegen_ab.py A B --kernels softmax,rms_norm --threads 1 --cpu-time

With ``--cpu-time`` (one thread only) a run is timed by the calling thread's CPU time, which
other processes on a shared machine disturb far less than the wall clock: the runtime runs a
one-thread plan on the calling thread. Prints per kernel and variant the median and quartiles
of the times, and the per-round ratio of the first variant's time to the last's (> 1: the last
is faster), then one JSON line.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import time
from collections.abc import Callable, Hashable, Mapping
from typing import Any, TypeVar

K = TypeVar("K", bound=Hashable)

KERNELS = ("softmax", "layer_norm", "rms_norm", "gelu_chain", "gemv")


def build(kernel: str, rows: int, cols: int) -> tuple[Any, dict[str, tuple[int, ...]]]:
    """The graph bench/kernels.py times for ``kernel``, and its input shapes."""
    import luminal as lm
    import luminal.functional as F  # noqa: N812

    shapes: dict[str, tuple[int, ...]] = {"x": (rows, cols)}
    if kernel in ("layer_norm", "rms_norm"):
        shapes.update(w=(cols,), b=(cols,)) if kernel == "layer_norm" else shapes.update(w=(cols,))
    elif kernel == "gelu_chain":
        shapes.update(a=(cols,), b=(cols,), c=(cols,))
    elif kernel == "gemv":
        shapes = {"x": (1, cols), "w": (cols, cols)}
    g = lm.Graph(kernel)
    t = {k: g.input(k, s) for k, s in shapes.items()}
    if kernel == "softmax":
        y = F.softmax(t["x"], -1)
    elif kernel == "layer_norm":
        y = F.layer_norm(t["x"], (cols,), t["w"], t["b"], 1e-5)
    elif kernel == "rms_norm":
        y = F.rms_norm(t["x"], (cols,), t["w"], 1e-6)
    elif kernel == "gelu_chain":
        y = F.gelu(t["x"] * t["a"] + t["b"], approximate="tanh") * t["c"]
    else:
        y = F.linear(t["x"], t["w"])
    g.output("y", y)
    return g, shapes


def apply(setting: str) -> Callable[[], None]:
    """Sets ``module.NAME=value;...`` (modules of luminal.codegen.cpu, values Python literals);
    returns what puts the old values back."""
    import ast

    saved = []
    for item in filter(None, setting.split(";")):
        key, value = item.split("=", 1)
        mod, name = key.strip().rsplit(".", 1)
        m = importlib.import_module(f"luminal.codegen.cpu.{mod}")
        if not hasattr(m, name):
            raise SystemExit(f"luminal.codegen.cpu.{mod} has no {name}")
        saved.append((m, name, getattr(m, name)))
        setattr(m, name, ast.literal_eval(value.strip()))

    def restore() -> None:
        for m, name, v in reversed(saved):
            setattr(m, name, v)

    return restore


def interleaved(runs: Mapping[K, Callable[[], object]], rounds: int, clock: Callable[[], float],
                warmup: int = 1, calls: int = 1) -> dict[K, list[float]]:  # fmt: skip
    """Each run's time in each of ``rounds`` rounds. The runs take turns in an order that
    rotates by one each round, so that neither the machine's drifting load nor going first
    favours one. A turn is ``warmup`` untimed calls (the caches as the previous contender left
    them), then the best of ``calls`` timed ones."""
    times: dict[K, list[float]] = {key: [] for key in runs}
    keys = list(runs)
    for r in range(rounds):
        for key in keys[r % len(keys) :] + keys[: r % len(keys)]:
            for _ in range(warmup):
                runs[key]()
            best = float("inf")
            for _ in range(calls):
                t = clock()
                runs[key]()
                best = min(best, clock() - t)
            times[key].append(best)
    return times


def _runner(cg: Any, ins: dict[str, Any], out: dict[str, Any]) -> Callable[[], object]:
    return lambda: cg.run(ins, out=out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("variants", nargs="+", help="NAME:module.CONST=value;... (two or more)")
    p.add_argument("--kernels", default=",".join(KERNELS))
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--cols", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=25)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--cpu-time", action="store_true", help="thread CPU time (--threads 1)")
    a = p.parse_args()
    if a.cpu_time and a.threads != 1:
        p.error("--cpu-time times the calling thread: use --threads 1")
    if len(a.variants) < 2:
        p.error("give two variants or more")
    # read when the runtime starts its pool; no plan cache, so every variant is generated
    os.environ["LUMINAL_NUM_THREADS"] = str(a.threads)
    os.environ["LUMINAL_PLAN_CACHE"] = "0"
    import numpy as np

    import luminal as lm
    import luminal.targets.cpu as cpu_target

    kernels = [k for k in a.kernels.split(",") if k]
    if bad := [k for k in kernels if k not in KERNELS]:
        p.error(f"unknown kernels {bad}; known: {', '.join(KERNELS)}")
    names = [v.split(":", 1)[0] for v in a.variants]
    arrays: dict[str, tuple[dict[str, np.ndarray], dict[str, np.ndarray]]] = {}
    runs: dict[tuple[str, str], Callable[[], object]] = {}
    for v in a.variants:
        name, setting = v.split(":", 1) if ":" in v else (v, "")
        restore = apply(setting)
        cpu_target._RENDERED.clear()  # the in-process render cache would reuse the other C
        try:
            for k in kernels:
                g, shapes = build(k, a.rows, a.cols)
                cg = lm.compile(g, backend="cpu")
                if k not in arrays:
                    rng = np.random.default_rng(0)
                    ins = {n: rng.standard_normal(s, dtype=np.float32) for n, s in shapes.items()}
                    arrays[k] = (ins, {"y": np.empty_like(cg.run(ins)["y"])})
                runs[(k, name)] = _runner(cg, *arrays[k])
        finally:
            restore()
    clock = time.thread_time if a.cpu_time else time.perf_counter
    load0 = os.getloadavg()[0]
    times = interleaved(runs, a.rounds, clock)
    result: dict[str, Any] = {
        "threads": a.threads, "cpu_time": a.cpu_time, "rounds": a.rounds,
        "load_start_end": [load0, os.getloadavg()[0]], "kernels": {},
    }  # fmt: skip
    print(f"{a.rounds} rounds, {a.threads} thread(s), "
          f"{'thread CPU' if a.cpu_time else 'wall'} time, load {load0:.1f} -> "
          f"{os.getloadavg()[0]:.1f}")  # fmt: skip
    for k in kernels:
        row: dict[str, Any] = {}
        for n in names:
            q = np.percentile(times[(k, n)], [25, 50, 75]) * 1e3
            row[n] = {"q25_ms": q[0], "median_ms": q[1], "q75_ms": q[2]}
            print(f"{k:11s} {n:10s} median {q[1]:8.3f} ms  [{q[0]:.3f} .. {q[2]:.3f}]")
        ratio = [x / y for x, y in zip(times[(k, names[0])], times[(k, names[-1])], strict=True)]
        q = np.percentile(ratio, [25, 50, 75])
        row["ratio_first_last"] = {"q25": q[0], "median": statistics.median(ratio), "q75": q[2]}
        print(f"{k:11s} {names[0]}/{names[-1]} per round {q[1]:.3f} [{q[0]:.3f} .. {q[2]:.3f}]")
        result["kernels"][k] = row
    print(json.dumps(result, default=float))


if __name__ == "__main__":
    main()
