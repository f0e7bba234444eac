"""Weight loaders: safetensors (own parser, mapped, bf16, bad files) and GGUF (block
quantizations as graph expressions checked against ``gguf.quants.dequantize``, bad files,
unsupported types and architectures)."""

from __future__ import annotations

import json
import os

import ml_dtypes
import numpy as np
import pytest

import luminal as lm
from luminal.loaders.safetensors import (
    SafetensorsError,
    SafetensorsFile,
    load_safetensors,
    save_safetensors,
)

RNG = np.random.default_rng(0)


# ----------------------------------------------------------------------------- safetensors
def test_safetensors_roundtrip_is_mapped(tmp_path) -> None:
    arrays = {
        "a": RNG.normal(size=(3, 50)).astype(np.float32),
        "b": RNG.normal(size=(7,)).astype(ml_dtypes.bfloat16),
        "c": RNG.integers(-5, 5, size=(2, 3, 4)).astype(np.int64),
        "d": RNG.normal(size=(783,)).astype(np.float16),
        "e": np.zeros((0, 4), np.float32),
        "f": np.array(True),
    }
    p = tmp_path / "w.safetensors"
    save_safetensors(p, arrays, {"format": "pt"})
    f = SafetensorsFile(p)
    assert f.metadata == {"format": "pt"} and sorted(f.keys()) == sorted(arrays)
    for k, v in arrays.items():
        got = f[k]
        assert got.dtype == v.dtype and got.shape == v.shape
        np.testing.assert_array_equal(got, v)
    a = f["a"]
    assert not a.flags.owndata and not a.flags.writeable  # a view of the mapping, no copy
    assert sorted(load_safetensors(p)) == sorted(arrays)


def test_safetensors_matches_reference_writer(tmp_path) -> None:
    st = pytest.importorskip("safetensors.numpy")
    arrays = {"x": RNG.normal(size=(4, 5)).astype(np.float32), "y": np.arange(6, dtype=np.int32)}
    p = tmp_path / "ref.safetensors"
    st.save_file(arrays, str(p))
    f = SafetensorsFile(p)
    for k, v in arrays.items():
        np.testing.assert_array_equal(f[k], v)


def _write_raw(p, header: bytes, data: bytes = b"", n: int | None = None) -> None:
    with open(p, "wb") as fh:
        fh.write((len(header) if n is None else n).to_bytes(8, "little") + header + data)


@pytest.mark.parametrize(
    "header,data,n,match",
    [
        (b"", b"", None, "8-byte header length"),  # shorter than the length field: written below
        (b'{"a": 1}', b"", 1 << 40, "header length"),
        (b"{not json", b"", None, "not valid JSON"),
        (b"[1, 2]", b"", None, "JSON object"),
        (
            b'{"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}',
            b"\0" * 8,
            None,
            "outside",
        ),
        (
            b'{"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}}',
            b"\0" * 16,
            None,
            "needs 12",
        ),
        (
            b'{"a": {"dtype": "Q9", "shape": [4], "data_offsets": [0, 4]}}',
            b"\0" * 4,
            None,
            "unknown dtype",
        ),
        (b'{"a": {"dtype": "F32", "shape": [4]}}', b"", None, "data_offsets"),
    ],
)
def test_safetensors_bad_files(
    tmp_path, header: bytes, data: bytes, n: int | None, match: str
) -> None:
    p = tmp_path / "bad.safetensors"
    if not header:
        p.write_bytes(b"\x01\x02")
    else:
        _write_raw(p, header, data, n)
    with pytest.raises(SafetensorsError, match=match):
        SafetensorsFile(p)


def test_safetensors_truncated_real_file(tmp_path) -> None:
    p = tmp_path / "w.safetensors"
    save_safetensors(p, {"w": RNG.normal(size=(64, 64)).astype(np.float32)})
    raw = p.read_bytes()
    (tmp_path / "t.safetensors").write_bytes(raw[: len(raw) - 100])
    with pytest.raises(SafetensorsError, match="truncated"):
        SafetensorsFile(tmp_path / "t.safetensors")


# ----------------------------------------------------------------------------- GGUF quants
gguf = pytest.importorskip("gguf")
from luminal.loaders import quants  # noqa: E402
from luminal.loaders.gguf import GGUFError, GGUFFile, GGUFWeights  # noqa: E402

# byte offsets of the f16 fields of each block (kept finite in random blocks)
_F16_FIELDS = {"Q4_0": [0], "Q4_1": [0, 2], "Q8_0": [0], "Q4_K": [0, 2], "Q6_K": [208]}


def _random_blocks(fmt: str, rows: int, cols: int) -> np.ndarray:
    f = quants.FORMATS[fmt]
    nb = rows * cols // f.block
    raw = RNG.integers(0, 256, size=(nb, f.type_size), dtype=np.uint8)
    for o in _F16_FIELDS[fmt]:
        raw[:, o : o + 2] = (
            RNG.uniform(-2, 2, size=nb).astype(np.float16).view(np.uint8).reshape(nb, 2)
        )
    return raw


@pytest.mark.parametrize("fmt", ["Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K"])
def test_dequant_expression_matches_gguf_on_random_blocks(fmt: str) -> None:
    """Every bit of every field: random bytes are valid blocks of all five formats."""
    f = quants.FORMATS[fmt]
    rows, cols = 3, f.block * 3
    raw = _random_blocks(fmt, rows, cols)
    ref = gguf.quants.dequantize(raw.reshape(rows, -1), gguf.GGMLQuantizationType[fmt]).reshape(
        rows, cols
    )
    np.testing.assert_array_equal(quants.dequantize(fmt, raw, (rows, cols)), ref)


@pytest.mark.parametrize("fmt", ["Q4_0", "Q8_0", "Q6_K"])
def test_quantized_rows_gather_then_dequantize(fmt: str) -> None:
    f = quants.FORMATS[fmt]
    rows, cols = 50, f.block * 2
    raw = _random_blocks(fmt, rows, cols)
    full = quants.dequantize(fmt, raw, (rows, cols))
    g = lm.Graph("rows")
    idx = g.input("idx", (lm.dim("n", 1, 64),), lm.i32)
    g.output("y", quants.quantized_rows(g, "w", fmt, raw, (rows, cols), idx))
    for pick in ([3], [49, 0, 7, 7], list(range(50))):
        got = g.run({"idx": np.asarray(pick, np.int32)})["y"]
        np.testing.assert_array_equal(got, full[pick])


def test_unsupported_quant_format_is_a_clear_error() -> None:
    with pytest.raises(NotImplementedError, match="TQ2_0 is not supported"):
        quants.quantized_weight(lm.Graph(), "w", "TQ2_0", np.zeros(66, np.uint8), (1, 256))
    with pytest.raises(ValueError, match="not a multiple"):
        quants.quantized_weight(lm.Graph(), "w", "Q4_0", np.zeros(18, np.uint8), (1, 31))


def _smollm2_path() -> str:
    from luminal.models import smollm2_path

    try:
        return smollm2_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))


def test_smollm2_real_tensors_dequantize_exactly() -> None:
    f = GGUFFile(_smollm2_path())
    assert f.architecture == "llama" and f.arch_key("block_count") == 30
    for name in ("blk.0.attn_k.weight", "blk.7.ffn_down.weight", "blk.29.attn_v.weight"):
        assert f.type_name(name) in ("Q4_1", "Q8_0")
        got = quants.dequantize(f.type_name(name), f.raw(name), f.shape(name))
        np.testing.assert_array_equal(got, f.dequantize(name))
    # the Q8_0 embedding: a few rows through GATHER + dequant (the whole table is 28M values)
    g = lm.Graph("emb")
    w = GGUFWeights(f)
    g.output("y", w.rows(g, "token_embd.weight", g.tensor(np.asarray([0, 504, 49151], np.int32))))
    t = f.tensors["token_embd.weight"]
    ref = gguf.quants.dequantize(t.data[[0, 504, 49151]], t.tensor_type)
    np.testing.assert_array_equal(g.run()["y"], ref)
    assert g.inputs["token_embd.weight#i8"].shape == (49152, 18 * 34 // 1)  # raw blocks, mapped


@pytest.mark.slow
def test_k_quants_from_llama_cpp_and_unsupported_types(tmp_path) -> None:
    """Requantize SmolLM2 to Q4_K_M with llama.cpp: real Q4_K, Q6_K and Q5_0 tensors match
    gguf's dequantization."""
    llama_cpp = pytest.importorskip("llama_cpp")
    import ctypes

    out = tmp_path / "q4km.gguf"
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype, p.allow_requantize, p.nthread = 15, True, 2  # LLAMA_FTYPE_MOSTLY_Q4_K_M
    assert (
        llama_cpp.llama_model_quantize(_smollm2_path().encode(), str(out).encode(), ctypes.byref(p))
        == 0
    )
    f = GGUFFile(out)
    seen = set()
    for name in f.tensors:
        kind = f.type_name(name)
        if kind in ("Q4_K", "Q6_K", "Q5_0") and kind not in seen:
            seen.add(kind)
            got = quants.dequantize(kind, f.raw(name), f.shape(name))
            np.testing.assert_array_equal(got, f.dequantize(name))
    assert seen == {"Q4_K", "Q6_K", "Q5_0"}
    GGUFWeights(f)  # every tensor type of the file is supported


# ----------------------------------------------------------------------------- bad GGUF files
def _write_gguf(path: str, arch: str = "llama", qtype: str = "Q8_0", cols: int = 64) -> None:
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(1)
    data = RNG.normal(size=(4, cols)).astype(np.float32)
    q = gguf.GGMLQuantizationType[qtype]
    w.add_tensor("blk.0.attn_q.weight", gguf.quants.quantize(data, q), raw_dtype=q)
    w.add_tensor("output_norm.weight", np.ones(64, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_gguf_small_file_roundtrip(tmp_path) -> None:
    p = str(tmp_path / "m.gguf")
    _write_gguf(p)
    f = GGUFFile(p)
    assert f.shape("blk.0.attn_q.weight") == (4, 64) and f.arch_key("block_count") == 1
    g = lm.Graph()
    g.output("y", GGUFWeights(f).get(g, "blk.0.attn_q.weight"))
    np.testing.assert_array_equal(g.run()["y"], f.dequantize("blk.0.attn_q.weight"))


@pytest.mark.parametrize("keep", [0.999, 0.6, 0.1])
def test_truncated_gguf_is_a_clear_error(tmp_path, keep: float) -> None:
    p = str(tmp_path / "m.gguf")
    _write_gguf(p)
    raw = open(p, "rb").read()
    t = tmp_path / "t.gguf"
    t.write_bytes(raw[: int(len(raw) * keep)])
    with pytest.raises(GGUFError, match="truncated|corrupt"):
        GGUFFile(t)


def test_not_a_gguf_file(tmp_path) -> None:
    p = tmp_path / "x.gguf"
    p.write_bytes(json.dumps({"hello": 1}).encode())
    with pytest.raises(GGUFError, match="not a GGUF file"):
        GGUFFile(p)


def test_unsupported_type_and_architecture(tmp_path) -> None:
    from luminal.models import config_from_gguf

    p = str(tmp_path / "tq2.gguf")
    _write_gguf(p, qtype="TQ2_0", cols=256)
    with pytest.raises(GGUFError, match="TQ2_0"):
        GGUFWeights(GGUFFile(p))
    p2 = str(tmp_path / "mamba.gguf")
    _write_gguf(p2, arch="mamba")
    with pytest.raises(NotImplementedError, match="architecture 'mamba'"):
        config_from_gguf(GGUFFile(p2))
    assert os.path.exists(p2)
