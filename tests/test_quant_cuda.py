"""The low-precision formats on the CUDA target without a GPU: each format's dequantizing GEMV
(x @ W.T with W a graph expression over packed bytes) lowers to kernels that NVRTC compiles to
sm_90a cubins, and ``luminal.compile(..., backend="cuda")`` gives a plan of cubins.

Needs ``nvidia-cuda-nvrtc==13.0.*`` and ``cuda-pathfinder`` (the ``cuda`` extra); skipped with
the reason otherwise."""

from __future__ import annotations

import numpy as np
import pytest

import luminal as lm
from luminal.codegen import cuda
from luminal.codegen.cuda import nvrtc
from luminal.compiler.lower import lower
from luminal.loaders import lowp, quants

NVRTC_MISSING = nvrtc.available()
pytestmark = pytest.mark.skipif(NVRTC_MISSING is not None, reason=str(NVRTC_MISSING))
RNG = np.random.default_rng(5)
GGUF_NEW = ["Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q5_K", "IQ4_NL", "IQ4_XS", "MXFP4", "NVFP4"]


def _gemv(fmt: str) -> lm.Graph:
    """y = x @ W.T for a 1..16-row x and a (96, 256) weight stored as ``fmt``."""
    rows, cols = 96, 256
    g = lm.Graph(f"gemv_{fmt}")
    x = g.input("x", (lm.dim("n", 1, 16), cols))
    if fmt in lowp.FORMATS:
        parts = lowp.FORMATS[fmt].quantize(RNG.normal(size=(rows, cols)).astype(np.float32))
        w = lowp.weight(g, "w", fmt, parts, (rows, cols))
    else:
        f = quants.FORMATS[fmt]
        raw = RNG.integers(0, 256, (rows * cols // f.block, f.type_size), dtype=np.uint8)
        w = quants.quantized_weight(g, "w", fmt, raw, (rows, cols))
    g.output("y", x @ w.T)
    return g


@pytest.mark.parametrize("fmt", [*lowp.FORMATS, *GGUF_NEW])
def test_dequantizing_gemv_compiles_to_sm90a_cubins(fmt: str) -> None:
    low = lower(_gemv(fmt))
    compiled = cuda.compile_kernels(low.kernels, sorted(low.dims), "sm_90a")
    assert compiled
    for ck, cubin in compiled:
        assert cubin[:4] == b"\x7fELF", f"{ck.name}: not an ELF cubin"


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8_e4m3", "MXFP4"])
def test_cuda_plan_of_a_quantized_gemv(fmt: str) -> None:
    cg = lm.compile(_gemv(fmt), backend="cuda")
    assert cg.plan.backend == "cuda"
    assert cg.plan.kernels and all(k.format.name == "cubin" for k in cg.plan.kernels)
