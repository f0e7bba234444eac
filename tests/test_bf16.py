"""bf16 products (LUMINAL_MATMUL_PRECISION=bf16): the graph pass against a numpy reference
(operands rounded to nearest even, exact products summed in f64), which products it takes,
the gemm matcher's half-type operands and copies, the compiled plans against the
interpreter with the search forced to each library form, and the flag's errors."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import luminal as lm
import luminal.functional as F
from kernel_cache import use_kernel_cache
from luminal.codegen.cpu.jam import vector_registers
from luminal.compile import build_plan
from luminal.compiler import kernel_ir as K
from luminal.compiler import pipeline
from luminal.compiler.bf16 import round_products
from luminal.compiler.lower import lower
from luminal.compiler.search import select
from luminal.compiler.search.gemm import match_any, match_gemm
from luminal.compiler.search.tuner import Tuner
from luminal.graph import dtypes as dt
from luminal.graph.interp import run as interpret
from luminal.graph.ops import Leaf, Op
from luminal.targets.cpu import CpuTarget

RNG = np.random.default_rng(16)
SEQ = lm.dim("seq", 1, 64)


def bf16(x: np.ndarray) -> np.ndarray:
    return x.astype(ml_dtypes.bfloat16).astype(np.float64)


def _linear(n: int = 29, k: int = 37, wdtype: str = "f32", data: bool = True) -> lm.Graph:
    g = lm.Graph("lin")
    x = g.input("x", (SEQ, k))
    wv = RNG.standard_normal((n, k)).astype(np.float32)
    if wdtype == "bf16":
        w = g.weight("w", data=wv.astype(ml_dtypes.bfloat16)).cast(dt.f32)
    else:
        w = g.weight("w", data=wv) if data else g.weight("w", (n, k))
    g.output("y", F.gelu(F.linear(x, w, g.weight("b", data=RNG.standard_normal(n)))))
    return g


def _reference(g: lm.Graph, xv: np.ndarray) -> np.ndarray:
    w = np.asarray(g.weights["w"]).astype(np.float32)
    b = np.asarray(g.weights["b"], np.float64)
    z = bf16(xv) @ bf16(w).T + b
    return 0.5 * z * (1 + np.vectorize(__import__("math").erf)(z / np.sqrt(2)))


@pytest.mark.parametrize("wdtype", ["f32", "bf16"])
def test_products_by_weights_take_bf16_operands(wdtype, monkeypatch) -> None:
    monkeypatch.setenv("LUMINAL_MATMUL_PRECISION", "bf16")
    g = _linear(wdtype=wdtype)
    g2 = round_products(g)
    assert g2 is not g
    xv = RNG.standard_normal((5, 37)).astype(np.float32) * 3
    got = interpret(g2, {"x": xv})["y"]
    np.testing.assert_allclose(got, _reference(g, xv), rtol=1e-5, atol=1e-5)
    assert np.abs(got - interpret(g, {"x": xv})["y"]).max() > 1e-4  # it did round
    # an f32 weight is stored rounded, once: nothing reads the f32 copy any more
    bf = [n for n in g2.inputs.values() if n.arg[1] and n.dtype is dt.bf16]
    assert len(bf) == 1
    if wdtype == "f32":
        np.testing.assert_array_equal(
            np.asarray(g2.weights[bf[0].arg[0]]), g.weights["w"].astype(ml_dtypes.bfloat16)
        )


def test_weight_without_data_is_rounded_in_the_graph(monkeypatch) -> None:
    monkeypatch.setenv("LUMINAL_MATMUL_PRECISION", "bf16")
    g = _linear(data=False)
    g2 = round_products(g)
    assert not [n for n in g2.inputs.values() if n.dtype is dt.bf16]
    wv = RNG.standard_normal((29, 37)).astype(np.float32)
    xv = RNG.standard_normal((4, 37)).astype(np.float32)
    g.weights["w"] = wv
    got = interpret(g2, {"x": xv, "w": wv})["y"]
    np.testing.assert_allclose(got, _reference(g, xv), rtol=1e-5, atol=1e-5)


def test_products_of_activations_and_bias_adds_keep_f32(monkeypatch) -> None:
    """Attention's scores (q @ k^T) have no weight operand: untouched. So are elementwise
    products by weights (a norm's scale), which are not sums of products."""
    monkeypatch.setenv("LUMINAL_MATMUL_PRECISION", "bf16")
    g = lm.Graph("att")
    q = g.input("q", (SEQ, 16))
    kk = g.input("k", (SEQ, 16))
    scale = g.weight("s", data=RNG.standard_normal(16).astype(np.float32))
    g.output("y", (q * scale) @ kk.T)
    assert round_products(g) is g


def test_flag_off_and_bad_values(monkeypatch) -> None:
    g = _linear()
    for off in ("", "f32", "F32"):
        monkeypatch.setenv("LUMINAL_MATMUL_PRECISION", off)
        assert round_products(g) is g
    monkeypatch.setenv("LUMINAL_MATMUL_PRECISION", "fp16")
    with pytest.raises(ValueError, match="LUMINAL_MATMUL_PRECISION='fp16'.*bf16"):
        pipeline.graph_passes(g)


def test_matcher_reads_half_operands_and_copies_in_their_type(monkeypatch) -> None:
    """A bf16 weight read as is and an activation rounded inside the product: the call reads
    the weight's bf16 buffer and a bf16 copy of the rounded activation; a product of mixed
    types (f32 activation by a bf16 weight) copies to f32 as before."""
    monkeypatch.setenv("LUMINAL_MATMUL_PRECISION", "bf16")
    low = lower(round_products(_linear(wdtype="bf16")))
    kern = next(k for k in low.kernels if any(isinstance(x, K.Reduce) for x in K.walk(k.value)))
    assert match_gemm(kern, len(low.buffers)) is None  # the activation is rounded in the loop
    alt = match_any(kern, len(low.buffers))
    assert alt is not None and len(alt.copies) == 1
    assert alt.copies[0].dtype is dt.bf16 and isinstance(alt.copies[0].value, K.Cast)
    a, b = alt.call.args[:2]
    assert a == alt.copies[0].out and low.buffers[b].dtype is dt.bf16
    assert alt.epilogue is not None  # bias and GELU read the f32 product back

    monkeypatch.setenv("LUMINAL_MATMUL_PRECISION", "")
    low = lower(_linear(wdtype="bf16"))
    kern = next(k for k in low.kernels if any(isinstance(x, K.Reduce) for x in K.walk(k.value)))
    alt = match_any(kern, len(low.buffers))
    assert alt is not None and [c.dtype for c in alt.copies] == [dt.f32]


def test_bf16_output_product_is_a_call_and_an_epilogue() -> None:
    """A product stored as bf16 (a bf16 model's linear layer): the call writes an f32 scratch
    product, the epilogue rounds it."""
    g = lm.Graph("half")
    x = g.input("x", (SEQ, 40), dtype=dt.bf16)
    w = g.weight("w", data=RNG.standard_normal((24, 40)).astype(ml_dtypes.bfloat16))
    y = (x.cast(dt.f32) @ w.cast(dt.f32).T).cast(dt.bf16)
    g.output("y", y)
    low = lower(g)
    (kern,) = [k for k in low.kernels if isinstance(k, K.Kernel)]
    alt = match_gemm(kern, len(low.buffers))
    assert alt is not None and not alt.copies and alt.epilogue is not None
    assert [low.buffers[i].dtype for i in alt.call.args[:2]] == [dt.bf16, dt.bf16]


def _prefer(func: str):
    def measure(sub, dims):
        steps = [s for s in sub.kernels if isinstance(s, K.LibCall)]
        return 1.0 if steps and steps[0].func == func else 2.0

    return measure


@pytest.mark.parametrize("func", ["gemm", "pgemm"])
@pytest.mark.parametrize("wdtype", ["f32", "bf16"])
def test_compiled_library_forms_match_the_interpreter(func, wdtype, tmp_path, monkeypatch):
    """The search forced to each library form of a bf16 product (OpenBLAS on widened
    operands, luminal's GEMM on bf16 panels) at odd sizes and row counts."""
    monkeypatch.setenv("LUMINAL_MATMUL_PRECISION", "bf16")
    use_kernel_cache(monkeypatch, tmp_path)
    g = round_products(_linear(n=45, k=71, wdtype=wdtype))
    if func == "pgemm" and vector_registers() < 32:
        pytest.skip("no AVX-512: luminal's GEMM is not offered")
    tuner = Tuner(_prefer(func), "test", variants=CpuTarget().library_variants)
    low = select.choose_library_calls(lower(g), tuner)
    calls = [s for s in low.kernels if isinstance(s, K.LibCall)]
    assert [c.func for c in calls] == [func]
    assert {low.buffers[i].dtype for i in calls[0].args[:2]} == {dt.bf16}
    ex = lm.load(build_plan(low, g.name).to_bytes())
    for rows in (1, 7, 33):
        xv = RNG.standard_normal((rows, 71)).astype(np.float32)
        want = interpret(g, {"x": xv})["y"]
        np.testing.assert_allclose(ex.run({"x": xv})["y"], want, rtol=2e-5, atol=2e-5)


def test_stage_runs_in_the_pipeline(monkeypatch) -> None:
    monkeypatch.setenv("LUMINAL_MATMUL_PRECISION", "bf16")
    g = pipeline.graph_passes(_linear())
    assert any(n.op is Leaf.INPUT and n.dtype is dt.bf16 for n in g.nodes)
    assert any(n.op is Op.CAST and n.dtype is dt.bf16 for n in g.nodes)


def test_attention_output_is_rounded_after_its_kernel(monkeypatch) -> None:
    """An attention output read head-major by the output projection: the staging copy and the
    rounding come after the attention kernel, which keeps its own form (a SoftmaxSum at the
    top, the attention code path), and the plan matches the interpreter."""
    monkeypatch.setenv("LUMINAL_MATMUL_PRECISION", "bf16")
    h, hd, n = 3, 20, 37
    g = lm.Graph("attn_proj")
    q, k, v = (g.input(name, (h, SEQ, hd)) for name in "qkv")
    o = F.softmax((q @ k.transpose(1, 2)) * (hd**-0.5), -1) @ v
    w = g.weight("w", data=RNG.standard_normal((n, h * hd)).astype(np.float32))
    g.output("y", F.linear(o.permute(1, 0, 2).reshape(SEQ, h * hd), w))
    low = lower(pipeline.graph_passes(g))
    attn = [s for s in low.kernels if any(isinstance(x, K.SoftmaxSum) for x in K.walk(s.value))]
    assert attn and all(isinstance(s.value, K.SoftmaxSum) for s in attn)
    inputs = {name: RNG.standard_normal((h, 9, hd)).astype(np.float32) for name in "qkv"}
    want = interpret(round_products(g), inputs)["y"]
    np.testing.assert_allclose(lm.compile(g).run(inputs)["y"], want, rtol=1e-5, atol=1e-5)
