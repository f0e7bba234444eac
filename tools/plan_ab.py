"""Old against new generated kernels, timed in one process: each commit (installed as
``tools/ab.py`` installs it) compiles the same graphs and saves their plans; then this
checkout's runtime loads both sets and times them interleaved, call by call.

    python tools/plan_ab.py 82c516d HEAD
    python tools/plan_ab.py OLD NEW --cases softmax,gelu_chain --shape 2048x4096 --rounds 30

Where ``tools/ab.py`` compares whole benchmark runs (seconds apart, each against contenders
timed in its own run), this takes the machine's drift out of the comparison: both plans read
the same numpy inputs and write preallocated numpy outputs (the layout a caller's arrays
have), and each round times every case of both commits back to back (best of --calls calls);
each new time is also a fraction of a copy's rate over the same arrays (torch's, else numpy's).
A plan's kernels are C sources the loading runtime compiles, so the old commit's code runs
as it generated it; its C++ runtime must read this checkout's plan format. Prints a table
(median over rounds, old/new) and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ab import build  # noqa: E402

# name -> the graph's inputs (name, shape kind) and its output, in luminal.functional
CASES = {
    "softmax": "F.softmax(x, -1)",
    "layer_norm": "F.layer_norm(x, (cols,), w, b, 1e-5)",
    "rms_norm": "F.rms_norm(x, (cols,), w, 1e-6)",
    "gelu_chain": 'F.gelu(x * w + b, approximate="tanh") * c',
    "gelu_erf": "F.gelu(x)",
    "silu": "F.silu(x)",
}

# run by each commit's python: builds the case graphs, compiles and saves their plans
_CHILD = r"""
import sys
import luminal as lm
import luminal.functional as F
out, rows, cols = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for name, expr in eval(sys.argv[4]).items():
    g = lm.Graph(name)
    x = g.input("x", (rows, cols))
    w, b, c = (g.input(k, (cols,)) for k in "wbc")
    g.output("y", eval(expr))
    lm.compile(g).save(f"{out}/{name}.plan")
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--cases", default=",".join(CASES), help=f"of {', '.join(CASES)}")
    p.add_argument("--shape", default="4096x4096", help="rows x cols")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--calls", type=int, default=5, help="calls per case and round (best kept)")
    p.add_argument("--work", default=os.path.join(os.path.expanduser("~"), ".cache",
                                                  "luminal-ab"))  # fmt: skip
    p.add_argument("--torch", default="torch==2.13.0", help="pip spec of torch")
    a = p.parse_args()
    names = a.cases.split(",")
    if unknown := [n for n in names if n not in CASES]:
        raise SystemExit(f"plan_ab: unknown case(s) {unknown}; known: {', '.join(CASES)}")
    rows, cols = (int(v) for v in a.shape.lower().split("x"))
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    sides = [build(rev, work, a.torch) for rev in (a.old, a.new)]
    dirs = []
    for sha, _, py in sides:
        d = work / f"plans-{sha}-{rows}x{cols}"
        d.mkdir(exist_ok=True)
        env = {**os.environ, "LUMINAL_CACHE_DIR": str(work / f"cache-{sha}")}
        env.pop("PYTHONPATH", None)
        cases = repr({n: CASES[n] for n in names})
        subprocess.run([str(py), "-c", _CHILD, str(d), str(rows), str(cols), cases], check=True,
                       env=env, cwd=work)  # fmt: skip
        dirs.append(d)

    import numpy as np

    import luminal as lm

    rng = np.random.default_rng(0)
    inputs = {"x": rng.standard_normal((rows, cols), dtype=np.float32)}
    inputs |= {k: rng.standard_normal(cols, dtype=np.float32) for k in "wbc"}
    plans = [[lm.load(d / f"{n}.plan") for n in names] for d in dirs]  # Executors
    times: list[list[list[float]]] = [[[] for _ in names] for _ in sides]
    out = {"y": np.empty((rows, cols), np.float32)}
    for r in range(a.rounds):
        for j in range(len(names)):
            for s in (0, 1) if r % 2 == 0 else (1, 0):
                ex = plans[s][j]
                feed = {k: v for k, v in inputs.items() if k in ex.inputs}
                ex.run(feed, out=out)
                best = float("inf")
                for _ in range(a.calls):
                    t = time.perf_counter()
                    ex.run(feed, out=out)
                    best = min(best, time.perf_counter() - t)
                times[s][j].append(best)
    # the copy's rate: every case reads x and writes y once at least (8 bytes per element);
    # torch's copy runs on every core (numpy's on one)
    try:
        import torch

        src, dst = torch.from_numpy(inputs["x"]), torch.from_numpy(out["y"])
        copy_fn: Callable[[], object] = lambda: dst.copy_(src)  # noqa: E731
        how = "torch"
    except ImportError:
        copy_fn, how = (lambda: np.copyto(out["y"], inputs["x"])), "numpy"
    copy = float("inf")
    for _ in range(9):
        t = time.perf_counter()
        copy_fn()
        copy = min(copy, time.perf_counter() - t)
    gbs = 8 * rows * cols / copy / 1e9
    summary: dict[str, object] = {"old": sides[0][0], "new": sides[1][0], "shape": a.shape,
                                  "rounds": a.rounds, "copy_gbs": round(gbs, 2)}  # fmt: skip
    print(f"\n{sides[0][0]} (old) vs {sides[1][0]} (new), {rows}x{cols}, {a.rounds} rounds, "
          f"best of {a.calls} calls each; medians over rounds; {how} copy {gbs:.1f} GB/s "
          "(best of 9, after the rounds)")  # fmt: skip
    print(f"{'case':<12} {'old ms':>9} {'new ms':>9} {'old/new':>8} {'new of copy':>12}")
    for j, n in enumerate(names):
        o, nw = (statistics.median(times[s][j]) for s in (0, 1))
        frac = 8 * rows * cols / nw / 1e9 / gbs
        summary[n] = {"old_ms": round(o * 1e3, 4), "new_ms": round(nw * 1e3, 4),
                      "speedup": round(o / nw, 3), "new_frac_copy": round(frac, 3)}  # fmt: skip
        print(f"{n:<12} {o * 1e3:>9.3f} {nw * 1e3:>9.3f} {o / nw:>8.2f}x {frac:>12.2f}")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
