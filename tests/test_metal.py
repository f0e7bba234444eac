"""The Metal target on a machine without Metal: plans of MSL kernels, a clear error when one
is run, the type check (and that it fails on broken MSL), the gemm kernel's variants and the
Metal cost model's choices."""

from __future__ import annotations

import platform

import numpy as np
import pytest

import luminal as lm
from luminal.codegen.metal import check
from luminal.codegen.metal.gemm import render_gemm
from luminal.codegen.metal.kernel import PRELUDE
from luminal.codegen.metal.schedule import TILES, choose_tile, estimate_gemm
from luminal.compiler import kernel_ir as K
from luminal.graph import dtypes as dt
from luminal.plan import KernelFormat

needs_clang = pytest.mark.skipif(check.clang() is None, reason=f"{check.CLANG} not installed")
not_mac = pytest.mark.skipif(platform.system() == "Darwin", reason="Metal may run here")


def _graph() -> lm.Graph:
    g = lm.Graph("metal_mix")
    x = g.input("x", (lm.dim("s", 1, 64), 37), lm.f32)
    w = g.input("w", (37, 50), lm.f32)
    y = (x @ w).softmax(-1) + x.sum(-1, keepdim=True)
    g.output("y", y)
    g.output("i", (x > 0).cast(lm.i64).sum(-1))
    return g


def test_target_registered() -> None:
    assert "metal" in lm.targets.names()
    assert lm.targets.get("metal").cache_id().startswith("metal-")
    with pytest.raises(ValueError, match="gemm_impl"):
        lm.targets.get("metal", gemm_impl="cublas")


def test_plan_holds_msl_kernels() -> None:
    cg = lm.compile(_graph(), backend="metal", cache=False)
    assert cg.plan.backend == "metal" and cg.plan.kernels
    assert all(k.format == KernelFormat.msl for k in cg.plan.kernels)
    src = "\n".join(bytes(k.code).decode() for k in cg.plan.kernels)
    assert "simdgroup_multiply_accumulate" in src  # the gemm
    assert "simd_sum(" in src and "threadgroup_barrier" in src  # the softmax row reductions
    assert "[[buffer(0)]]" in src and "constant int64_t *lm_dims" in src
    # the runtime compiles a plan's kernels as one library: their names must differ
    assert len({k.name for k in cg.plan.kernels}) == len(cg.plan.kernels)


@not_mac
def test_metal_status_and_run_error() -> None:
    assert lm.metal_status().startswith("Metal unavailable: not macOS")
    cg = lm.compile(_graph(), backend="metal", cache=False)
    x = np.zeros((3, 37), np.float32)
    with pytest.raises(RuntimeError, match="Metal"):
        cg.run({"x": x, "w": np.zeros((37, 50), np.float32)})


def test_f64_refused_by_name() -> None:
    g = lm.Graph("f64")
    g.output("y", g.input("x", (5,), lm.f64).exp())
    with pytest.raises(ValueError, match=r"cannot run on Metal: Metal has no 64-bit floats"):
        lm.compile(g, backend="metal", cache=False)


def _gemm(m, n, k, a=dt.f32, c=dt.f32, **fields) -> tuple[K.LibCall, dict[int, dt.DType]]:
    lc = K.LibCall("g0", "gemm", {"m": m, "n": n, "k": k, **fields}, [1, 2, 0], 0)
    return lc, {1: a, 2: a, 0: c}


@needs_clang
def test_gemm_variants_typecheck() -> None:
    s = lm.dim("s", 1, 4096)
    kernels = []
    for a, c in [(dt.f32, dt.f32), (dt.f16, dt.f16), (dt.f16, dt.f32), (dt.bf16, dt.bf16)]:
        for ta, tb in [(0, 0), (1, 0), (0, 1), (1, 1)]:
            lc, dtypes = _gemm(s, 50, 37, a, c, trans_a=ta, trans_b=tb, alpha=0.5, beta=1.0)
            for tile in TILES:
                g = render_gemm(lc, dtypes, ["s"], tile)
                kernels.append((f"{a.name}_{ta}{tb}_{tile.bm}x{tile.bn}", g.source))
    n, failures = check.typecheck(kernels)
    assert n == len(kernels) and not failures, failures[:5]


def test_gemm_refuses_int_operands() -> None:
    lc, dtypes = _gemm(4, 4, 4, dt.i32, dt.i32)
    with pytest.raises(ValueError, match="simdgroup-matrix"):
        render_gemm(lc, dtypes, [])


def test_cost_model_tiles() -> None:
    # one-row products (decode) take a short tile; a big square product a 64 x 64 one
    assert choose_tile({"m": 1, "n": 4096, "k": 4096}, 2).bm <= 16
    assert choose_tile({"m": 2048, "n": 2048, "k": 2048}, 4).bm == 64
    # more tiles than the GPU holds at once cost waves
    small = estimate_gemm({"m": 64, "n": 64, "k": 64}, TILES[0], 4)
    big = estimate_gemm({"m": 4096, "n": 4096, "k": 64}, TILES[0], 4)
    assert big > 100 * small


# deliberately broken kernels: each must fail the check, naming the kernel
_GOOD = PRELUDE + (
    "kernel void good(device float *b0 [[buffer(0)]], device const float *b1 [[buffer(1)]], "
    "uint3 lm_tid [[thread_position_in_threadgroup]]) {\n"
    "  threadgroup float sh[32];\n  sh[lm_tid.x] = b1[lm_tid.x];\n"
    "  threadgroup_barrier(mem_flags::mem_threadgroup);\n  b0[lm_tid.x] = simd_sum(sh[0]);\n}\n"
)
_BROKEN = {
    "address space": ("  sh[lm_tid.x] =", "  device float *p = sh; sh[lm_tid.x] ="),
    "kernel argument without address space": ("device const float *b1", "const float *b1"),
    "undeclared function": ("simd_sum(sh[0])", "simd_summ(sh[0])"),
    "misspelled attribute": ("thread_position_in_threadgroup", "thread_position_in_thredgroup"),
    "buffer indices": ("[[buffer(1)]]", "[[buffer(2)]]"),
    "double": ("b0[lm_tid.x] = ", "double q = 1.0; b0[lm_tid.x] = q + "),
    "syntax": ("sh[lm_tid.x] = b1[lm_tid.x];", "sh[lm_tid.x] = b1[lm_tid.x]"),
}  # fmt: skip


@needs_clang
@pytest.mark.parametrize("what", sorted(_BROKEN))
def test_broken_msl_fails(what: str) -> None:
    old, new = _BROKEN[what]
    assert old in _GOOD
    bad = _GOOD.replace(old, new).replace("void good(", "void bad(")
    # batched with good kernels: the failure is blamed on the broken one only
    n, failures = check.typecheck([("good", _GOOD), ("bad", bad), ("good2", _GOOD + " ")])
    assert n == 3 and failures
    assert {f.kernel for f in failures} == {"bad"}, failures


@needs_clang
def test_good_msl_passes() -> None:
    assert check.typecheck([("good", _GOOD)]) == (1, [])


def test_gemm_as_mps_library_call() -> None:
    from luminal.compile import build_plan
    from luminal.compiler.lower import lower
    from luminal.compiler.search.select import choose_library_calls
    from luminal.compiler.search.tuner import Tuner
    from luminal.plan import LibCall
    from luminal.targets.metal import MetalTarget

    g = lm.Graph("mm_mps")
    a, w = g.input("a", (300, 256)), g.input("w", (256, 320))
    g.output("y", (a @ w).relu())
    t = MetalTarget()
    low = choose_library_calls(lower(g), Tuner(t.measure, t.cache_id(), cost=t.cost))
    assert any(isinstance(k, K.LibCall) for k in low.kernels)
    mps = build_plan(low, "mm_mps", "metal", gemm_impl="mps")
    assert [s.func for s in mps.steps if isinstance(s, LibCall)] == ["gemm"]
    gen = build_plan(low, "mm_mps", "metal")  # by default the simdgroup kernel
    assert not any(isinstance(s, LibCall) for s in gen.steps)
    assert len(gen.kernels) == len(mps.kernels) + 1
