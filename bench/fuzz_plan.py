"""Fuzzes the plan loaders: thousands of mutated plans must each raise PlanError (or, when
the mutant was re-sealed with a valid size and checksum, load cleanly) and never crash.

    python bench/fuzz_plan.py --iterations 5000 --batch 500 --seed 0

Each batch runs in a subprocess, so a crash (signal) is caught and reported with the
mutation that caused it. The last line is JSON: {"iterations", "plan_errors", "loaded",
"crashes", "failures"}.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import struct
import subprocess
import sys
import tempfile
import zlib

import numpy as np

from luminal.plan import (
    Copy,
    FileWeight,
    InlineWeight,
    KernelFormat,
    Launch,
    LibCall,
    Op,
    Plan,
    PlanError,
    Role,
)

KERNEL = r"""
#include <stdint.h>
void scale2(void *const *args, const int64_t *dims, int64_t begin, int64_t end) {
  const float *x = args[0]; float *y = args[1];
  for (int64_t i = begin; i < end; ++i) y[i] = 2.0f * x[i];
}
"""


class _Dim:
    def __init__(self, name: str, scale: int = 1) -> None:
        self.name, self.scale = name, scale

    def to_postfix(self, dim_index: dict[str, int]) -> list[tuple[int, int]]:
        p = [(int(Op.DIM), dim_index[self.name])]
        return p if self.scale == 1 else [*p, (int(Op.CONST), self.scale), (int(Op.MUL), 0)]


def example_plan() -> Plan:
    """A small plan that uses every section: dims, all step kinds, weights, metadata."""
    seq, seq4 = _Dim("seq"), _Dim("seq", 4)
    p = Plan(backend="cpu", arch="x86_64", metadata={"model": "fuzz"})
    p.add_dim("seq", 1, 64)
    x = p.add_buffer("x", "f32", Role.input, (seq, 4))
    w = p.add_buffer("w", "f32", Role.weight, (4, 4))
    f = p.add_buffer("f", "f32", Role.weight, (4,))
    t = p.add_buffer("t", "f32", Role.scratch, (seq, 4), offset=0)
    y = p.add_buffer("y", "f32", Role.output, (seq, 4))
    k = p.add_kernel("scale2", KernelFormat.c_source, "scale2", KERNEL)
    p.steps += [
        LibCall("gemm", {"m": seq, "n": 4, "k": 4, "alpha": 1.0}, [x, w, t]),
        Launch(k, [t, y], grid=(seq4, 1, 1)),
        Copy(y, f, 16, 0, 0),
    ]
    p.weights += [
        InlineWeight(w, np.eye(4, dtype=np.float32)),
        FileWeight(f, "weights.bin", 8, 16),
    ]
    return p


def reseal(data: bytearray) -> bytearray:
    """Rewrites the header's size and checksum so the mutant reaches the body parser."""
    if len(data) >= 32:
        data[8:16] = struct.pack("<Q", len(data))
        data[24:28] = struct.pack("<I", zlib.crc32(bytes(data[32:])))
    return data


def mutate(orig: bytes, rng: random.Random) -> tuple[str, bytes, bool]:
    """Returns (description, mutant, resealed)."""
    d = bytearray(orig)
    kind = rng.choice(["truncate", "bitflip", "random", "version", "insert"])
    if kind == "truncate":
        n = rng.randrange(len(d))
        d = d[:n]
        desc = f"truncate to {n}"
    elif kind == "bitflip":
        bits = [rng.randrange(len(d) * 8) for _ in range(rng.randint(1, 8))]
        for b in bits:
            d[b // 8] ^= 1 << (b % 8)
        desc = f"flip bits {bits}"
    elif kind == "random":
        at, n = rng.randrange(len(d)), rng.randint(1, 16)
        d[at : at + n] = bytes(rng.randrange(256) for _ in range(n))
        desc = f"random bytes at {at}+{n}"
    elif kind == "version":
        v = rng.choice([0, 2, 3, 255, 2**32 - 1])
        d[4:8] = struct.pack("<I", v)
        desc = f"version {v}"
    else:
        at, n = rng.randrange(len(d)), rng.randint(1, 16)
        d[at:at] = bytes(rng.randrange(256) for _ in range(n))
        desc = f"insert {n} bytes at {at}"
    sealed = kind != "version" and rng.random() < 0.5
    if sealed:
        d = reseal(d)
    return f"{kind}: {desc}{' (resealed)' if sealed else ''}", bytes(d), sealed


def worker(plan_path: str, seed: int, count: int, progress: str) -> dict[str, int | list[str]]:
    from luminal import (
        _rt,  # noqa: F401  (loads after runtime's OpenBLAS preload)
        runtime,  # noqa: F401
    )

    orig = open(plan_path, "rb").read()
    rng = random.Random(seed)
    stats: dict[str, int | list[str]] = {"plan_errors": 0, "loaded": 0, "failures": []}
    failures: list[str] = []
    with open(progress, "w") as prog:
        for i in range(count):
            desc, data, sealed = mutate(orig, rng)
            prog.seek(0)
            prog.write(f"{seed}:{i}: {desc}\n")
            prog.truncate()
            prog.flush()
            if data == orig:
                continue
            for name, load in (
                ("c++", lambda d=data: _rt.Plan.from_bytes(d, ".")),
                ("python", lambda d=data: Plan.from_bytes(d)),
            ):
                try:
                    load()
                except PlanError:
                    stats["plan_errors"] += 1  # type: ignore[operator]
                    continue
                except Exception as e:  # noqa: BLE001  (anything else is a finding)
                    failures.append(f"{name} {desc}: {type(e).__name__}: {e}")
                    continue
                if sealed:
                    stats["loaded"] += 1  # type: ignore[operator]
                else:
                    failures.append(f"{name} {desc}: loaded without error")
    stats["failures"] = failures
    return stats


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", type=int, default=5000)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--worker", nargs=3, metavar=("PLAN", "SEED", "COUNT"), help=argparse.SUPPRESS)
    ap.add_argument("--progress", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        plan, seed, count = args.worker
        print(json.dumps(worker(plan, int(seed), int(count), args.progress)))
        return 0
    totals = run(args.iterations, args.batch, args.seed, verbose=True)
    return 1 if totals["failures"] else 0


def run(iterations: int, batch: int, seed: int, verbose: bool = False) -> dict:
    """Runs the fuzzer in subprocess batches; returns the totals."""
    totals = {"iterations": 0, "plan_errors": 0, "loaded": 0, "crashes": 0, "failures": []}
    with tempfile.TemporaryDirectory() as tmp:
        plan_path = os.path.join(tmp, "plan.lmp")
        example_plan().save(plan_path)
        progress = os.path.join(tmp, "progress.txt")
        for b in range(0, iterations, batch):
            n = min(batch, iterations - b)
            proc = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--worker",
                    plan_path,
                    str(seed + b),
                    str(n),
                    "--progress",
                    progress,
                ],
                capture_output=True,
                text=True,
            )
            totals["iterations"] += n
            if proc.returncode != 0:
                last = open(progress).read().strip() if os.path.exists(progress) else "?"
                totals["crashes"] += 1
                totals["failures"].append(
                    f"crash (rc {proc.returncode}) at {last}: {proc.stderr.strip()[-500:]}"
                )
                continue
            stats = json.loads(proc.stdout.strip().splitlines()[-1])
            totals["plan_errors"] += stats["plan_errors"]
            totals["loaded"] += stats["loaded"]
            totals["failures"] += stats["failures"]
            if verbose:
                print(f"batch seed {seed + b}: {n} mutants, {len(stats['failures'])} failures")
    if verbose:
        for f in totals["failures"][:20]:
            print("FAIL", f)
        print(
            f"{'iterations':>12} {'plan errors':>12} {'loaded':>8} {'crashes':>8} {'failures':>9}"
        )
        print(
            f"{totals['iterations']:>12} {totals['plan_errors']:>12} {totals['loaded']:>8} "
            f"{totals['crashes']:>8} {len(totals['failures']):>9}"
        )
        print(json.dumps({**totals, "failures": len(totals["failures"])}))
    return totals


if __name__ == "__main__":
    sys.exit(main())
