"""Kernel benchmark: luminal against PyTorch eager, torch.compile and numpy, in one run.

    python bench/kernels.py                    # full run (under ~10 minutes on 2 cores)
    python bench/kernels.py --quick            # small sizes, few repeats (a smoke test)
    python bench/kernels.py --only gemm --json-out gemm.json

Kernels: softmax, layer norm, RMS norm, a GELU chain (gelu(x*a+b)*c), GEMV 4096x4096 (the
memory-bound group), GEMM 512..4096, linear layers (y = x @ W^T with W a weight: 17, 128 and
2048 rows by SmolLM2's 576 -> 1536 and MiniLM's 1536 -> 384), convolutions (batch 1: a 7x7
stride-2 stem, 3x3 at 56x56, 3x3 stride 2 at 28x28; W a weight) and attention (seq 1024..4096,
head dim 64, 4 heads; plus a causal variant). luminal gets each as a graph built with the
functional API (attention written naively: q@k^T * scale, softmax, @v), compiled once; its result is
checked against numpy before it is timed. The same run measures the machine's limits:
memory bandwidth (best of a numpy copy, a torch copy and a torch triad over 256 MiB arrays)
and peak FLOP/s (best sgemm at 4096 among numpy's BLAS and torch.matmul), so every luminal
time is also a fraction of a physical limit.

Fairness: OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are removed for every contender (the script
re-executes itself without them: OpenBLAS reads them when it loads) and every contender runs
with --threads threads (default 2: torch.set_num_threads, LUMINAL_NUM_THREADS,
OMP/OPENBLAS/MKL_NUM_THREADS). Timing: one warm-up call per contender, then the contenders of
a case take turns, the order rotating from turn to turn, so that the threads a library leaves
spinning after its calls and the machine's drifting load hit every contender alike. A turn
runs a contender untimed for 120 ms (at least one call), then times 3 calls; a contender gets
turns until it has --repeats timed calls or has spent --budget seconds (untimed calls
included). The median is reported (a fraction of a limit uses the best call, as the limits
are best runs themselves). What is timed is the call writing its
result: luminal writes preallocated outputs (``run(..., out=)``), and so does PyTorch eager
where ATen has an out= overload (softmax, layer norm, the GELU chain with one preallocated
temporary); numpy, torch.compile and the other torch rows allocate their outputs per call,
page faults included. The limits are measured at the start
and at the end (BLAS rates seen in the GEMM rows count too); the best is kept.

luminal compiles and checks each kernel in a child process with a hard time limit, so a slow
compile or a crash fails that row and the run goes on; the saved plan is timed here.
torch.compile gets a compile cap and is reported "skipped (reason)" past it. GEMM graphs take
the row count as a symbolic dim (activations x weight, as in a model) and attention the
sequence length: the search times its candidates at a representative size of a symbolic dim,
at the full size of a static one (minutes for a naive 4096^3 kernel).

The last line is JSON: gemm_vs_best_blas (luminal GEMM throughput / the best BLAS at the
same size, best size), linear_vs_best_blas_min (the same ratio, worst linear row; a failed
row counts 0), membound_frac_bw_min (worst memory-bound kernel's fraction of the
measured bandwidth; a failed kernel counts 0), membound_frac_copy_min (the same against a
torch copy of the kernel's bytes timed in the kernel's turns: median copy / median luminal,
robust to load that drifts between the limits and the row), attention_vs_torch_sdpa (SDPA
time / luminal time, worst non-causal size; a failure counts 0), conv_vs_torch_min (torch
eager time / luminal time, worst conv row; a failure counts 0), block_compile_cold_s /
block_compile_warm_s (one Llama block, d 576, 9 heads: a fresh cache dir in a fresh process,
then the same dir in another fresh process), and a "kernels" entry per row. Ratios > 1 mean
luminal is faster.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

# Variables that change which OpenBLAS kernels load; this environment sets a slower core type.
BLAS_OVERRIDES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "LUMINAL_NUM_THREADS")
UNSET_NOTE = "LUMINAL_BENCH_UNSET"  # what the re-exec removed, for the report


def _threads_arg(argv: list[str]) -> str:
    for i, a in enumerate(argv):
        if a == "--threads" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--threads="):
            return a.split("=", 1)[1]
    return "2"


def clean_environment() -> None:
    """Re-execute this script without BLAS overrides and with the thread count pinned:
    both are read when the libraries load, so they must be right before any import."""
    threads = _threads_arg(sys.argv[1:])
    removed = [k for k in BLAS_OVERRIDES if k in os.environ]
    if not removed and all(os.environ.get(k) == threads for k in THREAD_VARS):
        return
    env = {k: v for k, v in os.environ.items() if k not in BLAS_OVERRIDES}
    env.update({k: threads for k in THREAD_VARS})
    if removed:
        env[UNSET_NOTE] = ",".join(removed)
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), *sys.argv[1:]], env)


if __name__ == "__main__":
    clean_environment()

import numpy as np  # noqa: E402 - only after the environment is clean (see above)

from turns import time_turns  # noqa: E402 - this folder: python puts a script's folder first

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if importlib.util.find_spec("luminal") is None:
    # not installed: the source tree (its runtime must have been built in place)
    sys.path.insert(0, os.path.join(ROOT, "python"))

MEMBOUND = ("softmax", "layer_norm", "rms_norm", "gelu_chain", "gemv")
KERNELS = (*MEMBOUND, "gemm", "linear", "conv", "attention", "attention_causal", "block_compile")
# conv rows, batch 1 (cin, cout, size, kernel, stride, padding): a ResNet's 7x7 stride-2 stem
# (patch rows of 7 taps), a 3x3 conv at 56x56 and a stride-2 3x3 at 28x28
CONVS = ((3, 64, 224, 7, 2, 3), (64, 64, 56, 3, 1, 1), (128, 256, 28, 3, 2, 1))
# linear rows: y = x @ W^T with W a weight (packed once, as in a model), rows x k x n: rows of
# a short (17), a prefill-sized (128) and a long (2048) batch of tokens by the products of
# SmolLM2 (576 -> 1536) and MiniLM (1536 -> 384)
LINEAR_ROWS = (17, 128, 2048)
LINEAR_KN = ((576, 1536), (1536, 384))
HEAD_DIM = 64


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- timing
def time_calls(fn: Callable[[], object], repeats: int, budget: float) -> tuple[float, int, float]:
    """(median seconds, calls, best seconds) of up to ``repeats`` calls, stopping once
    ``budget`` seconds are spent (at least one call). The caller has made the warm-up call."""
    times: list[float] = []
    end = time.perf_counter() + budget
    while len(times) < repeats:
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
        if time.perf_counter() > end:
            break
    return statistics.median(times), len(times), min(times)


# untimed calls per turn (bench/turns.py): 20 ms was too short after numpy, whose OpenBLAS
# threads still spun: gemm 512 medians (luminal / torch) 2.56 / 5.70 ms against 1.26 / 1.34
# with 120 ms, the same run's best times alike (2 threads, one sitting)
_SETTLE_S, _PER_TURN = 0.12, 3


class CapExceeded(Exception):
    pass


@contextmanager
def time_cap(seconds: float) -> Iterator[None]:
    """Raise CapExceeded in the main thread after ``seconds`` (at the next Python bytecode:
    a long C call finishes first)."""

    def on_alarm(signum: int, frame: Any) -> None:
        raise CapExceeded(f"over the {seconds:.0f} s cap")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def max_rel_err(out: np.ndarray, ref: np.ndarray) -> float:
    """Largest absolute error relative to the reference's largest magnitude."""
    if out.shape != ref.shape:
        raise ValueError(f"shape {out.shape} != reference {ref.shape}")
    if not np.all(np.isfinite(out)):
        return math.inf
    scale = max(float(np.max(np.abs(ref))), 1e-30)
    return float(np.max(np.abs(out.astype(np.float64) - ref))) / scale


# ----------------------------------------------------------------------------- cases
@dataclass
class Case:
    row: str  # unique id, e.g. gemm_1024
    kernel: str  # what --only selects
    size: str
    kind: str  # "mem": work is bytes moved; "flop": work is flops
    work: float
    shapes: dict[str, tuple[int, ...]]
    build: Callable[[], Any]  # -> luminal Graph with output "y"
    numpy_fn: Callable[..., np.ndarray]  # the reference, and the numpy contender
    torch_fn: Callable[..., Any]
    torch_compile_fn: Callable[..., Any] | None = None  # what torch.compile gets (default torch_fn)
    # torch inputs -> a call writing preallocated outputs (aten out= overloads), when torch has one
    torch_out: Callable[..., Callable[[], Any]] | None = None
    dims: dict[str, int] = field(default_factory=dict)
    tol: float = 2e-3
    note: str = ""
    weights: tuple[str, ...] = ()  # inputs that luminal's graph holds as weights (not passed)

    def inputs(self) -> dict[str, np.ndarray]:
        return seeded(self.row, self.shapes)

    def luminal_inputs(self) -> dict[str, np.ndarray]:
        return {k: v for k, v in self.inputs().items() if k not in self.weights}


def seeded(row: str, shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """A row's inputs: the same in every process (a weight built into a graph included)."""
    rng = np.random.default_rng(zlib.crc32(row.encode()))
    return {k: rng.standard_normal(s, dtype=np.float32) for k, s in shapes.items()}


def _np_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _np_gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))


def _np_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool) -> np.ndarray:
    s = (q @ k.transpose(0, 2, 1)) * np.float32(1.0 / math.sqrt(q.shape[-1]))
    if causal:
        n = s.shape[-1]
        s = np.where(np.tril(np.ones((n, n), bool)), s, np.float32(-np.inf))
    return _np_softmax(s) @ v


def _np_conv2d(x: np.ndarray, w: np.ndarray, stride: int, pad: int) -> np.ndarray:
    k = w.shape[-1]
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (k, k), axis=(2, 3))
    win = win[:, :, ::stride, ::stride]
    return np.tensordot(win, w, axes=((1, 4, 5), (1, 2, 3))).transpose(0, 3, 1, 2)


def _torch_attention_naive(q: Any, k: Any, v: Any, causal: bool) -> Any:
    import torch

    s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    return torch.softmax(s, -1) @ v


class _TorchF:
    """torch.nn.functional on first use: luminal's child processes never import torch."""

    def __getattr__(self, name: str) -> Any:
        import torch.nn.functional

        return getattr(torch.nn.functional, name)


TF = _TorchF()


def _torch_softmax_out(x: Any) -> Callable[[], Any]:
    import torch

    y = torch.empty_like(x)
    return lambda: torch.ops.aten._softmax.out(x, -1, False, out=y)


def _torch_layer_norm_out(x: Any, w: Any, b: Any) -> Callable[[], Any]:
    import torch

    y, m, r = torch.empty_like(x), x.new_empty(x.shape[0], 1), x.new_empty(x.shape[0], 1)
    n = [x.shape[-1]]
    return lambda: torch.ops.aten.native_layer_norm.out(x, n, w, b, 1e-5, out0=y, out1=m, out2=r)


def _torch_gelu_chain_out(x: Any, a: Any, b: Any, c: Any) -> Callable[[], Any]:
    import torch

    t, y = torch.empty_like(x), torch.empty_like(x)

    def call() -> Any:
        torch.mul(x, a, out=t).add_(b)
        torch._C._nn.gelu(t, approximate="tanh", out=y)
        return y.mul_(c)

    return call


def make_cases(quick: bool) -> list[Case]:
    rows, cols = (512, 1024) if quick else (4096, 4096)
    gemm_sizes = (128, 256) if quick else (512, 1024, 2048, 4096)
    gemv_n = 1024 if quick else 4096
    seqs = (256,) if quick else (1024, 2048, 4096)
    heads = 2 if quick else 4
    mat = f"{rows}x{cols}"
    n_el = rows * cols
    cases: list[Case] = []

    def lm_graph(name: str, fn: Callable[..., Any], shapes: dict[str, Any]) -> Callable[[], Any]:
        def build() -> Any:
            import luminal as lm

            g = lm.Graph(name)
            g.output("y", fn(**{k: g.input(k, s) for k, s in shapes.items()}))
            return g

        return build

    def F() -> Any:  # noqa: N802 - luminal.functional, imported where luminal runs
        import luminal.functional

        return luminal.functional

    vec = {"x": (rows, cols), "w": (cols,), "b": (cols,)}
    cases.append(Case(
        "softmax", "softmax", mat, "mem", 2 * 4 * n_el, {"x": (rows, cols)},
        lm_graph("softmax", lambda x: F().softmax(x, -1), {"x": (rows, cols)}),
        _np_softmax, lambda x: x.softmax(-1), torch_out=_torch_softmax_out,
    ))  # fmt: skip
    cases.append(Case(
        "layer_norm", "layer_norm", mat, "mem", 2 * 4 * n_el + 8 * cols, vec,
        lm_graph("layer_norm", lambda x, w, b: F().layer_norm(x, (cols,), w, b, 1e-5), vec),
        lambda x, w, b: (x - x.mean(-1, keepdims=True))
        / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * w + b,
        lambda x, w, b: TF.layer_norm(x, (cols,), w, b, 1e-5), torch_out=_torch_layer_norm_out,
    ))  # fmt: skip
    rv = {"x": (rows, cols), "w": (cols,)}
    cases.append(Case(
        "rms_norm", "rms_norm", mat, "mem", 2 * 4 * n_el + 4 * cols, rv,
        lm_graph("rms_norm", lambda x, w: F().rms_norm(x, (cols,), w, 1e-6), rv),
        lambda x, w: x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w,
        lambda x, w: TF.rms_norm(x, (cols,), w, 1e-6),
        note="torch eager allocates (no out= overload)",
    ))  # fmt: skip
    gv = {"x": (rows, cols), "a": (cols,), "b": (cols,), "c": (cols,)}
    cases.append(Case(
        "gelu_chain", "gelu_chain", mat, "mem", 2 * 4 * n_el + 12 * cols, gv,
        lm_graph("gelu_chain",
                 lambda x, a, b, c: F().gelu(x * a + b, approximate="tanh") * c, gv),
        lambda x, a, b, c: _np_gelu_tanh(x * a + b) * c,
        lambda x, a, b, c: TF.gelu(x * a + b, approximate="tanh") * c,
        torch_out=_torch_gelu_chain_out,
        note="gelu(x*a+b)*c, tanh GELU (numpy has no erf)",
    ))  # fmt: skip
    mv = {"x": (1, gemv_n), "w": (gemv_n, gemv_n)}
    cases.append(Case(
        "gemv", "gemv", f"{gemv_n}x{gemv_n}", "mem", 4 * (gemv_n * gemv_n + 2 * gemv_n), mv,
        lm_graph("gemv", lambda x, w: F().linear(x, w), mv),
        lambda x, w: x @ w.T, lambda x, w: TF.linear(x, w),
        note="y = x @ W^T, x (1, n)",
    ))  # fmt: skip
    for n in gemm_sizes:

        def build_gemm(n: int = n) -> Any:
            import luminal as lm

            g = lm.Graph(f"gemm_{n}")
            m = lm.dim("m", 1, n)  # rows symbolic: the search times candidates at m=256
            g.output("y", g.input("a", (m, n)) @ g.input("b", (n, n)))
            return g

        cases.append(Case(
            f"gemm_{n}", "gemm", f"{n}x{n}x{n}", "flop", 2.0 * n**3,
            {"a": (n, n), "b": (n, n)}, build_gemm,
            lambda a, b: a @ b, lambda a, b: a @ b, dims={"m": n},
        ))  # fmt: skip
    for rows_ in LINEAR_ROWS[:2] if quick else LINEAR_ROWS:
        for k_, n_ in LINEAR_KN[:1] if quick else LINEAR_KN:
            row = f"linear_{rows_}x{k_}x{n_}"
            shp = {"x": (rows_, k_), "w": (n_, k_)}

            def build_linear(row: str = row, shp: dict = shp, k_: int = k_) -> Any:
                import luminal as lm

                g = lm.Graph(row)
                m = lm.dim("m", 1, 4096)  # rows symbolic, as a model's tokens
                w = g.weight("w", data=seeded(row, shp)["w"])
                g.output("y", F().linear(g.input("x", (m, k_)), w))
                return g

            cases.append(Case(
                row, "linear", f"{rows_}x{k_}x{n_}", "flop", 2.0 * rows_ * k_ * n_, shp,
                build_linear, lambda x, w: x @ w.T, lambda x, w: TF.linear(x, w),
                dims={"m": rows_}, weights=("w",), note="y = x @ W^T, W a weight",
            ))  # fmt: skip
    for cin, cout, hw, k, st, pad in CONVS[:1] if quick else CONVS:
        row = f"conv_{k}x{k}s{st}_{cin}x{hw}"
        shp = {"x": (1, cin, hw, hw), "w": (cout, cin, k, k)}
        out_hw = (hw + 2 * pad - k) // st + 1

        def build_conv(row: str = row, shp: dict = shp, st: int = st, pad: int = pad) -> Any:
            import luminal as lm

            g = lm.Graph(row)
            w = g.weight("w", data=seeded(row, shp)["w"])
            g.output("y", F().conv2d(g.input("x", shp["x"]), w, stride=st, padding=pad))
            return g

        cases.append(Case(
            row, "conv", f"{cin}>{cout}@{hw} k{k}s{st}", "flop",
            2.0 * cout * out_hw * out_hw * cin * k * k, shp, build_conv,
            lambda x, w, st=st, pad=pad: _np_conv2d(x, w, st, pad),
            lambda x, w, st=st, pad=pad: TF.conv2d(x, w, stride=st, padding=pad),
            # torch eager maps its im2col temporary afresh per call until glibc's mmap threshold
            # grows past it (after a larger free, e.g. numpy's here): the stem 6-10 vs 2.3-2.9 ms
            weights=("w",), note="batch 1, W a weight; numpy = sliding windows + tensordot",
        ))  # fmt: skip
    for causal in (False, True):
        name = "attention_causal" if causal else "attention"
        for s in seqs:
            shp = {"q": (heads, s, HEAD_DIM), "k": (heads, s, HEAD_DIM), "v": (heads, s, HEAD_DIM)}

            def build_attn(name: str = f"{name}_{s}", s: int = s, causal: bool = causal) -> Any:
                import luminal as lm

                f = F()
                g = lm.Graph(name)
                seq = lm.dim("seq", 1, s)  # as in a model: one plan for every length
                q, k, v = (g.input(n, (heads, seq, HEAD_DIM)) for n in "qkv")
                if causal:  # luminal's sdpa is the same naive composition, plus the mask
                    g.output("y", f.scaled_dot_product_attention(q, k, v, is_causal=True))
                else:
                    scores = (q @ k.permute(0, 2, 1)) * (1.0 / math.sqrt(HEAD_DIM))
                    g.output("y", f.softmax(scores, -1) @ v)
                return g

            cases.append(Case(
                f"{name}_{s}", name, f"h{heads} s{s} d{HEAD_DIM}", "flop",
                # causal: the useful half (SDPA skips masked blocks; naive code does not)
                (2.0 if causal else 4.0) * heads * s * s * HEAD_DIM, shp, build_attn,
                lambda q, k, v, c=causal: _np_attention(q, k, v, c),
                lambda q, k, v, c=causal: TF.scaled_dot_product_attention(q, k, v, is_causal=c),
                lambda q, k, v, c=causal: _torch_attention_naive(q, k, v, c),
                dims={"seq": s}, note="torch eager = SDPA; torch.compile and numpy = naive",
            ))  # fmt: skip
    return cases


# ----------------------------------------------------------------------------- luminal (child)
def luminal_child(case: Case, a: argparse.Namespace) -> dict[str, Any]:
    """Compile one case in this (child) process, check it against numpy, save the plan."""
    import luminal as lm
    import luminal.runtime  # noqa: F401 - loads (an editable install: rebuilds) the extension

    t = time.perf_counter()
    cg = lm.compile(case.build())
    compile_s = time.perf_counter() - t
    log(f"compiled in {compile_s:.2f} s")
    res: dict[str, Any] = {"compile_s": compile_s, "kernels": cg.kernels}
    inputs = case.inputs()
    ref = case.numpy_fn(**{k: v.astype(np.float64) for k, v in inputs.items()})
    err = max_rel_err(cg.run(case.luminal_inputs(), **case.dims)["y"], ref)
    res["max_rel_err"] = err
    if not err <= case.tol:
        res["error"] = f"mismatch: max error {err:.3g} of max |ref| (tolerance {case.tol})"
    else:
        cg.save(a.plan_out)
    return res


def run_child(cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run a child of this script and parse the JSON of its last line; a hard time limit and
    a crash fail only what the child was doing."""
    for attempt in range(2):
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired as e:
            err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
            stage = "checking" if "compiled in" in err else "compiling"
            return {"error": f"killed after {timeout:.0f} s while {stage}"}
        # an editable install rebuilds the extension on import; a rebuild racing another one
        # can fail without saying anything about luminal: try once more
        if p.returncode == 0 or attempt or "compiled in" in p.stderr:
            break
        if not any(w in p.stderr for w in ("cmake", "ninja")):
            break
        log("  child failed while loading luminal (extension rebuild); retrying once")
    last = p.stdout.strip().splitlines()[-1:] if p.stdout.strip() else []
    if p.returncode != 0 or not last:
        tail = (p.stderr.strip().splitlines() or [""])[-1][:200]
        why = f"signal {-p.returncode}" if p.returncode < 0 else f"exit {p.returncode}"
        return {"error": f"child failed ({why}): {tail}"}
    return json.loads(last[0])


def compile_luminal(case: Case, a: argparse.Namespace, plan_path: str) -> dict[str, Any]:
    """``luminal_child`` in a child process: a slow compile (the search times candidates) or
    a crash fails this row only. On success the plan is at ``plan_path``."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", case.row,
           "--plan-out", plan_path, "--threads", str(a.threads)]  # fmt: skip
    if a.quick:
        cmd.append("--quick")
    return run_child(cmd, a.luminal_cap + 60)


# ----------------------------------------------------------------------------- block compile
def block_graph(vocab: int = 256) -> Any:
    """One Llama block (d 576, 9 heads, 3 kv heads, ffn 1536, SmolLM2-135M's shapes) with
    random weights; a tiny vocabulary keeps the embedding and head out of the measurement."""
    from luminal.models.base import DictWeights
    from luminal.models.llama import Llama, LlamaConfig

    d, ffn, nh, nkv, hd = 576, 1536, 9, 3, 64
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=d, intermediate_size=ffn, n_layers=1,
                      n_heads=nh, n_kv_heads=nkv, head_dim=hd, context_length=2048)  # fmt: skip
    rng = np.random.default_rng(0)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) / math.sqrt(shape[-1])).astype(
            np.float32
        )

    ws = {"token_embd.weight": w(vocab, d), "output_norm.weight": np.ones(d, np.float32)}
    for name, shape in {"attn_q": (nh * hd, d), "attn_k": (nkv * hd, d), "attn_v": (nkv * hd, d),
                        "attn_output": (d, nh * hd), "ffn_gate": (ffn, d), "ffn_up": (ffn, d),
                        "ffn_down": (d, ffn)}.items():  # fmt: skip
        ws[f"blk.0.{name}.weight"] = w(*shape)
    for name in ("attn_norm", "ffn_norm"):
        ws[f"blk.0.{name}.weight"] = np.ones(d, np.float32)
    model = Llama(cfg, DictWeights(ws))
    return model, model.build()


def block_child(phase: str) -> dict[str, Any]:
    import luminal as lm
    import luminal.runtime  # noqa: F401 - the extension's load is not part of compiling

    model, g = block_graph()
    t = time.perf_counter()
    cg = lm.compile(g)
    res: dict[str, Any] = {"compile_s": time.perf_counter() - t}
    if phase == "cold":
        t = time.perf_counter()
        lm.compile(block_graph()[1])
        res["second_compile_s"] = time.perf_counter() - t
        # the compiled block must agree with the reference interpreter
        feed = {"tokens": np.arange(8, dtype=np.int32) % model.config.vocab_size,
                **model.new_cache()}  # fmt: skip
        out = cg.run(feed, pos=0)["logits"]
        ref = g.run(feed, pos=0)["logits"]
        res["max_rel_err"] = max_rel_err(out, ref.astype(np.float64))
    return res


def run_block_compile(a: argparse.Namespace) -> dict[str, Any]:
    """Cold: a fresh cache dir in a fresh process. Warm: the same dir, another process."""
    tmp = tempfile.mkdtemp(prefix="luminal-bench-cache-")
    env = dict(os.environ, LUMINAL_CACHE_DIR=tmp)
    res: dict[str, Any] = {}
    try:
        for phase in ("cold", "warm"):
            cmd = [sys.executable, os.path.abspath(__file__), "--child", f"block_{phase}",
                   "--threads", str(a.threads)]  # fmt: skip
            r = run_child(cmd, a.luminal_cap + 60, env)
            if "error" in r:
                res[f"{phase}_error"] = r["error"]
                break
            res[f"{phase}_s"] = r["compile_s"]
            if phase == "cold":
                res["warm_same_process_s"] = r["second_compile_s"]
                res["max_rel_err"] = r["max_rel_err"]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return res


# ----------------------------------------------------------------------------- limits
def _bandwidth(quick: bool) -> dict[str, float]:
    """GB/s of streaming kernels over arrays far larger than the caches, best of 7 each."""
    import torch

    n = (64 if quick else 256) * 1024 * 1024 // 4
    x, y, z = np.ones(n, np.float32), np.empty(n, np.float32), np.ones(n, np.float32)
    tx, ty, tz = (torch.from_numpy(v) for v in (x, y, z))
    tests: dict[str, tuple[Callable[[], object], int]] = {
        "numpy copy": (lambda: np.copyto(y, x), 2),  # single-threaded
        "torch copy": (lambda: ty.copy_(tx), 2),
        # y = x + 3 z: two streams read, one written
        "torch triad": (lambda: torch.add(tx, tz, alpha=3.0, out=ty), 3),
    }
    bw: dict[str, float] = {}
    for name, (fn, streams) in tests.items():
        fn()
        best = min(time_calls(fn, 1, 0)[0] for _ in range(7))
        bw[name] = streams * x.nbytes / best / 1e9
    return bw


def _peak(quick: bool) -> tuple[int, dict[str, float]]:
    """GFLOP/s of sgemm at a large size: numpy's BLAS and torch.matmul, best of 3 each."""
    import torch

    m = 1024 if quick else 4096
    rng = np.random.default_rng(0)
    p = rng.standard_normal((m, m), dtype=np.float32)
    q = rng.standard_normal((m, m), dtype=np.float32)
    tp, tq = torch.from_numpy(p), torch.from_numpy(q)
    flops: dict[str, float] = {}
    for name, fn in (("numpy sgemm", lambda: p @ q), ("torch.matmul", lambda: tp @ tq)):
        fn()
        flops[name] = 2.0 * m**3 / min(time_calls(fn, 1, 0)[0] for _ in range(3)) / 1e9
    return m, flops


def measure_limits(a: argparse.Namespace) -> dict[str, dict[str, float]]:
    m, flops = _peak(a.quick)
    return {"bandwidth": _bandwidth(a.quick), "peak": {f"{k} {m}^3": v for k, v in flops.items()}}


def final_limits(samples: list[dict[str, dict[str, float]]],
                 rows: dict[str, dict[str, Any]]) -> dict[str, Any]:  # fmt: skip
    """Best of every measurement (start and end of the run; BLAS in the GEMM rows): other
    load on the machine can only make a limit look lower than it is."""
    bw: dict[str, float] = {}
    peak: dict[str, float] = {}
    for smp in samples:
        for k, v in smp["bandwidth"].items():
            bw[k] = max(bw.get(k, 0.0), v)
        for k, v in smp["peak"].items():
            peak[k] = max(peak.get(k, 0.0), v)
    for r in rows.values():
        for k, lib in (("numpy_s", "numpy sgemm"), ("torch_eager_s", "torch.matmul")):
            if r["kernel"] == "gemm" and r.get(k):
                peak[f"{lib} {r['size']}"] = r["work"] / r[k] / 1e9
    bw_src = max(bw, key=lambda k: bw[k])
    pk_src = max(peak, key=lambda k: peak[k])
    return {"bandwidth_gbs": bw[bw_src], "bandwidth_source": bw_src, "bandwidth_all": bw,
            "peak_gflops": peak[pk_src], "peak_source": pk_src, "peak_all": peak}  # fmt: skip


# ----------------------------------------------------------------------------- main process
def run_case(case: Case, a: argparse.Namespace, tmp: str) -> dict[str, Any]:
    import torch

    import luminal

    r: dict[str, Any] = {"kernel": case.kernel, "size": case.size, "kind": case.kind,
                         "work": case.work, "errors": {}}  # fmt: skip
    err = r["errors"]
    log(f"{case.row} {case.size}: luminal compile + check ...")
    plan_path = os.path.join(tmp, f"{case.row}.lmp")
    lum = compile_luminal(case, a, plan_path)
    r["luminal_compile_s"] = lum.get("compile_s")
    r["luminal_max_rel_err"] = lum.get("max_rel_err")
    inputs = case.inputs()
    tin = {k: torch.from_numpy(v) for k, v in inputs.items()}
    fns: dict[str, Callable[[], object]] = {}
    if "error" in lum:
        err["luminal"] = lum["error"]
    else:
        ex = luminal.load(plan_path)
        # outputs allocated once, as a caller running a plan repeatedly would: a fresh 64 MiB
        # output per call costs its page faults, as much time as the kernel itself
        shapes = ex.shapes(case.dims)
        outs = {k: np.empty(shapes[k], d) for k, d in ex.outputs.items()}
        lin = case.luminal_inputs()
        fns["luminal"] = lambda: ex.run(lin, case.dims, out=outs)
    fns["numpy"] = lambda: case.numpy_fn(**inputs)
    if case.kind == "mem":
        # the limit in the same turns: a copy of the row's minimum bytes (half read, half
        # written), so load that drifts during the run moves both sides alike
        src = torch.ones(case.work // 8)
        dst = torch.empty_like(src)
        fns["copy"] = lambda: dst.copy_(src)
    fns["torch_eager"] = case.torch_out(**tin) if case.torch_out else lambda: case.torch_fn(**tin)
    r["torch_eager_out"] = case.torch_out is not None
    with torch.inference_mode():
        if a.skip_torch_compile:
            err["torch_compile"] = "skipped (--skip-torch-compile)"
        else:
            log(f"{case.row}: torch.compile ...")
            torch._dynamo.reset()
            compiled = torch.compile(case.torch_compile_fn or case.torch_fn, dynamic=False)
            try:
                with time_cap(a.torch_compile_cap):
                    compiled(**tin)
                fns["torch_compile"] = lambda: compiled(**tin)
            except CapExceeded as e:
                err["torch_compile"] = f"skipped (compile {e})"
            except Exception as e:
                err["torch_compile"] = f"skipped ({type(e).__name__}: {e})"[:200]
        log(f"{case.row}: timing {', '.join(fns)} ...")
        warm: dict[str, Callable[[], object]] = {}
        for k, fn in fns.items():
            try:
                fn()  # warm-up
                warm[k] = fn
            except Exception as e:  # one contender failing must not hide the others
                err[k] = f"{type(e).__name__}: {e}"[:200]
        turns = time_turns(warm, a.repeats, err, _SETTLE_S, _PER_TURN, a.budget)
        for k, (med, _, best) in turns.items():
            r[f"{k}_s"], r[f"{k}_best_s"] = med, best
    return r


def finish_row(r: dict[str, Any], limits: dict[str, Any]) -> None:
    """Ratios and fractions of the machine's limits, once the limits are final."""
    others = {k: r[f"{k}_s"] for k in ("torch_eager", "torch_compile", "numpy") if r.get(f"{k}_s")}
    lum = r.get("luminal_s")
    if others:
        r["best_other"] = best = min(others, key=lambda k: others[k])
        if lum:
            r["vs_best"] = others[best] / lum
    if lum:
        # the limits are best times (of 7 bandwidth runs, of 3 sgemm runs): the fraction
        # compares luminal's best time with them, the same statistic on both sides
        rate = r["work"] / (r.get("luminal_best_s") or lum) / 1e9
        limit = limits["bandwidth_gbs"] if r["kind"] == "mem" else limits["peak_gflops"]
        r["luminal_rate"] = rate  # GB/s or GFLOP/s
        r["frac_limit"] = rate / limit
        if r.get("copy_s"):
            r["frac_copy"] = r["copy_s"] / lum  # medians of the same turns


def fmt_ms(v: float | None, err: str | None) -> str:
    if v:
        return f"{v * 1e3:.3f}" if v < 0.01 else f"{v * 1e3:.1f}"
    if err and err.startswith("skipped"):
        return "skip"
    return "ERR" if err else "-"


def print_table(rows: dict[str, dict[str, Any]], limits: dict[str, Any]) -> None:
    hdr = (f"{'kernel':<22}{'size':<16}{'luminal ms':>11}{'torch ms':>10}{'t.compile':>10}"
           f"{'numpy ms':>10}{'vs best':>10}  {'fraction of limit':<26}"
           f"{'compile s':>9}")  # fmt: skip
    print(hdr)
    print("-" * len(hdr))
    notes: list[str] = []
    for row, r in rows.items():
        e = r["errors"]
        frac = ""
        if r.get("frac_limit") is not None:
            unit = "GB/s" if r["kind"] == "mem" else "GFLOP/s"
            what = "bw" if r["kind"] == "mem" else "peak"
            frac = f"{r['frac_limit']:.3f} {what} ({r['luminal_rate']:.1f} {unit})"
            if r.get("frac_copy") is not None:
                frac += f" {r['frac_copy']:.2f} copy"
        vs = f"{r['vs_best']:.3f}x" if r.get("vs_best") else "-"
        cs = f"{r['luminal_compile_s']:.1f}" if r.get("luminal_compile_s") is not None else "-"
        print(f"{row:<22}{r['size']:<16}{fmt_ms(r.get('luminal_s'), e.get('luminal')):>11}"
              f"{fmt_ms(r.get('torch_eager_s'), e.get('torch_eager')):>10}"
              f"{fmt_ms(r.get('torch_compile_s'), e.get('torch_compile')):>10}"
              f"{fmt_ms(r.get('numpy_s'), e.get('numpy')):>10}{vs:>10}  {frac:<26}"
              f"{cs:>9}")  # fmt: skip
        notes += [f"  {row} {k}: {v}" for k, v in e.items()]
    if notes:
        print("errors / skips:")
        print("\n".join(notes))


def summarize(rows: dict[str, dict[str, Any]], limits: dict[str, Any],
              block: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    gemm: list[tuple[float, str]] = []
    linear: list[tuple[float, str]] = []
    for row, r in rows.items():
        blas = [r[k] for k in ("numpy_s", "torch_eager_s") if r.get(k)]
        if r["kernel"] in ("gemm", "linear") and blas:
            ratio = min(blas) / r["luminal_s"] if r.get("luminal_s") else 0.0  # failed: 0
            (gemm if r["kernel"] == "gemm" else linear).append((ratio, row))
    mem = [r.get("frac_limit") or 0.0 for r in rows.values() if r["kernel"] in MEMBOUND]
    mem_copy = [r.get("frac_copy") or 0.0 for r in rows.values() if r["kernel"] in MEMBOUND]
    attn = [
        (r["torch_eager_s"] / r["luminal_s"]) if r.get("luminal_s") else 0.0
        for r in rows.values()
        if r["kernel"] == "attention" and r.get("torch_eager_s")
    ]
    conv = [
        (r["torch_eager_s"] / r["luminal_s"]) if r.get("luminal_s") else 0.0
        for r in rows.values()
        if r["kernel"] == "conv" and r.get("torch_eager_s")
    ]
    best_gemm = max(gemm) if gemm else (None, None)
    return {
        "gemm_vs_best_blas": best_gemm[0],
        "gemm_best_size": best_gemm[1],
        "linear_vs_best_blas_min": min(linear)[0] if linear else None,
        "linear_worst_size": min(linear)[1] if linear else None,
        "membound_frac_bw_min": min(mem) if mem else None,
        "membound_frac_copy_min": min(mem_copy) if mem_copy else None,
        "attention_vs_torch_sdpa": min(attn) if attn else None,
        "conv_vs_torch_min": min(conv) if conv else None,
        "block_compile_cold_s": block.get("cold_s"),
        "block_compile_warm_s": block.get("warm_s"),
        "block_compile_warm_same_process_s": block.get("warm_same_process_s"),
        "block_max_rel_err": block.get("max_rel_err"),
        "block_errors": {k: v for k, v in block.items() if k.endswith("_error")} or None,
        "bandwidth_gbs": limits.get("bandwidth_gbs"),
        "bandwidth_source": limits.get("bandwidth_source"),
        "peak_gflops": limits.get("peak_gflops"),
        "peak_source": limits.get("peak_source"),
    }


def _rounded(v: Any) -> Any:
    if isinstance(v, float):
        return float(f"{v:.4g}") if math.isfinite(v) else None  # strict JSON has no inf/nan
    if isinstance(v, dict):
        return {k: _rounded(x) for k, x in v.items()}
    return v


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes, few repeats (smoke test)")
    p.add_argument("--only", action="append", choices=KERNELS, metavar="NAME",
                   help=f"run only these (repeatable): {', '.join(KERNELS)}")  # fmt: skip
    p.add_argument("--json-out", help="also write the summary JSON to this file")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, help="timed calls per contender (default 10; quick 3)")
    p.add_argument("--budget", type=float, help="seconds per timing loop (default 4; quick 1)")
    p.add_argument("--luminal-cap", type=float, default=300.0,
                   help="seconds a luminal compile may take before its row fails")  # fmt: skip
    p.add_argument("--torch-compile-cap", type=float, default=120.0)
    p.add_argument("--skip-torch-compile", action="store_true")
    p.add_argument("--child", help=argparse.SUPPRESS)  # internal: one luminal case
    p.add_argument("--plan-out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.repeats = a.repeats or (3 if a.quick else 10)
    a.budget = a.budget if a.budget is not None else (1.0 if a.quick else 4.0)
    return a


def main() -> None:
    a = parse_args()
    if a.child:
        if a.child.startswith("block_"):
            print(json.dumps(block_child(a.child.removeprefix("block_"))))
            return
        case = next(c for c in make_cases(a.quick) if c.row == a.child)
        print(json.dumps(luminal_child(case, a)))
        return
    import torch

    torch.set_num_threads(a.threads)
    unset = os.environ.get(UNSET_NOTE, "")
    only = set(a.only or KERNELS)
    t_start = time.perf_counter()
    load0 = os.getloadavg()[0]  # other work on the machine skews every number; say how much
    log("measuring memory bandwidth and peak FLOP/s ...")
    samples = [measure_limits(a)]
    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="luminal-bench-plans-") as tmp:
        for case in make_cases(a.quick):
            if case.kernel in only:
                t = time.perf_counter()
                rows[case.row] = run_case(case, a, tmp)
                rows[case.row]["row_s"] = time.perf_counter() - t  # where the run's time goes
    block: dict[str, Any] = {}
    if "block_compile" in only:
        log("block compile (cold, then warm) ...")
        block = run_block_compile(a)
    log("measuring memory bandwidth and peak FLOP/s again ...")
    samples.append(measure_limits(a))
    limits = final_limits(samples, rows)
    for r in rows.values():
        finish_row(r, limits)
    bw_all = ", ".join(f"{k} {v:.1f}" for k, v in limits["bandwidth_all"].items())
    print(f"\nluminal kernel benchmark: {a.threads} threads for every contender "
          f"(torch.set_num_threads, LUMINAL_NUM_THREADS, OMP/OPENBLAS/MKL_NUM_THREADS); "
          f"unset for every contender: {', '.join(BLAS_OVERRIDES)}"
          f" (were set: {unset or 'none'})")  # fmt: skip
    print(f"memory bandwidth {limits['bandwidth_gbs']:.1f} GB/s (best of: {bw_all}); "
          f"peak {limits['peak_gflops']:.0f} GFLOP/s ({limits['peak_source']}); limits measured "
          f"at the start and the end of the run, best kept")  # fmt: skip
    print(f"times: median of up to {a.repeats} calls after a warm-up, the contenders of a row "
          f"in turns of {_SETTLE_S * 1e3:.0f} ms untimed + {_PER_TURN} timed calls, the order "
          f"rotating, {a.budget:g} s cap per contender (untimed calls included); luminal "
          f"writes preallocated outputs (run(out=)), torch eager too where ATen has out= "
          f"(softmax, layer_norm, gelu_chain), the rest allocate per call; 'vs best' = best "
          f"other time / luminal time (> 1: luminal faster); "
          f"fraction of limit = work / luminal's best time / limit, both best times "
          f"(memory-bound: minimum bytes / bandwidth; attention: matmul flops / peak, causal: "
          f"half); 'copy' = a torch copy of the same bytes timed in the same turns / luminal, "
          f"medians\n")  # fmt: skip
    print_table(rows, limits)
    if block:
        print(f"\nLlama block (d 576, 9 heads, 3 kv heads, ffn 1536) compile: "
              f"cold {block.get('cold_s', float('nan')):.2f} s (goal < 30), "
              f"warm {block.get('warm_s', float('nan')):.2f} s (goal < 1; same process "
              f"{block.get('warm_same_process_s', float('nan')):.2f} s); compiled vs "
              f"interpreter max error {block.get('max_rel_err', float('nan')):.2g}"
              f"{' (MISMATCH)' if block.get('max_rel_err', 0) > 1e-3 else ''}")  # fmt: skip
        for k, v in block.items():
            if k.endswith("_error"):
                print(f"  block {k}: {v}")
    s = summarize(rows, limits, block)
    s["threads"] = a.threads
    s["blas_env_unset"] = list(BLAS_OVERRIDES)
    s["blas_env_was_set"] = unset.split(",") if unset else []
    s["quick"] = a.quick
    s["total_s"] = time.perf_counter() - t_start
    s["loadavg_1min_start_end"] = [load0, os.getloadavg()[0]]
    s["kernels"] = rows
    goals = [
        ("memory-bound >= 0.85 of bandwidth", s["membound_frac_bw_min"], 0.85),
        ("memory-bound >= 0.85 of a same-turn copy", s["membound_frac_copy_min"], 0.85),
        ("GEMM >= 0.90 of best BLAS", s["gemm_vs_best_blas"], 0.9),
        ("every linear row >= the best BLAS", s["linear_vs_best_blas_min"], 1.0),
        ("attention faster than torch SDPA", s["attention_vs_torch_sdpa"], 1.0),
    ]
    print("\ngoals: " + "; ".join(
        f"{n}: {v:.3f} ({'met' if v >= t else 'not met'})" if v is not None else f"{n}: n/a"
        for n, v, t in goals))  # fmt: skip
    line = json.dumps(_rounded(s))
    if a.json_out:
        with open(a.json_out, "w") as fh:
            fh.write(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
