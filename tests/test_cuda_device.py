"""The CUDA backend on a GPU (skipped without one; bench/gpu_check.sh runs it): the generated
tensor-core gemm and the cuBLASLt gemm against numpy at odd sizes, batched and transposed, in
f32/f16/bf16; CUDA graph replay across runs and re-capture when dims change."""

from __future__ import annotations

import numpy as np
import pytest

import luminal as lm
import luminal.cuda as lcuda
import luminal.functional as F
from luminal.compile import CompiledGraph, build_plan
from luminal.compiler import kernel_ir as K
from luminal.compiler.lower import BufferInfo, Lowered, lower
from luminal.graph import dtypes as dt
from luminal.graph import symbolic as sym
from luminal.runtime import numpy_dtype

pytestmark = pytest.mark.skipif(
    not lcuda.available(), reason=f"no CUDA device: {lcuda.unavailable_reason()}"
)
IMPLS = ["kernel", "cublaslt"]


def _impl_ok(impl: str) -> None:
    if impl == "cublaslt":
        import luminal._rt as rt

        path = lcuda.cublaslt_path()
        if path:
            rt.cuda_set_cublaslt_path(path)
        try:
            rt.cuda_cublaslt_version()
        except RuntimeError as e:
            pytest.skip(str(e))


def _gemm_plan(fields: dict, op: dt.DType, out: dt.DType, shapes: list, impl: str,
               dims: dict | None = None) -> CompiledGraph:  # fmt: skip
    bufs = [BufferInfo(0, "a", op, shapes[0], "input"), BufferInfo(1, "b", op, shapes[1], "input"),
            BufferInfo(2, "c", out, shapes[2], "output")]  # fmt: skip
    low = Lowered(bufs, [K.LibCall("g_gemm", "gemm", fields, [0, 1, 2], 2)], dims or {}, {})  # type: ignore[list-item]
    plan = build_plan(low, "gemm", "cuda", gemm_impl=impl)
    return CompiledGraph(plan, "cuda")


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("op", [dt.f32, dt.f16, dt.bf16], ids=lambda d: d.name)
@pytest.mark.parametrize("ta,tb", [(0, 0), (1, 1), (0, 1)])
def test_gemm_odd_batched(impl: str, op: dt.DType, ta: int, tb: int) -> None:
    _impl_ok(impl)
    bt, m, n, k = 3, 77, 130, 61
    rng = np.random.default_rng(0)
    npd = numpy_dtype(op.name)
    a = rng.standard_normal((bt, k, m) if ta else (bt, m, k)).astype(np.float32).astype(npd)
    b = rng.standard_normal((bt, n, k) if tb else (bt, k, n)).astype(np.float32).astype(npd)
    fields = {"m": m, "n": n, "k": k, "trans_a": ta, "trans_b": tb, "batch": bt,
              "stride_a": m * k, "stride_b": k * n, "stride_c": m * n}  # fmt: skip
    cg = _gemm_plan(fields, op, dt.f32, [a.shape, b.shape, (bt, m, n)], impl)
    got = cg.run({"a": a, "b": b})["c"]
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want = (a64.transpose(0, 2, 1) if ta else a64) @ (b64.transpose(0, 2, 1) if tb else b64)
    # f32: three-pass TF32 (kernel) / full f32 (cuBLASLt); 16-bit: exact products, f32 sums
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.sqrt(k))


@pytest.mark.parametrize("impl", IMPLS)
def test_symbolic_m_and_graph_recapture(impl: str) -> None:
    _impl_ok(impl)
    seq = sym.dim("seq", 1, 300)
    fields = {"m": seq, "n": 96, "k": 200}
    cg = _gemm_plan(fields, dt.f32, dt.f32, [(seq, 200), (200, 96), (seq, 96)], impl,
                    {"seq": seq})  # fmt: skip
    rng = np.random.default_rng(1)
    b = rng.standard_normal((200, 96)).astype(np.float32)
    for s in (1, 5, 5, 257, 5):  # repeated dims replay the graph, new dims re-capture
        a = rng.standard_normal((s, 200)).astype(np.float32)
        got = cg.run({"a": a, "b": b}, seq=s)["c"]
        np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-4, atol=2e-3)


def test_compiled_matmul_epilogue_matches_cpu() -> None:
    g = lm.Graph("mm_epi")
    seq = lm.dim("seq", 1, 512)
    a, w, bias = g.input("a", (seq, 192)), g.input("w", (192, 320)), g.input("bias", (320,))
    g.output("y", (F.matmul(a, w) + bias).relu())
    rng = np.random.default_rng(2)
    ins = {"a": rng.standard_normal((37, 192)).astype(np.float32),
           "w": rng.standard_normal((192, 320)).astype(np.float32),
           "bias": rng.standard_normal(320).astype(np.float32)}  # fmt: skip
    want = g.run(ins, seq=37)["y"]
    cg = lm.compile(g, backend="cuda")
    for _ in range(3):
        np.testing.assert_allclose(cg.run(ins, seq=37)["y"], want, rtol=1e-4, atol=1e-3)
    assert len(lower(g).kernels) >= 1
