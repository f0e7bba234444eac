"""Runtime overhead: C++ per-step dispatch, Python run() call cost, vs PyTorch eager per op.

    python bench/overhead.py [--steps 1000] [--repeat 2000]

Prints a table; the last line is JSON with per_step_us, run_call_us, torch_per_op_us and
torch_glue_us (a ``torch.compile(backend="luminal")`` partition call's cost beyond its native
plan run, for a Linear 16-32-16 MLP: see bench/torch_backend.py's ``glue_us``).
Goals: under 0.5 µs per step and under 10 µs per run() call or partition call.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable

import numpy as np

from luminal import runtime
from luminal.plan import KernelFormat, Launch, Plan, Role

N_KERNELS = 10


def tiny_plan(steps: int) -> Plan:
    """`steps` one-task launches of tiny kernels, each adding to one float of an output."""
    p = Plan()
    x = p.add_buffer("x", "f32", Role.input, (1,))
    y = p.add_buffer("y", "f32", Role.output, (N_KERNELS,))
    for i in range(N_KERNELS):  # the CPU runtime compiles each kernel's source on its own
        src = (
            "#include <stdint.h>\n"
            f"void inc{i}(void *const *a, const int64_t *d, int64_t b, int64_t e) "
            f"{{ float *x = a[1]; x[{i}] = ((const float *)a[0])[0] + {i}; }}\n"
        )
        p.add_kernel(f"inc{i}", KernelFormat.c_source, f"inc{i}", src)
    for s in range(steps):
        p.steps.append(Launch(s % N_KERNELS, [x, y], grid=(1, 1, 1)))
    return p


def per_call_us(fn: Callable[[], object], repeat: int) -> float:
    for _ in range(min(repeat, 200)):
        fn()
    samples = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(repeat):
            fn()
        samples.append((time.perf_counter() - t) / repeat * 1e6)
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=2000)
    args = ap.parse_args()

    x = np.ones(1, np.float32)
    one = runtime.load(tiny_plan(1))
    many = runtime.load(tiny_plan(args.steps))
    assert many.run({"x": x})["y"][3] == 4.0
    run_call = per_call_us(lambda: one.run({"x": x}), args.repeat)
    many_call = per_call_us(lambda: many.run({"x": x}), max(args.repeat // 10, 20))
    per_step = (many_call - run_call) / (args.steps - 1)

    import torch  # only the bench needs it

    torch.set_num_threads(os.cpu_count() or 1)
    a, b = torch.ones(1), torch.ones(1)
    torch_op = per_call_us(lambda: torch.add(a, b), args.repeat * 5)

    glue = torch_glue_us(args.repeat // 10 or 1)

    rows = [
        ("luminal per step (C++ dispatch)", per_step),
        ("luminal run() call, 1 step", run_call),
        (f"luminal run() call, {args.steps} steps", many_call),
        ("torch eager per op (add, 1 elem)", torch_op),
        ("torch.compile partition glue", glue),
    ]
    print(f"{'measure':<40} {'µs':>10}")
    for name, us in rows:
        print(f"{name:<40} {us:>10.3f}")
    print(f"{'per step vs torch per op':<40} {per_step / torch_op:>10.3f}x")
    print(
        json.dumps(
            {
                "per_step_us": round(per_step, 4),
                "run_call_us": round(run_call, 3),
                "torch_per_op_us": round(torch_op, 3),
                "torch_glue_us": round(glue, 2),
                "steps": args.steps,
                "threads": os.environ.get("LUMINAL_NUM_THREADS", os.cpu_count()),
            }
        )
    )


def torch_glue_us(repeat: int) -> float:
    """Median over 5 rounds of bench/torch_backend.py's ``glue_us`` for a small MLP."""
    import sys

    import torch
    from torch import nn

    sys.path.insert(0, os.path.dirname(__file__))
    import luminal.torch_backend as lt
    from torch_backend import _glue_us

    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16)).eval()
    x = torch.randn(8, 16)
    f = torch.compile(m, backend=lt.luminal_backend, dynamic=True)
    with torch.no_grad():
        f(x)
        rounds = [_glue_us(lambda: f(x), repeat) for _ in range(5)]
    return statistics.median(r for r in rounds if r is not None)


if __name__ == "__main__":
    main()
