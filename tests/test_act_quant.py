"""Int8 activations (LUMINAL_ACT_QUANT=q8): the graph's q8 quantization against a numpy port
of ggml's reference quantizer, the ``qdot`` library call against the interpreter at odd sizes
on each of its code paths, and the flag's off state and errors."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import luminal as lm
from kernel_cache import use_kernel_cache
from luminal import runtime
from luminal.compiler import kernel_ir as K
from luminal.compiler import pipeline
from luminal.compiler.actquant import fake_quant_q8, quantize_activations
from luminal.compiler.lower import BufferInfo, lower
from luminal.compiler.search.gemm import match_qdot
from luminal.compiler.search.select import subprogram
from luminal.graph import symbolic as sym
from luminal.loaders import quants
from luminal.targets.cpu import CpuTarget

RNG = np.random.default_rng(18)
_F16_AT = {"Q4_0": [0], "Q4_1": [0, 2], "Q8_0": [0]}


def ggml_q8_0(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """quantize_row_q8_0_ref (ggml-quants.c) per block of 32 of ``x``'s last axis: (codes,
    f16 scales)."""
    xb = x.reshape(-1, 32).astype(np.float32)
    amax = np.abs(xb).max(axis=1)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    x0 = (xb * inv[:, None]).astype(np.float32)
    # roundf (half away from zero); in f64, where adding one half is exact
    q = np.sign(x0) * np.floor(np.abs(x0.astype(np.float64)) + 0.5)
    return q.astype(np.int8), d.astype(np.float16)


def _fq_graph(k: int) -> lm.Graph:
    g = lm.Graph("fq")
    x = g.input("x", (sym.dim("rows", 1, 64), k))
    g.output("y", fake_quant_q8(x))
    return g


def _edge_rows(k: int) -> np.ndarray:
    x = RNG.standard_normal((5, k)).astype(np.float32) * np.float32(3)
    x[1] = 0.0  # d == 0: codes 0
    x[2, :32] = -0.0
    x[2, 32:] = np.float32(1e-42)  # a subnormal block: d underflows to 0
    # amax 127 (d = 1) with halves: roundf goes away from zero, and just below a half
    x[3, :32] = 127.0
    x[3, 1:8] = [2.5, -2.5, 0.5, -0.5, np.float32(0.49999997), 126.5, -3.5]
    x[4] *= np.float32(1e4)
    return x


def test_q8_matches_ggml_reference_bit_exactly() -> None:
    k = 96
    x = np.concatenate([_edge_rows(k), RNG.uniform(-1, 1, (7, k)).astype(np.float32)])
    with np.errstate(over="ignore", invalid="ignore"):
        codes, d = ggml_q8_0(x)
    want = (codes.astype(np.float32) * d.astype(np.float32)[:, None]).reshape(x.shape)
    got = _fq_graph(k).run({"x": x}, rows=len(x))["y"]
    # ggml divides by a subnormal d (its codes overflow); the graph gives 0, f16(d) being 0
    np.testing.assert_array_equal(got[2], np.zeros(k, np.float32))
    keep = np.arange(len(x)) != 2
    np.testing.assert_array_equal(got[keep], want[keep])
    assert codes[3 * 3, 1:8].tolist() == [3, -3, 1, -1, 0, 127, -4]


def test_q8_compiled_equals_interpreter() -> None:
    k = 64
    x = np.concatenate([_edge_rows(k), RNG.standard_normal((6, k)).astype(np.float32)])
    g = _fq_graph(k)
    want = g.run({"x": x}, rows=len(x))["y"]
    got = lm.compile(g, search=False).run({"x": x}, rows=len(x))["y"]
    np.testing.assert_array_equal(got, want)


def _blocks(fmt: str, rows: int, cols: int) -> np.ndarray:
    f = quants.FORMATS[fmt]
    nb = rows * cols // f.block
    raw = RNG.integers(0, 256, size=(nb, f.type_size), dtype=np.uint8)
    for o in _F16_AT[fmt]:
        half = RNG.uniform(-2, 2, size=nb).astype(np.float16)
        raw[:, o : o + 2] = half.view(np.uint8).reshape(nb, 2)
    return raw.reshape(-1)


def _product(fmt: str, n: int, k: int, residual: bool = False) -> lm.Graph:
    g = lm.Graph(f"qdot_{fmt}")
    x = g.input("x", (sym.dim("rows", 1, 64), k))
    w = quants.quantized_weight(g, "w", fmt, _blocks(fmt, n, k), (n, k))
    y = x @ w.transpose(0, 1)
    if residual:  # a fused epilogue: the call writes the product, a kernel adds
        y = y + g.input("r", (sym.dim("rows", 1, 64), n))
    g.output("y", y)
    return g


def _qdot_program(g: lm.Graph, tile: int | None = None):
    """The lowered program of ``g`` after the graph stages, its product replaced by the qdot
    call (and epilogue) the search would offer (with descriptor field ``tile`` if given)."""
    low = lower(pipeline.graph_passes(g))
    found = [(i, a) for i, s in enumerate(low.kernels) if (a := match_qdot(s, len(low.buffers)))]
    assert len(found) == 1, "the product is not recognized as a qdot call"
    at, alt = found[0]
    kern = low.kernels[at]
    if tile is not None:
        alt = replace(alt, call=replace(alt.call, fields={**alt.call.fields, "tile": tile}))
    extra = []
    if alt.scratch_shape is not None:
        extra = [BufferInfo(alt.call.out, "prod", kern.dtype, alt.scratch_shape, "scratch")]
    steps = [alt.call, *([alt.epilogue] if alt.epilogue else [])]
    kernels = [*low.kernels[:at], *steps, *low.kernels[at + 1 :]]
    return low, replace(low, kernels=kernels, buffers=[*low.buffers, *extra])


def _run(low, inputs: dict[str, np.ndarray], rows: int) -> np.ndarray:
    ex = runtime.Executor(CpuTarget().build_plan(low, "t"))
    return ex.run(inputs, {"rows": rows})["y"]


@pytest.mark.parametrize("isa", ["scalar", "avx2", "vnni256", "", "tile=2"])
@pytest.mark.parametrize("fmt", ["Q4_0", "Q4_1", "Q8_0"])
def test_qdot_matches_interpreter(fmt: str, isa: str, monkeypatch) -> None:
    """q8 activations by each format through the call, at odd row counts (1, 2, 3, 7: the
    row groups of 4 and their remainders) and an odd number of weight rows, against the
    graph's own value; each ISA path (LUMINAL_QDOT_ISA caps it at construction), and the
    packed path's two tile schedules."""
    monkeypatch.setenv("LUMINAL_ACT_QUANT", "q8")
    tile = 2 if isa == "tile=2" else None
    monkeypatch.setenv("LUMINAL_QDOT_ISA", "" if tile else isa)
    # n = 21: two groups of 16 weight rows, the last one short (with tile 2 the packed path
    # takes one or two activation rows two groups at a time)
    for n, k in ((37, 96), (21, 64)):
        _check_qdot(fmt, n, k, tile)


def test_qdot_rejects_a_tile_other_than_1_or_2() -> None:
    _, low = _qdot_program(_product("Q4_0", 21, 64), tile=3)
    with pytest.raises(runtime.PlanError, match="step 0 \\(qdot\\).*'tile' must be 1 or 2"):
        _run(low, {"x": RNG.standard_normal((2, 64)).astype(np.float32)}, 2)


def _check_qdot(fmt: str, n: int, k: int, tile: int | None = None) -> None:
    g = _product(fmt, n, k, residual=fmt == "Q4_1")
    ref_graph = pipeline.graph_passes(g)
    _, low = _qdot_program(g, tile)
    assert any(isinstance(s, K.LibCall) and s.func == "qdot" for s in low.kernels)
    for rows in (1, 2, 3, 7):
        inputs = {"x": RNG.standard_normal((rows, k)).astype(np.float32)}
        if fmt == "Q4_1":
            inputs["r"] = RNG.standard_normal((rows, n)).astype(np.float32)
        want = ref_graph.run(inputs, rows=rows)["y"]
        got = _run(low, inputs, rows)
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())


@pytest.mark.parametrize("fmt", ["Q4_0", "Q4_1", "Q8_0"])
def test_qdot_weight_given_as_input_is_packed_again_when_its_bytes_change(fmt: str) -> None:
    """The call packs its weight on the first run and keeps the packed copy while the weight's
    bytes stay the same, also from new buffers (the search times a call on copies of its
    inputs); other bytes are packed again. Cut out as the search cuts it: the weight's buffers
    are inputs."""
    n, k, rows = 37, 96, 5
    low = lower(pipeline.graph_passes(_product(fmt, n, k)))
    (kern,) = low.kernels
    alt = match_qdot(kern, len(low.buffers))
    assert alt is not None and alt.epilogue is None
    sub = subprogram(low, [alt.call])
    plan = CpuTarget().build_plan(sub, "t")

    def inputs(seed: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed)
        out = {}
        for b in sub.buffers:
            if b.role != "input":
                continue
            shape = tuple(rows if isinstance(d, sym.Expr) else int(d) for d in b.shape)
            if b.name == f"b{alt.call.args[0]}":  # q8 values: codes times a power of two
                codes = rng.integers(-126, 127, size=shape).astype(np.float32)
                codes[:, ::32] = 127  # amax is 127 d: exact codes
                out[b.name] = codes * np.float32(2.0**-5)
            elif b.dtype.name in ("u8", "i8"):
                out[b.name] = rng.integers(0, 256, size=shape, dtype=np.uint8).view(b.dtype.np_type)
            else:
                out[b.name] = rng.uniform(-0.1, 0.1, size=shape).astype(np.float32)
        return out

    def run(ex: runtime.Executor, x: dict[str, np.ndarray]) -> np.ndarray:
        (y,) = ex.run(x, {"rows": rows}).values()
        return np.array(y)

    a, b = inputs(1), inputs(2)
    ex = runtime.Executor(plan)
    first = run(ex, a)
    np.testing.assert_array_equal(first, run(runtime.Executor(plan), a))
    np.testing.assert_array_equal(run(ex, {n_: v.copy() for n_, v in a.items()}), first)
    np.testing.assert_array_equal(run(ex, b), run(runtime.Executor(plan), b))
    np.testing.assert_array_equal(run(ex, a), first)
    assert not np.array_equal(run(ex, b), first)


@pytest.mark.parametrize("fmt", ["Q4_1", "Q8_0"])
def test_qdot_f32_activations_take_the_exact_path(fmt: str, monkeypatch) -> None:
    """Without q8 activations, blocks are not codes times a scale: the call sums them in f32
    and still computes the product (what the search's check on random inputs relies on)."""
    monkeypatch.setenv("LUMINAL_ACT_QUANT", "")
    n, k = 21, 64
    g = _product(fmt, n, k)
    low = lower(pipeline.graph_passes(g))
    (kern,) = low.kernels
    alt = match_qdot(kern, len(low.buffers))
    assert alt is not None and alt.epilogue is None
    x = RNG.standard_normal((5, k)).astype(np.float32)
    x[2, :32] = np.round(x[2, :32] * 10)  # one block of integers: the integer path
    want = g.run({"x": x}, rows=5)["y"]
    got = _run(replace(low, kernels=[alt.call]), {"x": x}, 5)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())


def test_search_keeps_a_checked_program(monkeypatch, tmp_path) -> None:
    """Compiled with q8 activations, whichever program the search keeps matches the graph."""
    monkeypatch.setenv("LUMINAL_ACT_QUANT", "q8")
    use_kernel_cache(monkeypatch, tmp_path)
    g = _product("Q4_1", 203, 128)
    x = RNG.standard_normal((3, 128)).astype(np.float32)
    want = pipeline.graph_passes(g).run({"x": x}, rows=3)["y"]
    got = lm.compile(g).run({"x": x}, rows=3)["y"]
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())
    f32 = g.run({"x": x}, rows=3)["y"]
    assert not np.allclose(f32, want, rtol=1e-6, atol=0)  # the numerics did change


def test_flag_off_leaves_the_graph_alone(monkeypatch) -> None:
    monkeypatch.setenv("LUMINAL_ACT_QUANT", "")
    g = _product("Q4_1", 16, 64)
    assert quantize_activations(g) is g
    monkeypatch.setenv("LUMINAL_ACT_QUANT", "q8")
    assert quantize_activations(g) is not g
    g2 = lm.Graph("plain")
    x = g2.input("x", (3, 64))
    g2.output("y", x @ g2.weight("w", data=RNG.standard_normal((8, 64)).astype(np.float32)).T)
    assert quantize_activations(g2) is g2  # no quantized weight: nothing to do


def test_flag_off_lowers_as_without_the_stage(monkeypatch) -> None:
    monkeypatch.setenv("LUMINAL_ACT_QUANT", "")
    g = _product("Q4_1", 16, 64)
    without = [s for s in pipeline.STAGES if s.name != "act_quant"]
    c1 = pipeline.run(g, CpuTarget(), search=False)
    c2 = pipeline.run(g, CpuTarget(), search=False, stages=without)
    assert K.fingerprint(c1.lowered.kernels) == K.fingerprint(c2.lowered.kernels)


def test_bad_flag_value_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.setenv("LUMINAL_ACT_QUANT", "q4")
    with pytest.raises(ValueError, match="LUMINAL_ACT_QUANT='q4'.*q8"):
        pipeline.graph_passes(_product("Q4_0", 8, 32))


def test_k_quants_keep_f32_activations(monkeypatch) -> None:
    """Q4_K blocks are 256 values (llama.cpp quantizes their activations as q8_K): untouched."""
    monkeypatch.setenv("LUMINAL_ACT_QUANT", "q8")
    g = lm.Graph("qk")
    x = g.input("x", (2, 256))
    raw = RNG.integers(0, 256, size=(4, 144), dtype=np.uint8)
    raw[:, :4] = RNG.uniform(0, 1, (4, 2)).astype(np.float16).view(np.uint8)
    w = quants.quantized_weight(g, "w", "Q4_K", raw.reshape(-1), (4, 256))
    g.output("y", x @ w.transpose(0, 1))
    assert quantize_activations(g) is g


def _q41_llama(ctx: int = 24):
    """A one-layer Llama whose matrices are Q4_1 blocks (gguf's quantizer), vectors f32."""
    gguf = pytest.importorskip("gguf")
    from luminal.models.base import DictWeights
    from luminal.models.llama import Llama, LlamaConfig

    cfg = LlamaConfig(vocab_size=40, hidden_size=64, intermediate_size=96, n_layers=1,
                      n_heads=2, n_kv_heads=1, head_dim=32, context_length=ctx)  # fmt: skip
    shapes = {"token_embd.weight": (40, 64), "output_norm.weight": (64,),
              "blk.0.attn_norm.weight": (64,), "blk.0.ffn_norm.weight": (64,),
              "blk.0.attn_q.weight": (64, 64), "blk.0.attn_k.weight": (32, 64),
              "blk.0.attn_v.weight": (32, 64), "blk.0.attn_output.weight": (64, 64),
              "blk.0.ffn_gate.weight": (96, 64), "blk.0.ffn_up.weight": (96, 64),
              "blk.0.ffn_down.weight": (64, 96)}  # fmt: skip
    rng = np.random.default_rng(5)
    arrays = {k: (rng.standard_normal(s) * 0.3 + (len(s) == 1)).astype(np.float32)
              for k, s in shapes.items()}  # fmt: skip

    class Q41Weights(DictWeights):
        raw = {n: gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q4_1).reshape(-1)
               for n, a in arrays.items() if a.ndim == 2}  # fmt: skip

        def get(self, g: lm.Graph, name: str):  # type: ignore[override]
            if name in self.raw:
                return quants.quantized_weight(g, name, "Q4_1", self.raw[name], shapes[name])
            return super().get(g, name)

    return Llama(cfg, Q41Weights(arrays))


def test_q8_prefill_keeps_quantized_weights_and_matches_the_graph(monkeypatch, tmp_path) -> None:
    """With q8 activations the prefill program keeps its Q4_1 weights packed (not folded to
    f32), so prompts take decode's numerics; a compiled session's prefill and decode steps
    match the interpreter on the q8 graph."""
    from luminal.models import LlamaSession

    use_kernel_cache(monkeypatch, tmp_path)
    monkeypatch.setenv("LUMINAL_ACT_QUANT", "q8")
    model = _q41_llama()
    pre = model.build_prefill(4)
    f32_bytes = sum(4 * int(np.prod(a.shape)) for a in model.weights.arrays.values())
    assert sum(np.asarray(a).nbytes for a in pre.weights.values()) < f32_bytes / 2  # not f32
    s = LlamaSession(model, "compiled", prefill_min=4)
    assert s.compile_prefill()
    ids = [3, 9, 27, 1, 34, 8]
    got = [s.forward(ids), s.forward([5])]
    ref_graph = pipeline.graph_passes(model.build())
    cache = model.new_cache()
    out = ref_graph.run({"tokens": np.asarray(ids, np.int32), **cache}, pos=0)
    want = [out["logits"][-1]]
    cache = {n: out[n + "_new"] for n in model.cache_names()}
    want.append(ref_graph.run({"tokens": np.asarray([5], np.int32), **cache}, pos=6)["logits"][-1])
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * np.abs(b).max())
