"""GGUF block formats added for low-precision models (Q5_0, Q5_1, Q2_K, Q3_K, Q5_K, IQ4_NL,
IQ4_XS, MXFP4, NVFP4; F16/BF16 cast to f32): the graph expressions are bit-exact against
``gguf.quants.dequantize`` on random blocks, through the interpreter and through a compiled
plan, and GGUF files written with the ``gguf`` package load through ``GGUFWeights``."""

from __future__ import annotations

import numpy as np
import pytest

import luminal as lm
from luminal.loaders import quants

gguf = pytest.importorskip("gguf")
from luminal.loaders.gguf import GGUFFile, GGUFWeights  # noqa: E402

RNG = np.random.default_rng(18)
# byte offsets of each block's f16 fields (kept finite in random blocks)
F16_FIELDS = {
    "Q5_0": [0], "Q5_1": [0, 2], "Q2_K": [80, 82], "Q3_K": [108], "Q5_K": [0, 2],
    "IQ4_NL": [0], "IQ4_XS": [0], "MXFP4": [], "NVFP4": [],
}  # fmt: skip
NEW = list(F16_FIELDS)


def random_blocks(fmt: str, rows: int, cols: int, finite: bool = False) -> np.ndarray:
    """Random bytes: every bit pattern of every field is a valid block. ``finite`` keeps the
    MXFP4/NVFP4 scales in a range where no value overflows (for matmuls)."""
    f = quants.FORMATS[fmt]
    nb = rows * cols // f.block
    raw = RNG.integers(0, 256, size=(nb, f.type_size), dtype=np.uint8)
    for o in F16_FIELDS[fmt]:
        raw[:, o : o + 2] = RNG.uniform(-2, 2, nb).astype(np.float16).view(np.uint8).reshape(nb, 2)
    if finite and fmt == "MXFP4":
        raw[:, 0] = RNG.integers(118, 136, nb)
    if finite and fmt == "NVFP4":
        raw[:, :4] = RNG.integers(0, 0x7F, (nb, 4))
    return raw


def reference(fmt: str, raw: np.ndarray, rows: int, cols: int) -> np.ndarray:
    q = gguf.GGMLQuantizationType[fmt]
    return gguf.quants.dequantize(raw.reshape(rows, -1), q).reshape(rows, cols)


@pytest.mark.parametrize("fmt", NEW)
def test_expression_is_bit_exact_on_random_blocks(fmt: str) -> None:
    f = quants.FORMATS[fmt]
    rows, cols = 3, f.block * 3
    raw = random_blocks(fmt, rows, cols)
    got = quants.dequantize(fmt, raw, (rows, cols))
    np.testing.assert_array_equal(got, reference(fmt, raw, rows, cols))


def test_compiled_plan_is_bit_exact_and_gemv_matches_interp() -> None:
    """One plan holds every new format: the dequantized weights are bit-exact against gguf,
    and x @ W.T (odd sizes, a symbolic row count) matches the interpreter."""
    g = lm.Graph("gguf_new_formats")
    n = lm.dim("n", 1, 8)
    refs, xs = {}, {}
    for k, fmt in enumerate(NEW):
        f = quants.FORMATS[fmt]
        rows, cols = 5 + k % 3, f.block * (1 + k % 3)
        raw = random_blocks(fmt, rows, cols, finite=True)
        refs[fmt] = reference(fmt, raw, rows, cols)
        w = quants.quantized_weight(g, f"w{k}", fmt, raw, (rows, cols))
        x = g.input(f"x{k}", (n, cols))
        xs[f"x{k}"] = RNG.normal(size=(3, cols)).astype(np.float32)
        g.output(f"w_{fmt}", w)
        g.output(f"y_{fmt}", x @ w.T)
    cg = lm.compile(g)
    got, want = cg.run(xs), g.run(xs)
    for fmt in NEW:
        np.testing.assert_array_equal(got[f"w_{fmt}"], refs[fmt], err_msg=fmt)
        np.testing.assert_allclose(got[f"y_{fmt}"], want[f"y_{fmt}"], rtol=2e-5, atol=1e-5 *
                                   np.abs(want[f"y_{fmt}"]).max(), err_msg=fmt)  # fmt: skip


@pytest.mark.parametrize("fmt", ["Q5_1", "IQ4_XS", "NVFP4"])
def test_rows_gather_then_dequantize(fmt: str) -> None:
    f = quants.FORMATS[fmt]
    rows, cols = 7, f.block * 2
    raw = random_blocks(fmt, rows, cols)
    full = reference(fmt, raw, rows, cols)
    g = lm.Graph("rows")
    idx = g.input("idx", (lm.dim("n", 1, 16),), lm.i32)
    g.output("y", quants.quantized_rows(g, "w", fmt, raw, (rows, cols), idx))
    for pick in ([3], [6, 0, 2, 2]):
        got = g.run({"idx": np.asarray(pick, np.int32)})["y"]
        np.testing.assert_array_equal(got, full[pick])


@pytest.mark.parametrize("qtype", ["Q5_0", "Q5_1", "MXFP4", "BF16", "F16"])
def test_gguf_file_written_by_gguf_loads(tmp_path, qtype: str) -> None:
    """Types the ``gguf`` package can write: a file with one (rows, 96) tensor loads with the
    values gguf dequantizes, as an f32 tensor (F16/BF16 are cast in the graph)."""
    p = str(tmp_path / f"{qtype}.gguf")
    w = gguf.GGUFWriter(p, "llama")
    data = RNG.normal(size=(5, 96)).astype(np.float32)
    q = gguf.GGMLQuantizationType[qtype]
    w.add_tensor("blk.0.attn_q.weight", gguf.quants.quantize(data, q), raw_dtype=q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    f = GGUFFile(p)
    g = lm.Graph()
    src = GGUFWeights(f)
    t = src.get(g, "blk.0.attn_q.weight")
    assert t.dtype is lm.f32 and t.shape == (5, 96)
    g.output("y", t)
    ref = f.dequantize("blk.0.attn_q.weight")
    g.output("r", src.rows(g, "blk.0.attn_q.weight", g.tensor(np.int32([4, 0]))))
    out = g.run()
    np.testing.assert_array_equal(out["y"], ref)
    np.testing.assert_array_equal(out["r"], ref[[4, 0]])
    tol = 0.01 if qtype in ("BF16", "F16") else 0.2  # a 4-bit grid's half step at the top
    assert np.abs(ref - data).max() < tol * np.abs(data).max()


def test_dict_weights_cast_half_types_to_f32() -> None:
    import ml_dtypes

    from luminal.models.base import DictWeights

    a = RNG.normal(size=(3, 5)).astype(np.float32)
    src = DictWeights({"h": a.astype(np.float16), "b": a.astype(ml_dtypes.bfloat16)})
    g = lm.Graph()
    for name in ("h", "b"):
        t = src.get(g, name)
        assert t.dtype is lm.f32
        g.output(name, t)
    out = g.run()
    np.testing.assert_array_equal(out["h"], a.astype(np.float16).astype(np.float32))
    np.testing.assert_array_equal(out["b"], a.astype(ml_dtypes.bfloat16).astype(np.float32))


def test_block_size_mismatch_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="not a multiple of the Q5_K block"):
        quants.quantized_weight(lm.Graph(), "w", "Q5_K", np.zeros(176, np.uint8), (1, 250))
    with pytest.raises(ValueError, match="bytes for"):
        quants.quantized_weight(lm.Graph(), "w", "MXFP4", np.zeros(16, np.uint8), (1, 32))
