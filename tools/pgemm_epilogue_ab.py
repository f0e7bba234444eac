"""pgemm with its epilogue fused against pgemm and the generated epilogue kernel, in one process.

    python tools/pgemm_epilogue_ab.py --m 32 --k 384 --n 1536 --acts gelu,relu
    python tools/pgemm_epilogue_ab.py --threads 1 --cpu-time --rounds 30

Each activation's ``act(x @ W^T + b)`` (W and b plan weights) is compiled twice with the
library-call search forced to keep the fused call or the call and the epilogue kernel apart
(the same pgemm schedule: mr, packing); both plans run on the same input and output arrays in
interleaved rounds (the order rotating: ``codegen_ab.interleaved``), each round the best of
--calls calls. Prints per activation the median and quartiles of each and the per-round ratio
unfused / fused (> 1: the fused call is faster), then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

from codegen_ab import interleaved  # tools/: a script's folder is on the import path


def build(act: str, m: int, k: int, n: int) -> Any:
    import numpy as np

    import luminal as lm
    import luminal.functional as F  # noqa: N812

    acts = {"none": lambda x: x, "relu": F.relu, "silu": F.silu, "gelu": F.gelu,
            "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "sigmoid": F.sigmoid}  # fmt: skip
    rng = np.random.default_rng(0)
    g = lm.Graph(f"epi_{act}")
    x = g.input("x", (m, k))
    w = g.weight("w", data=rng.standard_normal((n, k), dtype=np.float32))
    b = g.weight("b", data=rng.standard_normal(n, dtype=np.float32))
    g.output("y", acts[act](x @ w.transpose(0, 1) + b))
    return g


def compile_forced(g: Any, fused: bool) -> Any:
    """The graph's plan with the search made to keep the fused pgemm (or pgemm + kernel)."""
    import luminal as lm
    from luminal.compile import build_plan
    from luminal.compiler import kernel_ir as K
    from luminal.compiler.lower import lower
    from luminal.compiler.search import select
    from luminal.compiler.search.tuner import Tuner, clear_memory_cache
    from luminal.targets.cpu import CpuTarget

    clear_memory_cache()
    select.MIN_GEMM_WORK = 0  # small products too

    def measure(sub: Any, dims: Any) -> float:
        calls = [s for s in sub.kernels if isinstance(s, K.LibCall)]
        if any("epi" in c.fields for c in calls):
            return 1.0 if fused else 3.0
        return 2.0 if any(c.func == "pgemm" for c in calls) else 4.0

    t = CpuTarget()
    tuner = Tuner(measure, f"ab-{fused}", variants=t.library_variants,
                  epilogues=t.library_epilogues, max_candidates=20)  # fmt: skip
    low = select.choose_library_calls(lower(g), tuner)
    got = any(isinstance(s, K.LibCall) and "epi" in s.fields for s in low.kernels)
    if got != fused:
        raise SystemExit(f"{g.name}: the fused call was {'not ' if fused else ''}kept")
    return lm.load(build_plan(low, g.name).to_bytes())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--m", type=int, default=32)
    p.add_argument("--k", type=int, default=384)
    p.add_argument("--n", type=int, default=1536)
    p.add_argument("--acts", default="none,relu,silu,gelu,gelu_tanh")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--cpu-time", action="store_true", help="thread CPU time (--threads 1)")
    a = p.parse_args()
    if a.cpu_time and a.threads != 1:
        p.error("--cpu-time times the calling thread: use --threads 1")
    os.environ["LUMINAL_NUM_THREADS"] = str(a.threads)
    import numpy as np

    clock = time.thread_time if a.cpu_time else time.perf_counter
    acts = [x for x in a.acts.split(",") if x]
    runs: dict[tuple[str, str], Any] = {}
    for act in acts:
        g = build(act, a.m, a.k, a.n)
        x = np.random.default_rng(1).standard_normal((a.m, a.k), dtype=np.float32)
        plans = {v: compile_forced(g, v == "fused") for v in ("fused", "unfused")}
        outs = {v: {"y": np.empty((a.m, a.n), np.float32)} for v in plans}
        ref = plans["unfused"].run({"x": x})["y"]
        np.testing.assert_allclose(plans["fused"].run({"x": x})["y"], ref, rtol=1e-5, atol=1e-5)
        for v, ex in plans.items():
            runs[(act, v)] = lambda ex=ex, o=outs[v], x=x: ex.run({"x": x}, out=o)
    load0 = os.getloadavg()[0]
    times = interleaved(runs, a.rounds, clock, warmup=0, calls=a.calls)
    result: dict[str, Any] = {
        "m": a.m, "k": a.k, "n": a.n, "threads": a.threads, "cpu_time": a.cpu_time,
        "rounds": a.rounds, "load_start_end": [load0, os.getloadavg()[0]], "acts": {},
    }  # fmt: skip
    print(f"M {a.m} K {a.k} N {a.n}: {a.rounds} rounds of the best of {a.calls} calls, "
          f"{a.threads} thread(s), {'thread CPU' if a.cpu_time else 'wall'} time, "
          f"load {load0:.1f} -> {os.getloadavg()[0]:.1f}")  # fmt: skip
    for act in acts:
        row: dict[str, Any] = {}
        for v in ("unfused", "fused"):
            q = np.percentile(times[(act, v)], [25, 50, 75]) * 1e6
            row[v] = {"q25_us": q[0], "median_us": q[1], "q75_us": q[2]}
            print(f"{act:10s} {v:8s} median {q[1]:9.1f} us  [{q[0]:.1f} .. {q[2]:.1f}]")
        ratio = [u / f for u, f in zip(times[(act, "unfused")], times[(act, "fused")], strict=True)]
        q = np.percentile(ratio, [25, 50, 75])
        row["unfused_over_fused"] = {"q25": q[0], "median": statistics.median(ratio), "q75": q[2]}
        print(f"{act:10s} unfused/fused per round {q[1]:.3f} [{q[0]:.3f} .. {q[2]:.3f}]")
        result["acts"][act] = row
    print(json.dumps(result, default=float))


if __name__ == "__main__":
    main()
