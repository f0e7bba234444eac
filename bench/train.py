"""Training step time and peak memory: luminal's compiled step (forward + backward + AdamW in
one plan) and torch.compile with luminal's training backend (forward and backward plans,
torch's AdamW) against PyTorch eager and torch.compile (inductor) on the example's LM.

    python bench/train.py [--steps 30] [--dim 32] [--ctx 32] [--batch 8] [--threads 2]

Each contender runs in its own process (same model sizes, init and batches), so its peak
resident memory (ru_maxrss) is its own; "train MB" is the growth of RSS from before the first
step (the model built, nothing compiled) to the peak: compile-time and activation memory.
OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are removed and thread counts set equal for every
contender. Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BLAS_OVERRIDES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_one(which: str, a: argparse.Namespace) -> dict:
    sys.path.insert(0, os.path.join(HERE, "..", "examples"))
    import numpy as np
    import torch
    import train_lm

    torch.set_num_threads(a.threads)
    data, chars = train_lm.load_text()
    torch.manual_seed(0)
    ref = train_lm.torch_reference(len(chars), a.ctx, a.dim, a.heads, a.layers)
    batches = train_lm.batches(data, a.batch, a.ctx)
    before = _rss_mb()
    t0 = time.perf_counter()
    if which == "luminal":
        from luminal import optim

        model = train_lm.TinyLM(len(chars), a.ctx, a.dim, a.heads, a.layers)
        model.load_state_dict({k: v.detach().numpy().copy() for k, v in ref.state_dict().items()})
        step = train_lm.make_step(model, optim.AdamW(lr=3e-3), a.batch)

        def one(x: np.ndarray, y: np.ndarray) -> float:
            return step(x=x, y=y)
    else:
        if which == "torch_luminal":  # torch.compile training with luminal both directions
            from luminal.torch_backend import aot

            fwd = torch.compile(ref, backend=aot.training_backend)
        else:
            fwd = torch.compile(ref) if which == "inductor" else ref
        opt = torch.optim.AdamW(ref.parameters(), lr=3e-3)

        def one(x: np.ndarray, y: np.ndarray) -> float:
            opt.zero_grad()
            loss = fwd(torch.from_numpy(x).long(), torch.from_numpy(y).long())
            loss.backward()
            opt.step()
            return float(loss)

    x, y = next(batches)
    first_loss = one(x, y)  # compiles (luminal already has; inductor does here)
    setup_s = time.perf_counter() - t0
    times, losses = [], [first_loss]
    for _ in range(a.steps):
        x, y = next(batches)
        t = time.perf_counter()
        losses.append(one(x, y))
        times.append(time.perf_counter() - t)
    return {
        "contender": which,
        "step_ms": 1e3 * statistics.median(times),
        "step_ms_min": 1e3 * min(times),
        "step_ms_max": 1e3 * max(times),
        "setup_s": setup_s,
        "peak_mb": _peak_mb(),
        "train_mb": _peak_mb() - before,
        "last_loss": losses[-1],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--ctx", type=int, default=32)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--contenders", default="luminal,torch_luminal,eager,inductor")
    p.add_argument("--run", help=argparse.SUPPRESS)  # one contender, in this process
    a = p.parse_args()
    if a.run:
        print(json.dumps(run_one(a.run, a)))
        return
    env = {k: v for k, v in os.environ.items() if k not in BLAS_OVERRIDES}
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "LUMINAL_NUM_THREADS"):
        env[k] = str(a.threads)
    rows = []
    for c in a.contenders.split(","):
        out = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--run", c], env=env,
                             capture_output=True, text=True)  # fmt: skip
        if out.returncode != 0:
            print(f"{c}: failed\n{out.stderr[-2000:]}", file=sys.stderr)
            continue
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    base = next((r for r in rows if r["contender"] == "eager"), None)
    print(f"{'contender':<10} {'step ms':>9} {'(min-max)':>15} {'setup s':>8} "
          f"{'peak MB':>8} {'train MB':>9} {'vs eager':>9}")  # fmt: skip
    for r in rows:
        ratio = base["step_ms"] / r["step_ms"] if base else float("nan")
        rng = f"{r['step_ms_min']:.1f}-{r['step_ms_max']:.1f}"
        print(f"{r['contender']:<10} {r['step_ms']:>9.2f} {rng:>15} {r['setup_s']:>8.1f} "
              f"{r['peak_mb']:>8.0f} {r['train_mb']:>9.0f} {ratio:>8.2f}x")  # fmt: skip
    cfg = {k: getattr(a, k) for k in ("steps", "dim", "heads", "layers", "ctx", "batch", "threads")}
    print(json.dumps({"bench": "train", "config": cfg, "results": rows}))


if __name__ == "__main__":
    main()
