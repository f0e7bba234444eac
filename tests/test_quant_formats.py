"""luminal's low-precision formats (``luminal.loaders.lowp``): element rounding against
``ml_dtypes``, each format's round trip against its reference quantizer (bit-exact packing,
the graph expression equal to the numpy dequantizer), the MX / nvfp4 blocks against
``gguf.quants``, the error-minimising scales against the amax rule's, and each format's
GEMV/GEMM through a compiled plan against the interpreter."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import luminal as lm
from luminal.loaders import lowp

RNG = np.random.default_rng(8)
ELEMENTS = [
    (lowp.E4M3, ml_dtypes.float8_e4m3fn),
    (lowp.E5M2, ml_dtypes.float8_e5m2),
    (lowp.E2M1, ml_dtypes.float4_e2m1fn),
]
# max error relative to the row amax on normal data (mxfp8: OCP MX saturates a block amax
# past 448 times its scale, up to 1/8)
TOL = {"fp8_e4m3": 0.07, "fp8_e5m2": 0.13, "fp8_e4m3_tensor": 0.07, "fp8_e5m2_tensor": 0.13,
       "int8": 0.005, "mxfp8": 0.13, "mxfp4": 0.26, "nvfp4": 0.2, "bf16": 0.005,
       "f16": 0.001}  # fmt: skip


def _weights(rows: int, cols: int) -> np.ndarray:
    # rows of very different magnitudes: per-row and per-block scales matter
    x = RNG.normal(size=(rows, cols)) * np.exp(RNG.normal(size=(rows, 1)) * 2)
    return x.astype(np.float32)


@pytest.mark.parametrize("et,md", ELEMENTS, ids=lambda v: getattr(v, "name", ""))
def test_element_codes_and_rounding_match_ml_dtypes(et: lowp.SmallFloat, md: type) -> None:
    codes = np.arange(1 << et.bits, dtype=np.uint8)
    np.testing.assert_array_equal(np.asarray(et.table, np.float32),
                                  codes.view(md).astype(np.float32))  # fmt: skip
    vals = np.unique([v for v in et.table if np.isfinite(v)])
    ties = ((vals[1:] + vals[:-1]) / 2).astype(np.float32)  # exact midpoints: ties to even
    x = np.concatenate([RNG.normal(size=4000).astype(np.float32) * et.max_finite / 8, ties])
    x = x[np.abs(x) <= et.max_finite]
    np.testing.assert_array_equal(et.round(x).astype(np.float32), x.astype(md).astype(np.float32))
    got = np.asarray(et.table, np.float32)[et.encode(x)]
    np.testing.assert_array_equal(got, et.round(x).astype(np.float32))
    # f64 inputs: the same values, and a hair off a tie the nearer neighbour
    np.testing.assert_array_equal(et.round(x.astype(np.float64)), et.round(x))
    t64 = ties.astype(np.float64)
    np.testing.assert_array_equal(et.round(np.nextafter(t64, np.inf)), vals[1:])
    np.testing.assert_array_equal(et.round(np.nextafter(t64, -np.inf)), vals[:-1])
    # saturating: past the largest finite value is the largest finite value
    big = np.asarray([et.max_finite * 1.5, -et.max_finite * 4], np.float32)
    np.testing.assert_array_equal(et.round(big), [et.max_finite, -et.max_finite])


@pytest.mark.parametrize("scales", lowp.SCALES)
@pytest.mark.parametrize("fmt", list(lowp.FORMATS))
def test_round_trip_against_reference_quantizer(fmt: str, scales: str) -> None:
    f = lowp.FORMATS[fmt]
    rows, cols = 7, 64 * 3
    x = _weights(rows, cols)
    x[2] = 0.0  # an all-zero row
    parts = f.quantize(x, scales)
    lowp.check_parts(f, parts, (rows, cols), fmt)
    ref = f.dequantize(parts)
    np.testing.assert_array_equal(lowp.dequantize(fmt, parts, (rows, cols)), ref)
    again = f.quantize(ref, scales)  # the quantized values are fixed points: same bytes
    for k in parts:
        np.testing.assert_array_equal(again[k], parts[k], err_msg=k)
    assert not ref[2].any()
    amax = np.abs(x).max(axis=1, keepdims=True)
    assert (np.abs(ref - x) <= TOL[fmt] * amax + 1e-30).all()


def test_mx_and_nvfp4_spec_examples() -> None:
    # OCP MX: shared exponent floor(log2(amax)) - emax_elem; mxfp4 block amax 6 -> scale 1
    x = np.zeros((1, 32), np.float32)
    x[0, :4] = [6.0, -0.25, 0.75, 2.5]
    b = lowp.FORMATS["mxfp4"].quantize(x, "amax")["blocks"]
    assert b[0, 0] == 127
    codes = lowp._unpack_nibbles(b[:, 1:])[0, :4]
    # 6 -> 0b0111; -0.25 ties 0/0.5 -> -0 (even); 0.75 ties 0.5/1 -> 1 (even); 2.5 -> 2 (even)
    assert codes.tolist() == [0b0111, 0b1000, 0b0010, 0b0100]
    # mxfp8: amax 1.0 -> e = 0 - 8 + 127
    e = lowp.FORMATS["mxfp8"].quantize(np.ones((1, 32), np.float32), "amax")["e"]
    assert e.tolist() == [[119]]
    # nvfp4: tensor scale amax / (6 * 448); a block's scale amax / 6 in e4m3
    y = np.zeros((1, 64), np.float32)
    y[0, 0], y[0, 16] = 2688.0, 6.0
    p = lowp.FORMATS["nvfp4"].quantize(y, "amax")
    assert p["scale"].tolist() == [[1.0]]
    assert p["blocks"][0, :2].tolist() == [0x7E, 0x38]  # e4m3 448 and 1.0
    np.testing.assert_array_equal(lowp.FORMATS["nvfp4"].dequantize(p), y)


def test_mse_scales_examples() -> None:
    # mxfp4: amax 7.5 saturates to 6 under the rule's scale 1; scale 2 holds it as 8
    x = np.zeros((1, 32), np.float32)
    x[0, :2] = [7.5, 1.0]
    f = lowp.FORMATS["mxfp4"]
    assert f.quantize(x, "amax")["blocks"][0, 0] == 127
    b = f.quantize(x)["blocks"]
    assert b[0, 0] == 128
    np.testing.assert_array_equal(f.dequantize({"blocks": b})[0, :2], [8.0, 1.0])
    # nvfp4 (tensor scale 1): the rule's block scale for [2, 1.75] is e4m3(2 / 6) = 0.34375,
    # giving 2.0625 twice; one code down, 0.3125, gives 1.875 twice
    y = np.zeros((1, 64), np.float32)
    y[0, 0], y[0, 16:18] = 2688.0, [2.0, 1.75]
    g = lowp.FORMATS["nvfp4"]
    assert g.quantize(y, "amax")["blocks"][0, 1] == 0x2B
    p = g.quantize(y)
    assert p["scale"].tolist() == [[1.0]] and p["blocks"][0, :2].tolist() == [0x7E, 0x2A]
    np.testing.assert_array_equal(g.dequantize(p)[0, 16:18], [1.875, 1.875])
    # int8: values on a grid of step 0.9 / 127 but for an amax of 0.92: clipping that one
    # lets the scale land near the grid's step
    z = (np.arange(-127, 128) * (0.9 / 127)).astype(np.float32)[None]
    z[0, -1] = 0.92
    q = lowp.FORMATS["int8"]
    pa, pm = q.quantize(z, "amax"), q.quantize(z)
    assert pm["scale"][0, 0] < pa["scale"][0, 0]
    assert np.square(q.dequantize(pm) - z).sum() < np.square(q.dequantize(pa) - z).sum() / 2


def test_blocks_agree_with_gguf() -> None:
    gguf = pytest.importorskip("gguf")
    x = _weights(9, 256)
    mine = lowp.FORMATS["mxfp4"].quantize(x, "amax")  # the OCP rule, as gguf's quantizer
    theirs = gguf.quants.quantize(x, gguf.GGMLQuantizationType.MXFP4)
    # the same scales and codes, except that a negative value rounding to zero is -0 here
    # (ties-to-even keeps the sign) where gguf writes +0
    m, t = mine["blocks"].reshape(-1, 17), theirs.reshape(-1, 17)
    np.testing.assert_array_equal(m[:, 0], t[:, 0])
    mc, tc = lowp._unpack_nibbles(m[:, 1:]), lowp._unpack_nibbles(t[:, 1:])
    np.testing.assert_array_equal(np.where(mc == 8, 0, mc), tc)
    ref = gguf.quants.dequantize(mine["blocks"], gguf.GGMLQuantizationType.MXFP4)
    np.testing.assert_array_equal(ref, lowp.FORMATS["mxfp4"].dequantize(mine))
    p = lowp.FORMATS["nvfp4"].quantize(x)
    ref = gguf.quants.dequantize(p["blocks"], gguf.GGMLQuantizationType.NVFP4) * p["scale"]
    np.testing.assert_array_equal(ref, lowp.FORMATS["nvfp4"].dequantize(p))


# values sharing a scale: per row (None), per tensor (0) or per block
GROUP = {"fp8_e4m3": None, "fp8_e5m2": None, "fp8_e4m3_tensor": 0, "fp8_e5m2_tensor": 0,
         "int8": None, "mxfp8": 32, "mxfp4": 32, "nvfp4": 16}  # fmt: skip


def _heavy_tailed(rows: int, cols: int) -> np.ndarray:
    x = RNG.standard_t(2, size=(rows, cols)) * np.exp(RNG.normal(size=(rows, 1)))
    x[RNG.random((rows, cols)) < 0.002] *= 50  # rare outliers on top
    return x.astype(np.float32)


@pytest.mark.parametrize("data", ["normal", "heavy"])
@pytest.mark.parametrize("fmt", list(GROUP))
def test_mse_scales_never_worse_than_amax(fmt: str, data: str) -> None:
    f = lowp.FORMATS[fmt]
    x = (_weights if data == "normal" else _heavy_tailed)(40, 64 * 6)
    g = GROUP[fmt]
    group = x.shape[1] if g is None else x.size if g == 0 else g

    def errors(scales: str) -> np.ndarray:
        r = f.dequantize(f.quantize(x, scales)).astype(np.float64) - x
        return np.square(r).reshape(-1, group).sum(axis=1)

    amax, mse = errors("amax"), errors("mse")
    assert (mse <= amax * (1 + 1e-12)).all()  # up to the order of the f64 sums
    if data == "normal" and GROUP[fmt] != 0:  # (one scale for a tensor, or an outlier 50x
        assert mse.sum() < amax.sum()  # the rest, may well keep the amax rule's)


@pytest.mark.parametrize("fmt", list(GROUP))
def test_importance_weighted_scales(fmt: str) -> None:
    """With column importances (calibration's input mean squares), ``mse`` keeps per row or
    block the candidate of least weighted error: never above the unweighted choice's weighted
    error, below it in sum, and the same bytes with equal importances."""
    f = lowp.FORMATS[fmt]
    x = _weights(40, 64 * 6)
    imp = np.exp(RNG.normal(size=x.shape[1]) * 1.5)  # a few columns far louder than others
    g = GROUP[fmt]
    group = x.shape[1] if g is None else x.size if g == 0 else g

    def errors(parts: dict[str, np.ndarray]) -> np.ndarray:
        r = f.dequantize(parts).astype(np.float64) - x
        return (np.square(r) * imp).reshape(-1, group).sum(axis=1)

    plain, weighted = errors(f.quantize(x)), errors(f.quantize(x, "mse", imp))
    assert (weighted <= plain * (1 + 1e-12)).all()
    if g != 0 and fmt != "mxfp8":  # (one tensor scale; mxfp8's e +- 1 seldom win on normal data)
        assert weighted.sum() < plain.sum()
    flat = f.quantize(x, "mse", np.full(x.shape[1], 3.0))
    assert all(flat[k].tobytes() == v.tobytes() for k, v in f.quantize(x).items())
    with pytest.raises(ValueError, match="importance"):
        f.quantize(x, "mse", imp[:-1])


def test_every_format_gemv_and_gemm_compiled_against_interp() -> None:
    """One plan: each format's weight (bit-exact) and x @ W.T for a 1-row (GEMV) and a
    5-row (GEMM) x at odd sizes, against the interpreter."""
    g = lm.Graph("lowp_formats")
    n = lm.dim("n", 1, 16)
    refs, xs = {}, {}
    for k, fmt in enumerate(lowp.FORMATS):
        f = lowp.FORMATS[fmt]
        rows, cols = 5 + 2 * (k % 3), 64 * (1 + k % 3)
        parts = f.quantize(_weights(rows, cols))
        refs[fmt] = f.dequantize(parts)
        w = lowp.weight(g, f"w{k}", fmt, parts, (rows, cols))
        g.output(f"w_{fmt}", w)
        g.output(f"y_{fmt}", g.input(f"x{k}", (n, cols)) @ w.T)
        xs[f"x{k}"] = RNG.normal(size=(5, cols)).astype(np.float32)
    cg = lm.compile(g)
    for m in (1, 5):
        ins = {k: v[:m] for k, v in xs.items()}
        got, want = cg.run(ins), g.run(ins)
        for fmt in lowp.FORMATS:
            np.testing.assert_array_equal(got[f"w_{fmt}"], refs[fmt], err_msg=fmt)
            y, r = got[f"y_{fmt}"], want[f"y_{fmt}"]
            np.testing.assert_allclose(y, r, rtol=1e-5, atol=1e-5 * np.abs(r).max(), err_msg=fmt)


@pytest.mark.parametrize("fmt", ["fp8_e5m2_tensor", "int8", "mxfp8", "nvfp4"])
def test_rows_gather_then_dequantize(fmt: str) -> None:
    f = lowp.FORMATS[fmt]
    parts = f.quantize(_weights(11, 128))
    full = f.dequantize(parts)
    g = lm.Graph("rows")
    idx = g.input("idx", (lm.dim("n", 1, 16),), lm.i32)
    g.output("y", lowp.rows(g, "w", fmt, parts, (11, 128), idx))
    for pick in ([3], [10, 0, 4, 4]):
        np.testing.assert_array_equal(g.run({"idx": np.asarray(pick, np.int32)})["y"], full[pick])


def test_bad_inputs_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="not a multiple of the mxfp4 block"):
        lowp.FORMATS["mxfp4"].quantize(np.ones((2, 48), np.float32))
    with pytest.raises(ValueError, match="NaN or infinite"):
        lowp.FORMATS["int8"].quantize(np.asarray([[1.0, np.nan]], np.float32))
    with pytest.raises(ValueError, match="2-D"):
        lowp.FORMATS["fp8_e4m3"].quantize(np.ones(4, np.float32))
    with pytest.raises(ValueError, match="nvfp4: scales must be one of mse, amax, got 'max'"):
        lowp.FORMATS["nvfp4"].quantize(np.ones((1, 64), np.float32), "max")
    with pytest.raises(ValueError, match="unknown low-precision format 'fp3'"):
        lowp.get("fp3")
    parts = lowp.FORMATS["int8"].quantize(np.ones((3, 8), np.float32))
    bad = {"q": np.zeros((4, 8), np.int8), "scale": parts["scale"]}
    with pytest.raises(ValueError, match=r"'scale' is float32\[3, 1\], needs float32\[4, 1\]"):
        lowp.weight(lm.Graph(), "w", "int8", bad, (4, 8))
    with pytest.raises(ValueError, match="needs a part 'scale'"):
        lowp.weight(lm.Graph(), "w", "int8", {"q": parts["q"]}, (3, 8))
