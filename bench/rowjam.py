"""A product of a few rows by a block-quantized weight, several ways, at 1..64 rows:

- ``plain``: the generated kernel, one output element per reduction loop (every weight block
  dequantized again for every row);
- ``jam=J``: the same kernel jammed (``K.Schedule.jam``): J rows per reduction loop share
  each block's load and dequantization;
- ``RxC``: 2-D register blocks (``K.Schedule.jam`` x ``jam2``): R rows by C weight rows per
  reduction loop, each weight block dequantized once for R rows and each activation vector
  loaded once for C columns; ``/1`` after a name: task order 1 (a thread's tasks share a
  chunk of weight rows across the row blocks), ``/sS``: the reduction split by S
  (``--splits``; Q8_0's blocks of 32 split by 32 instead of the default 16);
- ``copy+gemm``: the weight dequantized into a scratch buffer, then a BLAS GEMM (the library
  call the search offers for the quantized kernel);
- ``f32 gemm``: a GEMM on weights folded to f32 before the run (what ``luminal serve``'s
  folded plan does: no dequantization, 4 bytes per weight read).

    python bench/rowjam.py [--fmt Q4_1] [--n 1536] [--k 576] [--rows 1,2,4,8,16,64]
                           [--jams 2,4,8] [--blocks 4x2,3x3,2x4] [--splits=-1,32]

Each program is timed through the runtime by the search's own measurement (the CPU target's
``measure``: fastest of up to 5 runs, caches evicted first when the inputs exceed an L1),
in ``--rounds`` rounds, the contenders interleaved within each round; the best round is
reported. The thread count is the runtime's (``LUMINAL_NUM_THREADS``). Prints a table (ms)
and one JSON line.
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
from luminal.compiler.fold import fold_weights
from luminal.compiler.lower import BufferInfo, Lowered, lower
from luminal.compiler.pipeline import graph_passes
from luminal.compiler.search.gemm import match_any
from luminal.graph import symbolic as sym
from luminal.loaders import quants
from luminal.targets.cpu import CpuTarget

# byte offsets of each block's f16 fields (scale, and Q4_1's minimum)
_F16_AT = {"Q4_0": [0], "Q4_1": [0, 2], "Q8_0": [0]}


def _blocks(fmt: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Random bytes as blocks of ``fmt``, with finite f16 scales."""
    f = quants.FORMATS[fmt]
    nb = rows * cols // f.block
    raw = rng.integers(0, 256, size=(nb, f.type_size), dtype=np.uint8)
    for o in _F16_AT[fmt]:
        half = rng.uniform(-2, 2, size=nb).astype(np.float16)
        raw[:, o : o + 2] = half.view(np.uint8).reshape(nb, 2)
    return raw.reshape(-1)


def _graph(fmt: str, n: int, k: int) -> lm.Graph:
    rng = np.random.default_rng(0)
    g = lm.Graph(f"rowjam_{fmt}")
    x = g.input("x", (sym.dim("rows", 1, 256), k))
    if fmt == "F32":
        w = g.weight("w", data=rng.standard_normal((n, k)).astype(np.float32))
    else:
        w = quants.quantized_weight(g, "w", fmt, _blocks(fmt, n, k, rng), (n, k))
    g.output("y", x @ w.transpose(0, 1))
    return g


def _programs(
    fmt: str, n: int, k: int, jams: list[int], blocks: list[tuple[int, int]], splits: list[int]
) -> dict[str, Lowered]:
    g = _graph(fmt, n, k)
    low = lower(graph_passes(g))
    (kern,) = [s for s in low.kernels if isinstance(s, K.Kernel)]
    scheds = {"plain": K.Schedule(jam=0)}
    for split in splits:
        for order in (0, 1):
            tail = ("/1" if order else "") + (f"/s{split}" if split > 0 else "")
            scheds |= {f"jam={j}{tail}": K.Schedule(split, 0, order, j) for j in jams}
            scheds |= {f"{r}x{c}{tail}": K.Schedule(split, 0, order, r if r > 1 else 0, 0, c)
                       for r, c in blocks}  # fmt: skip
    out = {name: replace(low, kernels=[replace(kern, schedule=s)]) for name, s in scheds.items()}
    alt = match_any(kern, len(low.buffers))
    if alt is not None and fmt != "F32":
        extra = [BufferInfo(c.out, c.name, c.dtype, c.shape, "scratch") for c in alt.copies]
        if alt.scratch_shape is not None:
            extra.append(BufferInfo(alt.call.out, "prod", kern.dtype, alt.scratch_shape, "scratch"))
        steps = [*alt.copies, alt.call, *([alt.epilogue] if alt.epilogue else [])]
        out["copy+gemm"] = Lowered([*low.buffers, *extra], steps, low.dims, low.weights)
    folded = lower(graph_passes(fold_weights(g)))
    fk = folded.kernels[0]
    assert isinstance(fk, K.Kernel)
    falt = match_any(fk, len(folded.buffers))
    if falt is not None and not falt.copies and falt.epilogue is None:
        out["f32 gemm"] = replace(folded, kernels=[falt.call])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fmt", default="Q4_1", choices=["Q4_0", "Q4_1", "Q8_0", "F32"])
    ap.add_argument("--n", type=int, default=1536, help="weight rows (outputs)")
    ap.add_argument("--k", type=int, default=576, help="weight columns (the reduction)")
    ap.add_argument("--rows", default="1,2,4,8,16,64")
    ap.add_argument("--jams", default="2,4,8")
    ap.add_argument("--blocks", default="4x2,3x3,2x4", help="2-D blocks RxC ('' for none)")
    ap.add_argument("--splits", default="-1", help="splits of the weight's blocks (-1: default)")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    rows = [int(r) for r in a.rows.split(",")]
    blocks = [(int(r), int(c)) for r, c in (b.split("x") for b in a.blocks.split(",") if b)]
    jams, splits = [int(j) for j in a.jams.split(",")], [int(s) for s in a.splits.split(",")]
    progs = _programs(a.fmt, a.n, a.k, jams, blocks, splits)
    target = CpuTarget()
    target.prepare(list(progs.values()))
    ref = {r: target.evaluate(progs["plain"], {"rows": r})["y"] for r in rows}
    best: dict[str, dict[int, float]] = {name: {} for name in progs}
    for _ in range(a.rounds):
        for r in rows:
            for name, p in progs.items():
                t = target.measure(p, {"rows": r})
                if t.outputs is not None:
                    y, want = t.outputs["y"], ref[r]
                    if not np.allclose(y, want, rtol=1e-3, atol=1e-3 * np.abs(want).max()):
                        sys.exit(f"{name} at {r} rows does not match the plain kernel")
                best[name][r] = min(best[name].get(r, t.seconds), t.seconds)
    threads = os.environ.get("LUMINAL_NUM_THREADS", "all")
    print(f"{a.fmt} ({a.n} x {a.k}) x rows, ms (best of {a.rounds} rounds, threads {threads})")
    print(f"{'program':>10} " + " ".join(f"{r:>8}" for r in rows))
    for name, ts in best.items():
        print(f"{name:>10} " + " ".join(f"{1e3 * ts[r]:8.3f}" for r in rows))
    print(json.dumps({"fmt": a.fmt, "n": a.n, "k": a.k, "threads": threads,
                      "ms": {name: {str(r): round(1e3 * t, 4) for r, t in ts.items()}
                             for name, ts in best.items()}}))  # fmt: skip


if __name__ == "__main__":
    main()
