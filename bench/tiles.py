"""Register blocks of a generated f32 product (``K.Schedule.jam`` x ``jam2``) against the row
jam alone and the BLAS call, at M x K x N sizes of small transformers:

- ``jam=J``: J rows per reduction loop sharing each weight load (the row jam);
- ``RxC``: R rows by C columns per reduction loop: R + C loads for R * C products;
- ``gemm``: the library call the search offers for the product;
- ``in,out``: the generated kernel (default schedule) of the weight stored [in, out] and not
  transposed at compile time (``fold.py``'s transposed reads): its loads strided along the sum.

    python bench/tiles.py [--m 17,32,128] [--kn 128x384,128x512,512x128,576x1536]
                          [--blocks 4x1,8x1,4x2,4x3,2x4] [--rounds 3]

Each program is timed through the runtime by the search's own measurement (the CPU target's
``measure``: fastest of up to 5 runs), in ``--rounds`` rounds with the contenders interleaved
within each round; the best round is reported, checked against the unblocked kernel. The
thread count is the runtime's (``LUMINAL_NUM_THREADS``). Prints a table (µs, GFLOP/s of the
best generated block) and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace

import numpy as np

import luminal as lm
from luminal.compiler import kernel_ir as K
from luminal.compiler.lower import Lowered, lower
from luminal.compiler.pipeline import graph_passes
from luminal.compiler.search.gemm import match_any
from luminal.graph import symbolic as sym
from luminal.targets.cpu import CpuTarget


def _programs(k: int, n: int, blocks: list[tuple[int, int]]) -> dict[str, Lowered]:
    rng = np.random.default_rng(0)
    g = lm.Graph(f"tiles_{k}x{n}")
    x = g.input("x", (sym.dim("rows", 1, 256), k))
    w = g.weight("w", data=rng.standard_normal((n, k)).astype(np.float32))
    g.output("y", x @ w.transpose(0, 1))
    low = lower(graph_passes(g))
    (kern,) = [s for s in low.kernels if isinstance(s, K.Kernel)]
    out = {"plain": replace(low, kernels=[replace(kern, schedule=K.Schedule(jam=0))])}
    for r, c in blocks:
        for order in (0, 1):
            sched = K.Schedule(-1, 0, order, r if r > 1 else 0, 0, c if c > 1 else 0)
            name = f"{r}x{c}" + ("/1" if order else "")
            out[name] = replace(low, kernels=[replace(kern, schedule=sched)])
    # the weight stored [in, out] (GPT-2's), unfolded: its loads strided along the sum
    gt = lm.Graph(f"tiles_t_{k}x{n}")
    xt = gt.input("x", (sym.dim("rows", 1, 256), k))
    gt.output("y", xt @ gt.weight("wt", data=np.ascontiguousarray(g.weights["w"].T)))
    out["in,out"] = lower(gt)
    alt = match_any(kern, len(low.buffers))
    if alt is not None and not alt.copies and alt.epilogue is None:
        out["gemm"] = replace(low, kernels=[alt.call])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--m", default="17,32,128")
    ap.add_argument("--kn", default="128x384,128x512,512x128,576x1536")
    ap.add_argument("--blocks", default="4x1,8x1,4x2,4x3,2x4")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    ms = [int(m) for m in a.m.split(",")]
    kns = [tuple(int(v) for v in s.split("x")) for s in a.kn.split(",")]
    blocks = [tuple(int(v) for v in s.split("x")) for s in a.blocks.split(",")]
    target = CpuTarget()
    progs = {kn: _programs(kn[0], kn[1], blocks) for kn in kns}  # type: ignore[arg-type]
    target.prepare([p for ps in progs.values() for p in ps.values()])
    best: dict[tuple, dict[str, float]] = {}
    for _ in range(a.rounds):
        for kn, ps in progs.items():
            for m in ms:
                ref = target.evaluate(ps["plain"], {"rows": m})["y"]
                row = best.setdefault((m, *kn), {})
                for name, p in ps.items():
                    t = target.measure(p, {"rows": m})
                    if t.outputs is not None:
                        y = t.outputs["y"]
                        if not np.allclose(y, ref, rtol=1e-3, atol=1e-3 * np.abs(ref).max()):
                            sys.exit(f"{name} at {m}x{kn} does not match the plain kernel")
                    row[name] = min(row.get(name, t.seconds), t.seconds)
    threads = os.environ.get("LUMINAL_NUM_THREADS", "all")
    names = list(next(iter(progs.values())))
    print(f"f32 M x K x N products, µs (best of {a.rounds} rounds, threads {threads})")
    head = " ".join(f"{s:>8}" for s in names)
    print(f"{'M x K x N':>16} {head}  best block GF/s  vs-jam  vs-gemm")
    rows = []
    for (m, k, n), ts in best.items():
        old = [s for s in names if s.split("/")[0].endswith("x1")]  # the row jam alone
        jam = min(ts[s] for s in old)
        mine = [s for s in names if s not in ("gemm", "plain", "in,out") and s not in old]
        gen = min(ts[s] for s in mine)
        pick = min(mine, key=ts.__getitem__)
        gf = 2 * m * k * n / gen / 1e9
        line = f"{f'{m}x{k}x{n}':>16} " + " ".join(f"{1e6 * ts[s]:8.1f}" for s in names)
        line += f"  {pick:>6} {gf:6.1f}  {jam / gen:6.2f}x"
        if "gemm" in ts:
            line += f"  {ts['gemm'] / gen:6.2f}x"
        print(line)
        rows.append({"m": m, "k": k, "n": n, "us": {s: round(1e6 * t, 2) for s, t in ts.items()}})
    print(json.dumps({"bench": "tiles", "threads": threads, "rounds": a.rounds, "rows": rows}))


if __name__ == "__main__":
    main()
