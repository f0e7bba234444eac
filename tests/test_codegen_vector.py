"""Split sums rendered as explicit native-width vectors (codegen/cpu/vector.py) and the kernel-IR
constant folding the renderers run first (compiler/kfold.py): quantized GEMVs in every GGUF
format match the dequantized reference at odd row counts, the vector form is taken where it
applies and declined (scalar loop, same result) where it does not."""

import platform
import shutil
import subprocess

import numpy as np
import pytest

import luminal as lm
import luminal.functional as F
from luminal.codegen.cpu import render_kernel
from luminal.compiler import kernel_ir as K
from luminal.compiler.kfold import fold
from luminal.compiler.lower import lower
from luminal.compiler.pipeline import graph_passes
from luminal.compiler.schedule import schedule
from luminal.graph import dtypes as dt
from luminal.graph import symbolic as sym
from luminal.graph.ops import Op
from luminal.loaders import lowp, quants
from test_loaders import _random_blocks

RNG = np.random.default_rng(7)


def _gemv(fmt: str, rows: int, cols: int, seq: int = 1) -> tuple[lm.Graph, np.ndarray]:
    raw = _random_blocks(fmt, rows, cols).reshape(-1)
    g = lm.Graph(f"gemv_{fmt}")
    x = g.input("x", (seq, cols))
    w = quants.quantized_weight(g, "w", fmt, raw, (rows, cols))
    g.output("y", x @ w.transpose(0, 1))
    return g, quants.dequantize(fmt, raw, (rows, cols))


def _sources(g: lm.Graph) -> str:
    low = lower(graph_passes(g))
    kernels = [k for k in schedule(low.kernels) if isinstance(k, K.Kernel)]
    # the kernels' bodies, without the shared prelude
    return "\n".join(
        render_kernel(k, sorted(low.dims)).source.rsplit("#endif\n", 1)[-1] for k in kernels
    )


@pytest.mark.parametrize("fmt", ["Q4_1", "Q8_0"])
def test_quantized_gemv_takes_the_vector_form(fmt: str) -> None:
    src = _sources(_gemv(fmt, 48, 128)[0])
    assert "lm_f32v" in src and "lm_vsum_f32" in src
    # the nibble selection folded away: no runtime divisor, no table reads
    assert "lm_imod(" not in src


def _lowp_gemv(fmt: str, rows: int, cols: int) -> tuple[lm.Graph, np.ndarray]:
    parts = lowp.get(fmt).quantize(RNG.standard_normal((rows, cols)).astype(np.float32))
    g = lm.Graph(f"gemv_{fmt}")
    w = lowp.weight(g, "w", fmt, parts, (rows, cols))
    g.output("y", g.input("x", (1, cols)) @ w.transpose(0, 1))
    return g, lowp.dequantize(fmt, parts, (rows, cols))


@pytest.mark.parametrize(
    "fmt,rows,cols",
    [("Q4_0", 37, 96), ("Q4_1", 53, 160), ("Q8_0", 29, 224), ("Q4_K", 19, 512), ("Q6_K", 11, 256),
     # luminal's formats: their codes are table lookups
     ("mxfp4", 37, 96), ("nvfp4", 29, 192), ("fp8_e4m3", 23, 80), ("fp8_e5m2", 19, 48),
     ("mxfp8", 31, 224)],
)  # fmt: skip
def test_quantized_gemv_matches_dequantized_reference(fmt: str, rows: int, cols: int) -> None:
    g, w = _gemv(fmt, rows, cols) if fmt[0] == "Q" else _lowp_gemv(fmt, rows, cols)
    x = RNG.standard_normal((1, cols)).astype(np.float32)
    y = lm.compile(g).run({"x": x})["y"]
    ref = (x.astype(np.float64) @ w.T.astype(np.float64)).astype(np.float32)
    np.testing.assert_allclose(y, ref, rtol=2e-5, atol=2e-5 * np.abs(ref).max())


def test_code_table_lookups_run_in_registers() -> None:
    # mxfp4's e2m1 codes: a 16-entry table indexed by a nibble, provably in range, so no
    # bound check; its e8m0 scale table is indexed by an i32 part, so it keeps its check
    src = _sources(_lowp_gemv("mxfp4", 37, 96)[0])
    assert "lm_vlut_f32(" in src and "lm_f32v" in src
    assert src.count("< 256;") == 1  # the scale's bound check, not the codes'


def test_value_range_bounds_byte_codes_and_declines_the_unknown() -> None:
    byte = K.Cast(_ld(dt.u8), dt.i32)
    lo = K.Alu(Op.MOD, (byte, K.Const(16, dt.i32)), dt.i32)
    assert K.value_range(lo) == (0, 15)
    # the high nibble as lowp builds it: (q - q % 16) * 0.0625 truncated; the interval is
    # loose (q and q % 16 are correlated) but truncation still lands in [0, 15]
    diff = K.Alu(Op.ADD, (byte, K.Alu(Op.MUL, (lo, K.Const(-1, dt.i32)), dt.i32)), dt.i32)
    hi = K.Cast(K.Alu(Op.MUL, (K.Cast(diff, dt.f32), K.Const(0.0625, dt.f32)), dt.f32), dt.i32)
    assert K.value_range(hi) == (0, 15)
    assert K.value_range(_ld(dt.f32)) is None  # a float load could be anything, NaN too
    big = K.Alu(Op.MUL, (K.Cast(_ld(dt.i32), dt.i32), K.Const(2, dt.i32)), dt.i32)
    assert K.value_range(big) is None  # may wrap in 32 bits
    neg = K.Alu(Op.MOD, (K.Cast(_ld(dt.i8), dt.i32), K.Const(10, dt.i32)), dt.i32)
    assert K.value_range(neg) == (-9, 9)  # C's remainder keeps the dividend's sign
    # f16 overflows to inf past 65504, and inf truncated to an integer is undefined
    wide = K.Cast(K.Cast(_ld(dt.i32), dt.f16), dt.i32)
    assert K.value_range(wide) is None


def test_streaming_elementwise_loops_prefetch_only_what_streams() -> None:
    # a GELU chain over a matrix too large for the caches: the matrix is prefetched ahead, the
    # per-column vectors (read again every row, cached) are not; a row kernel (softmax) keeps
    # its own next-row prefetch (rows.py) and gets no stream prefetch
    from luminal.codegen.cpu.vector import STREAM_PREFETCH

    g = lm.Graph("gelu_chain")
    x = g.input("x", (4096, 4096))
    w, b, c = (g.input(n, (4096,)) for n in "wbc")
    g.output("y", F.gelu(x * w + b, approximate="tanh") * c)
    src = _sources(g)
    assert src.count("__builtin_prefetch(") == 1
    assert f"(4096*i0 + i1) + {STREAM_PREFETCH}]" in src
    g = lm.Graph("softmax")
    g.output("y", F.softmax(g.input("x", (4096, 4096)), -1))
    assert f"+ {STREAM_PREFETCH}]" not in _sources(g)


def test_body_with_a_comparison_declines_the_vector_form_and_stays_exact() -> None:
    # relu inside a split sum: a comparison, which the vector form does not cover
    cols = 96
    g = lm.Graph("relu_sum")
    x = g.input("x", (3, cols))
    wv = RNG.standard_normal((5, cols)).astype(np.float32)
    w = g.weight("w", data=wv)
    g.output("y", x.relu() @ w.transpose(0, 1))
    xv = RNG.standard_normal((3, cols)).astype(np.float32)
    y = lm.compile(g, search=False).run({"x": xv})["y"]
    np.testing.assert_allclose(y, np.maximum(xv, 0) @ wv.T, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- kfold


def _ld(d: dt.DType = dt.f32) -> K.Load:
    return K.Load(0, sym.index_var(0, 8), 1, d)


def test_fold_index_values_casts_and_constant_alu() -> None:
    h = K.IndexVal(1, dt.i32)
    v = K.Alu(Op.ADD, (K.Cast(h, dt.f32), K.Const(0.5, dt.f32)), dt.f32)
    out = fold(v)
    assert isinstance(out, K.Const) and out.value == 1.5
    recip = fold(K.Alu(Op.RECIP, (K.Const(16.0, dt.f32),), dt.f32))
    assert isinstance(recip, K.Const) and recip.value == 0.0625
    # float -> int casts truncate toward zero, as C does
    out = fold(K.Cast(K.Const(-2.7, dt.f32), dt.i32))
    assert isinstance(out, K.Const) and out.value == -2


def test_fold_integer_identities() -> None:
    q = K.Cast(_ld(dt.u8), dt.i32)
    assert fold(K.Alu(Op.MOD, (q, K.Const(1, dt.i32)), dt.i32)) == K.Const(0, dt.i32)
    assert fold(K.Alu(Op.MUL, (q, K.Const(1, dt.i32)), dt.i32)) is q
    assert fold(K.Alu(Op.MUL, (K.Const(0, dt.i32), q), dt.i32)) == K.Const(0, dt.i32)
    assert fold(K.Alu(Op.ADD, (q, K.Const(0, dt.i32)), dt.i32)) is q


def _ops(v: K.Value) -> int:
    seen: set[int] = set()

    def walk(x: K.Value) -> None:
        if isinstance(x, K.Alu) and id(x) not in seen:
            seen.add(id(x))
            for s in x.srcs:
                walk(s)

    walk(v)
    return len(seen)


def test_fold_combines_like_integer_terms() -> None:
    x = K.Cast(_ld(dt.u8), dt.i32)
    m = K.Alu(Op.MOD, (x, K.Const(16, dt.i32)), dt.i32)
    neg = K.Alu(Op.MUL, (m, K.Const(-1, dt.i32)), dt.i32)
    v = K.Alu(Op.ADD, (m, K.Alu(Op.ADD, (K.Alu(Op.ADD, (x, neg), dt.i32), neg), dt.i32)), dt.i32)
    out = fold(v)
    assert _ops(out) == 3  # x - m: the mod, a negation and one add (was 5 with the mod)

    def ev(e: K.Value, q: int) -> int:
        if e is x:
            return q
        if isinstance(e, K.Const):
            return int(e.value)
        assert isinstance(e, K.Alu)
        a = [ev(s, q) for s in e.srcs]
        return {Op.ADD: lambda: a[0] + a[1], Op.MUL: lambda: a[0] * a[1],
                Op.MOD: lambda: a[0] % a[1]}[e.op]()  # fmt: skip

    for q in range(256):  # the same value for every byte
        assert ev(out, q) == ev(v, q) == q - q % 16
    # nothing to combine: the sum is kept as it is
    y = K.Alu(Op.ADD, (x, K.Alu(Op.MUL, (m, K.Const(3, dt.i32)), dt.i32)), dt.i32)
    assert fold(y) == y


def test_fold_keeps_float_semantics() -> None:
    x = _ld()
    # x * 1 == x for every x; x * 0 is not 0 for inf/NaN and keeps the sign of x
    assert fold(K.Alu(Op.MUL, (x, K.Const(1.0, dt.f32)), dt.f32)) is x
    z = K.Alu(Op.MUL, (x, K.Const(0.0, dt.f32)), dt.f32)
    assert fold(z) == z
    # x + 0.0 is +0.0 for x = -0.0: only a float converted from an integer drops it
    plus0 = K.Alu(Op.ADD, (x, K.Const(0.0, dt.f32)), dt.f32)
    assert fold(plus0) == plus0
    fi = K.Cast(_ld(dt.i32), dt.f32)
    assert fold(K.Alu(Op.ADD, (fi, K.Const(0.0, dt.f32)), dt.f32)) is fi
    assert fold(K.Alu(Op.ADD, (x, K.Const(-0.0, dt.f32)), dt.f32)) is x
    # bool arithmetic is logical in the renderers: never folded numerically
    b = K.Alu(Op.ADD, (K.Const(True, dt.bool_), K.Const(True, dt.bool_)), dt.bool_)
    assert fold(b) == b


@pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64") or shutil.which("cc") is None,
    reason="needs an x86-64 C compiler",
)
@pytest.mark.parametrize("march,lanes", [("x86-64", 4), ("x86-64-v3", 8), ("x86-64-v4", 16)])
def test_vector_kernels_compile_for_every_vector_width(tmp_path, march, lanes):
    # the host runs only its own width: the others are compiled (not run) here, so a machine
    # with another vector ISA gets code that builds
    g, _ = _gemv("Q4_1", 48, 128)
    low = lower(graph_passes(g))
    (k,) = [k for k in schedule(low.kernels) if isinstance(k, K.Kernel)]
    src = render_kernel(k, sorted(low.dims)).source
    _compiles(tmp_path, march, src + f'\n_Static_assert(LM_VL == {lanes}, "lanes");\n')


def _every_kernel_compiles(tmp_path, g: lm.Graph) -> None:
    """Each of ``g``'s kernels builds for the 4- and 8-lane widths (the host runs its own)."""
    if platform.machine() not in ("x86_64", "AMD64") or shutil.which("cc") is None:
        return
    low = lower(graph_passes(g))
    for k in [k for k in schedule(low.kernels) if isinstance(k, K.Kernel)]:
        for march in ("x86-64", "x86-64-v3"):
            _compiles(tmp_path, march, render_kernel(k, sorted(low.dims)).source)


def _compiles(tmp_path, march: str, src: str) -> None:
    path = tmp_path / "k.c"
    path.write_text(src)
    r = subprocess.run(
        ["cc", "-O1", f"-march={march}", "-c", "-o", str(tmp_path / "k.o"),
         "-Werror=implicit-function-declaration", str(path)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]


def _exp_heavy_graph() -> lm.Graph:
    import luminal.functional as F

    g = lm.Graph("exp_heavy")
    x, w = g.input("x", (3, 45)), g.input("w", (45,))
    g.output("sm", F.softmax(x, -1))
    g.output("gelu", F.gelu(x * w, approximate="tanh"))
    g.output("silu", F.silu(x))
    g.output("rms", F.rms_norm(x, (45,), w, 1e-6))
    g.output("gelu_erf", F.gelu(x))  # a comparison and a 2-way max in the vector form
    return g


def test_exp_heavy_loops_take_the_vector_form():
    src = _sources(_exp_heavy_graph())
    assert "lm_vexp2f(" in src and "lm_vmaxf(" in src
    # 45 = 2 vectors of 16 and a scalar rest of 13: both loops are there
    assert "+ LM_VL <= 45" in src and "lm_exp2f(" in src


@pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64") or shutil.which("cc") is None,
    reason="needs an x86-64 C compiler",
)
@pytest.mark.parametrize("march", ["x86-64", "x86-64-v3", "x86-64-v4"])
def test_exp_heavy_vector_loops_compile_for_every_vector_width(tmp_path, march):
    # the AVX-512 forms (vrndscaleps / vscalefps exp2, vrangeps max, streamed vector stores)
    # have portable stand-ins: each width builds
    from luminal.codegen.cpu import rows as c_rows

    mp = pytest.MonkeyPatch()
    mp.setattr(c_rows, "STREAM_BYTES", 0)  # staged runs: the vector stores that stream
    try:
        low = lower(graph_passes(_exp_heavy_graph()))
        kernels = [k for k in schedule(low.kernels) if isinstance(k, K.Kernel)]
        # each with the prelude (guarded: one copy compiles)
        src = "\n".join(render_kernel(k, sorted(low.dims)).source for k in kernels)
    finally:
        mp.undo()
    assert "lm_vstore_out(" in src and "lm_nt);" in src
    _compiles(tmp_path, march, src)


@pytest.mark.parametrize("cols", [16, 45, 4099])
def test_vector_row_max_orders_signed_zeros_and_flags_nan(cols):
    """The vrangeps max and its NaN flag agree with the scalar key form, whether the special
    value falls in the vector part or the scalar rest."""
    x = np.full((6, cols), -0.0, np.float32)  # row 0: all -0 -> -0
    x[1, cols - 1] = 0.0  # +0 beats -0 (in the rest, or the last vector)
    x[2, 1] = 0.0
    x[3, :] = -np.inf
    x[3, cols // 2] = np.nan
    x[4, :] = RNG.standard_normal(cols).astype(np.float32)
    x[4, cols - 1] = np.inf
    x[5, :] = -np.inf
    g = lm.Graph("vmax")
    g.output("y", g.input("x", x.shape).max_reduce(1))
    y = lm.compile(g, search=False).run({"x": x})["y"]
    assert np.signbit(y[0]) and y[0] == 0
    assert not np.signbit(y[1]) and not np.signbit(y[2])
    assert np.isnan(y[3]) and y[4] == np.inf and y[5] == -np.inf


def _select_graph(cols: int) -> lm.Graph:
    import luminal.functional as F

    g = lm.Graph("vector_selects")
    x = g.input("x", (2, cols))
    g.output("gelu", F.gelu(x))  # erf: abs as a 2-way max, a sign from a comparison
    g.output("relu_exp", (x * -1.0).exp() * x.relu())
    g.output("abs_exp", (x.abs() * -1.0).exp())
    return g


def test_vector_selects_match_the_scalar_rest_and_torch():
    """Comparisons, 2-way maxima (relu) and their casts in the vector form, abs (a 2-way max
    of x and -x) as a cleared sign bit: special values give the same bits in the vector part
    (columns 0-12) as in the scalar rest (32-44), and finite ones match torch."""
    import torch

    src = _sources(_select_graph(45))
    assert "lm_vmax2f(" in src and "lm_vexp2f(" in src and " < " in src
    assert "& lm_vsplati(0x7fffffff)" in src and "fabsf(" in src
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, -1e-30, 3.0, -3.0, 40.0, -40.0,
                        0.5, -0.5], np.float32)  # fmt: skip
    x = RNG.standard_normal((2, 45)).astype(np.float32)
    x[:, :13] = special
    x[:, 32:] = special
    out = lm.compile(_select_graph(45), search=False).run({"x": x})
    for name, y in out.items():
        np.testing.assert_array_equal(y[:, :13], y[:, 32:], err_msg=name)
    t = torch.from_numpy(x[:, 13:32])
    want = {
        "gelu": torch.nn.functional.gelu(t),
        "relu_exp": torch.exp(-t) * torch.relu(t),
        "abs_exp": torch.exp(-t.abs()),
    }
    for name, w in want.items():
        np.testing.assert_allclose(out[name][:, 13:32], w.numpy(), rtol=2e-6, atol=1e-6)


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    """lm_f32_to_bf16 (codegen/prelude.py) in numpy: nearest even, a NaN kept quiet."""
    u = x.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, (u >> 16) | 0x40, r).astype(np.uint16)


@pytest.mark.parametrize("half", ["bf16", "f16"])
@pytest.mark.parametrize("out", ["half", "f32"])
def test_half_rounding_in_vector_loops_matches_the_scalar_bits(out: str, half: str) -> None:
    """An exp-heavy loop (vector form) whose value is rounded to bf16 or f16, stored so or
    widened back to f32: ties both ways, carries into the exponent, overflow to inf, NaN,
    infinities, subnormals and -0, in the vector part and the scalar rest (71 = 4 x 16 + 7)."""
    special = np.array(
        [0x3F808000, 0x3F818000, 0x3F80FFFF, 0x7F7FFFFF, 0x7F800000, 0xFF800000, 0x7FC00001,
         0xFF812345, 0x00000001, 0x80008000, 0x00018000, 0x80000000, 0x3F7FFFFF, 0x477FE000],
        dtype=np.uint32,
    ).view(np.float32)  # fmt: skip
    x = RNG.standard_normal((3, 71)).astype(np.float32) * 1e3
    x.reshape(-1)[: len(special)] = special
    x.reshape(-1)[64 : 64 + len(special)] = special  # the last 7 are the scalar rest's
    g = lm.Graph("round")
    xi, z = g.input("x", (3, 71)), g.input("z", (3, 71))
    hd = dt.bf16 if half == "bf16" else dt.f16
    y = (xi * z.exp2()).cast(hd)  # z = 0: x * 1, exact, through lm_vexp2f
    g.output("y", y if out == "half" else y.cast(dt.f32))
    src = _sources(g)
    assert (f"lm_vstore_{half}(" if out == "half" else f"lm_vround_{half}(") in src
    got = lm.compile(g).run({"x": x, "z": np.zeros_like(x)})["y"]
    if half == "bf16":
        want = _bf16_bits(x)
        bits = (
            got.view(np.uint16) if out == "half" else (got.view(np.uint32) >> 16).astype(np.uint16)
        )
        np.testing.assert_array_equal(bits, want)
        if out == "f32":
            assert not (got.view(np.uint32) & 0xFFFF).any()
        return
    with np.errstate(over="ignore"):  # nearest even, overflow to inf, subnormals kept
        want16 = x.astype(np.float16)
        got16 = got if out == "half" else got.astype(np.float16)  # exact: f16 values widened
    nan = np.isnan(want16)
    np.testing.assert_array_equal(np.isnan(got16), nan)
    np.testing.assert_array_equal(got16.view(np.uint16)[~nan], want16.view(np.uint16)[~nan])


def test_widened_half_values_are_stored_in_their_type() -> None:
    """A bf16 value widened to f32 and read many times (an activation rounded for a product)
    is stored as bf16 and widened where it is read: half the bytes, and the product sees a
    bf16 operand."""
    g = lm.Graph("narrow")
    x = g.input("x", (lm.dim("seq", 1, 64), 96))
    w = g.input("w", (80, 96))
    h = F.gelu(x).cast(dt.bf16).cast(dt.f32)
    g.output("y", h @ w.transpose(0, 1))
    low = lower(g)
    stored = [low.buffers[k.out].dtype for k in low.kernels if isinstance(k, K.Kernel)]
    assert stored == [dt.bf16, dt.f32]
    prod = low.kernels[-1]
    assert any(isinstance(v, K.Cast) and isinstance(v.src, K.Load) and v.src.dtype is dt.bf16
               for v in K.walk(prod.value))  # fmt: skip
    xv = RNG.standard_normal((5, 96)).astype(np.float32)
    wv = RNG.standard_normal((80, 96)).astype(np.float32)
    np.testing.assert_allclose(
        lm.compile(g).run({"x": xv, "w": wv})["y"], g.run({"x": xv, "w": wv})["y"],
        rtol=1e-5, atol=1e-4,
    )  # fmt: skip


@pytest.mark.parametrize(
    "name,shape,fn,ref",
    [
        ("colsum", (37, 53), lambda x: x.sum(0), lambda a: a.sum(0)),
        ("outer_mean", (5, 19, 35), lambda x: x.mean(1), lambda a: a.mean(1)),
        (
            "channel_norm",  # ConvNeXt's channels-first layer norm over an NCHW tensor
            (2, 24, 5, 17),
            lambda x: (
                (x - x.mean(1, keepdim=True))
                * (((x - x.mean(1, keepdim=True)) ** 2).mean(1, keepdim=True) + 1e-6).rsqrt()
            ),
            lambda a: (
                (a - a.mean(1, keepdims=True))
                / np.sqrt(((a - a.mean(1, keepdims=True)) ** 2).mean(1, keepdims=True) + 1e-6)
            ),
        ),
    ],
)
def test_sums_over_an_outer_axis_run_as_vectors_along_the_output(name, shape, fn, ref) -> None:
    """A sum whose terms are strided in the summed axis but contiguous along the output's
    innermost axis (a column sum, a mean over an outer axis, a channel norm of NCHW) adds one
    vector of outputs per step of the summed variable instead of gathering along it; the
    lanes past the last whole vector take the scalar loop."""
    g = lm.Graph(name)
    g.output("y", fn(g.input("x", shape)))
    src = _sources(g)
    assert any("lm_f32v" in ln and "= {0};" in ln for ln in src.splitlines()), (
        "no vector accumulator along the output"
    )
    a = RNG.standard_normal(shape, dtype=np.float32)
    got = lm.compile(g).run({"x": a})["y"]
    np.testing.assert_allclose(got, ref(a), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize(
    "groups,cin,k,most,stride",
    [(6, 6, 7, 200, 1), (3, 6, 3, 4096, 1), (6, 6, 3, 4096, 1), (6, 6, 3, 4096, 2),
     (6, 6, 7, 200, 2)],
)  # fmt: skip
def test_padded_conv_taps_run_as_vectors_along_the_output_row(groups, cin, k, most, stride):
    """A conv of symbolic size, generated (depthwise 7x7 and 3x3, grouped 3x3 of two channels
    a group; sizes up to 4096 make the output's runs staged; stride 1 and 2): its taps are
    split by the kernel width (no division of the inner tap variable left), and each output
    row runs as vectors of columns whose padded loads read only the lanes inside the picture
    (every other column at stride 2), the row's last columns one shorter vector; rows
    narrower than a vector and wider than several, against PyTorch."""
    import torch

    h, w = lm.dim("h", 1, most), lm.dim("w", 1, most)
    g = lm.Graph("conv")
    x = g.input("x", (2, cin, h, w))
    wt = RNG.standard_normal((cin, cin // groups, k, k), dtype=np.float32)
    y = F.conv2d(x, g.weight("wt", data=wt), None, stride=stride, padding=k // 2, groups=groups)
    g.output("y", y)
    low = lower(graph_passes(g))
    (kern,) = [s for s in schedule(low.kernels) if isinstance(s, K.Kernel)
               and any(isinstance(r, K.Reduce) for r in K.walk(s.value))]  # fmt: skip
    inner = [r for r in K.walk(kern.value) if isinstance(r, K.Reduce)][-1]
    assert inner.extent == k, "the taps are not split by the kernel width"
    src = _sources(g)
    load = "lm_vload_f32_lanes" if stride == 1 else "lm_vload_f32_s2_lanes"
    assert f"{load}(" in src and "lm_vstore_f32_lanes(" in src
    cg = lm.compile(g, search=False, cache=False)
    for hw in ((5, 3), (9, 37), (23, 16), (40, 70)):
        a = RNG.standard_normal((2, cin, *hw), dtype=np.float32)
        want = torch.nn.functional.conv2d(
            torch.from_numpy(a), torch.from_numpy(wt), stride=stride, padding=k // 2,
            groups=groups,
        ).numpy()  # fmt: skip
        np.testing.assert_allclose(cg.run({"x": a})["y"], want, rtol=1e-4, atol=1e-4)


# each a luminal pool and PyTorch's (``tf``: torch.nn.functional)
_POOLS = {
    "max3s2p1": (lambda x: F.max_pool2d(x, 3, 2, 1), lambda tf, t: tf.max_pool2d(t, 3, 2, 1)),
    "max3s1p1": (lambda x: F.max_pool2d(x.relu(), 3, 1, 1),
                 lambda tf, t: tf.max_pool2d(t.relu(), 3, 1, 1)),
    "max2s2": (lambda x: F.max_pool2d(x, 2, 2), lambda tf, t: tf.max_pool2d(t, 2, 2)),
    "avg3s1p1": (lambda x: F.avg_pool2d(x, 3, 1, 1, count_include_pad=False),
                 lambda tf, t: tf.avg_pool2d(t, 3, 1, 1, count_include_pad=False)),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(_POOLS))
def test_padded_pools_run_as_vectors_along_the_output_row(name, tmp_path):
    """A pool of symbolic size (padded or not, stride 1 or 2, max or mean): each output row
    runs as vectors of columns, a padding mask's lanes computed as a window (its loads read
    only the lanes inside the picture); the code builds for every vector width, and rows
    narrower than a vector and wider than several match PyTorch, NaNs included."""
    import torch

    fn, ref = _POOLS[name]
    h, w = lm.dim("h", 2, 4096), lm.dim("w", 2, 4096)
    g = lm.Graph("pool")
    g.output("y", fn(g.input("x", (2, 3, h, w))))
    src = _sources(g)
    assert "lm_vload_f32" in src and "lm_vstore_f32_lanes(" in src
    if name.endswith("p1") and name.startswith("max"):
        assert "lm_vwindow_f32(" in src
    _every_kernel_compiles(tmp_path, g)
    cg = lm.compile(g, search=False, cache=False)
    for hw in ((2, 3), (5, 9), (9, 37), (23, 16), (40, 70)):
        a = RNG.standard_normal((2, 3, *hw), dtype=np.float32)
        a[1, 2, 0, 1] = np.nan
        want = ref(torch.nn.functional, torch.from_numpy(a)).numpy()
        np.testing.assert_allclose(cg.run({"x": a})["y"], want, rtol=1e-5, atol=1e-6)


def test_channels_last_conv_taps_run_as_gathered_lanes(tmp_path):
    """A depthwise 7x7 reading a channels-last input through a permute (ConvNeXt's blocks):
    its taps along the output row are lanes a channel count apart, one masked gather each;
    the code builds for every vector width and matches PyTorch at widths below and above a
    vector."""
    import torch

    h = lm.dim("h", 2, 512)
    g = lm.Graph("dwcl")
    x = g.input("x", (2, h, h, 24))
    wt = RNG.standard_normal((24, 1, 7, 7), dtype=np.float32)
    g.output("y", F.conv2d(x.permute(0, 3, 1, 2), g.weight("w", data=wt), None, padding=3,
                           groups=24))  # fmt: skip
    assert "lm_vload_f32_strided_lanes(" in _sources(g)
    _every_kernel_compiles(tmp_path, g)
    cg = lm.compile(g, search=False, cache=False)
    for n in (3, 16, 37):
        a = RNG.standard_normal((2, n, n, 24), dtype=np.float32)
        want = torch.nn.functional.conv2d(torch.from_numpy(a).permute(0, 3, 1, 2),
                                          torch.from_numpy(wt), padding=3, groups=24)  # fmt: skip
        np.testing.assert_allclose(cg.run({"x": a})["y"], want.numpy(), rtol=1e-4, atol=1e-4)
