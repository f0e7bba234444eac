"""Every environment variable luminal reads, in one registry (README lists this table)."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Flag:
    name: str
    default: str
    doc: str

    def get(self) -> str:
        return os.environ.get(self.name, self.default)

    def as_int(self) -> int:
        v = self.get()
        try:
            return int(v)
        except ValueError:
            raise ValueError(f"{self.name} must be an integer, got {v!r}") from None

    def choice(self, allowed: tuple[str, ...], hint: str) -> str:
        """The value, stripped and lowercased, checked to be one of ``allowed`` (``hint``
        says what to use instead)."""
        v = self.get().strip().lower()
        if v not in allowed:
            raise ValueError(f"{self.name}={self.get()!r} is not allowed: {hint}")
        return v

    def as_float(self) -> float:
        v = self.get()
        try:
            return float(v)
        except ValueError:
            raise ValueError(f"{self.name} must be a number, got {v!r}") from None


DEBUG = Flag(
    "LUMINAL_DEBUG", "0",
    "1 compile summary, 2 per-step run times (table at exit), 3 search decisions (measured "
    "alternatives), 4 generated kernels, 5 the plan",
)  # fmt: skip
CACHE_DIR = Flag("LUMINAL_CACHE_DIR", "", "kernel/search cache folder (default ~/.cache/luminal)")
PLAN_CACHE = Flag(
    "LUMINAL_PLAN_CACHE", "1",
    "0 turns the plan cache off: every entry point compiles (docs/plan-cache.md)",
)  # fmt: skip
PLAN_CACHE_DIR = Flag(
    "LUMINAL_PLAN_CACHE_DIR", "", "plan cache folder (default $LUMINAL_CACHE_DIR/plans)"
)
PLAN_CACHE_MB = Flag(
    "LUMINAL_PLAN_CACHE_MB", "4096",
    "plan cache size limit in MiB; least recently used plans are evicted past it",
)  # fmt: skip
KERNEL_CACHE_MB = Flag(
    "LUMINAL_KERNEL_CACHE_MB", "2048",
    "compiled-kernel cache size limit in MiB; kernels unused longest are removed past it "
    "(compiled again when a plan needs them)",
)  # fmt: skip
NUM_THREADS = Flag("LUMINAL_NUM_THREADS", "", "CPU worker threads (default: all cores)")
CC = Flag("CC", "cc", "C compiler for CPU kernels")
CUDA_ARCH = Flag(
    "LUMINAL_CUDA_ARCH", "", "GPU arch CUDA plans are built for (default: the GPU's, else sm_90a)"
)
EGRAPH = Flag(
    "LUMINAL_EGRAPH", "1",
    "0 skips the e-graph rewrites before lowering (compiler/search/rules, docs/rules.md)",
)  # fmt: skip

STAGE = Flag(
    "LUMINAL_STAGE", "1",
    "0 skips copying div/mod-strided operands of sums contiguously first (compiler/stage.py)",
)  # fmt: skip

FOLD_SCALES = Flag(
    "LUMINAL_FOLD_SCALES", "1",
    "0 skips storing quantized block scales once as f32 and repacking strided weight reads "
    "(compiler/fold.py)",
)  # fmt: skip

SIBLINGS = Flag(
    "LUMINAL_SIBLINGS", "1",
    "0 skips merging products of one operand by several weights into one (compiler/siblings.py)",
)  # fmt: skip

COLLAPSE = Flag(
    "LUMINAL_COLLAPSE", "1",
    "0 keeps adjacent symbolic dims a kernel reads as one index (batch x seq rows) as two loops "
    "(compiler/collapse.py)",
)  # fmt: skip

CUBLASLT = Flag(
    "LUMINAL_CUBLASLT", "",
    "libcublasLt to load for gemm calls on CUDA (default: what cuda-pathfinder finds, else "
    "libcublasLt.so.13); read by the C++ runtime",
)  # fmt: skip

# bounds of the measured search (compiler/search/tuner.py, docs/compiler.md)
SEARCH_BUDGET = Flag(
    "LUMINAL_SEARCH_BUDGET_S", "60",
    "seconds of measuring per compile; past it, kernels keep their default (unmeasured) form",
)  # fmt: skip
# 3: each candidate of a product by a quantized weight costs 1-1.6 s of compile (SmolLM2's
# panel blocks), a fourth about a quarter of a cold search; over 105 of SmolLM2's schedule
# decisions (2 threads, a loaded machine) the best of four was within 5% of the best of the
# first three in 77, 5-20% faster in 24 (about the spread of repeated measurements there),
# up to 1.6x in 4 (kernels of 16-600 us)
SEARCH_CANDIDATES = Flag(
    "LUMINAL_SEARCH_CANDIDATES", "3",
    "alternatives measured per kernel (the best by the cost model; the default always)",
)  # fmt: skip
SEARCH_MEASURE_MS = Flag(
    "LUMINAL_SEARCH_MEASURE_MS", "100",
    "a candidate whose first run takes longer is not run again (that run is its time)",
)  # fmt: skip
SEARCH_CONFIRM = Flag(
    "LUMINAL_SEARCH_CONFIRM", "2",
    "rounds in which a kernel's candidates close to the fastest are measured again, in turns, "
    "before one is kept (0: each is measured once)",
)  # fmt: skip
SEARCH_SEED = Flag("LUMINAL_SEARCH_SEED", "0", "seed of the search's random inputs")
SEARCH_LIBRARY = Flag(
    "LUMINAL_SEARCH_LIBRARY", "1",
    "0 keeps every generated kernel (no measured library-call alternatives such as GEMM)",
)  # fmt: skip
SEARCH_EPILOGUES = Flag(
    "LUMINAL_SEARCH_EPILOGUES", "1",
    "0 offers no library call that computes its product's epilogue itself (pgemm storing a "
    "bias and an activation), only the call followed by the epilogue kernel",
)  # fmt: skip
SEARCH_MIN_US = Flag(
    "LUMINAL_SEARCH_MIN_US", "20",
    "kernels the cost model puts below this many microseconds keep their default schedule "
    "(measuring them costs more compile time than they can save)",
)  # fmt: skip
SEARCH_SCHEDULES = Flag(
    "LUMINAL_SEARCH_SCHEDULES", "1",
    "0 keeps every kernel's default schedule (no measured split / chunk alternatives)",
)  # fmt: skip
SEARCH_FUSION = Flag(
    "LUMINAL_SEARCH_FUSION", "1",
    "0 skips the measured storage choices: values read through overlapping windows stay "
    "inlined, a conv's patches stay in row order, values keep their axis order",
)  # fmt: skip
ACT_QUANT = Flag(
    "LUMINAL_ACT_QUANT", "",
    "q8 quantizes the activation operand of products by 32-block quantized weights to int8 per "
    "block of 32, as llama.cpp does (opt-in numerics, docs/quantization.md); empty: f32",
)  # fmt: skip
MATMUL_PRECISION = Flag(
    "LUMINAL_MATMUL_PRECISION", "",
    "bf16 rounds both operands of products by f32 or bf16 weights to bf16 and sums in f32 "
    "(AVX-512 BF16 dot products; opt-in numerics, docs/quantization.md); empty or f32: f32",
)  # fmt: skip
PROGRESS = Flag(
    "LUMINAL_PROGRESS", "",
    "1 always shows the live progress line of long compiles on stderr, 0 never (default: "
    "when stderr is a terminal and LUMINAL_DEBUG is off)",
)  # fmt: skip

ALL = (DEBUG, CACHE_DIR, PLAN_CACHE, PLAN_CACHE_DIR, PLAN_CACHE_MB, KERNEL_CACHE_MB,
       NUM_THREADS, CC, CUDA_ARCH, FOLD_SCALES, SIBLINGS, EGRAPH, STAGE, COLLAPSE,
       CUBLASLT, SEARCH_BUDGET,
       SEARCH_CANDIDATES, SEARCH_MEASURE_MS, SEARCH_CONFIRM, SEARCH_SEED, SEARCH_LIBRARY,
       SEARCH_EPILOGUES, SEARCH_MIN_US,
       SEARCH_SCHEDULES, SEARCH_FUSION, ACT_QUANT, MATMUL_PRECISION, PROGRESS)  # fmt: skip


def debug() -> int:
    return DEBUG.as_int()


def cache_base() -> str:
    """The folder luminal caches under: ``LUMINAL_CACHE_DIR``, else ``~/.cache/luminal``."""
    return CACHE_DIR.get() or os.path.join(os.path.expanduser("~"), ".cache", "luminal")


def table() -> str:
    """The README's environment-variable table."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    rows += [f"| `{f.name}` | {f.default or '—'} | {f.doc} |" for f in ALL]
    return "\n".join(rows)
