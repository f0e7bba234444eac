"""``luminal.quant.quantize`` and ``luminal quantize``: a tiny random Qwen3 (GGUF F32, written
the way llama.cpp's converter does) requantized to each type loads with ``luminal.models.load``;
the graph expressions give the logits of the numpy reference dequantization, close to
transformers; metadata is copied; the CLI's errors name what was wrong. Slow tier: SmolLM2
requantized, llama.cpp runs the GGUF types and refuses luminal's own."""

from __future__ import annotations

import json

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
pytest.importorskip("transformers")

import luminal as lm  # noqa: E402
from luminal import quant  # noqa: E402
from luminal.loaders.gguf import GGUFError, GGUFFile  # noqa: E402
from luminal.models import load  # noqa: E402
from luminal.quant import cli  # noqa: E402
from test_zoo_decoders import (  # noqa: E402
    PROMPT,
    _rel,
    fast_compile,  # noqa: F401
    hf_logits,
    make_hf,
    needs_compiled,
)
from test_zoo_gguf import write_gguf  # noqa: E402

# logits' max error relative to transformers' f32 (a random model: no structure to protect)
TOL = {"q8_0": 0.03, "mxfp4": 0.5, "bf16": 0.02, "fp8_e4m3": 0.1, "fp8_e5m2_tensor": 0.2,
       "int8": 0.03, "mxfp8": 0.15, "nvfp4": 0.4, "f16": 0.002}  # fmt: skip


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, np.ndarray]:
    d = tmp_path_factory.mktemp("tiny")
    hf = make_hf("qwen3", d / "hf")
    path = str(d / "f32.gguf")
    write_gguf(hf, "qwen3", path)
    return path, hf_logits(hf, PROMPT)[-1]


@pytest.mark.parametrize("qtype", list(TOL))
def test_requantized_model_runs_the_reference_values(tiny, tmp_path, qtype: str) -> None:
    src, want = tiny
    out = tmp_path / f"{qtype}.gguf"
    res = quant.quantize(src, out, qtype)
    f = GGUFFile(out)
    assert f.architecture == "qwen3" and f.arch_key("block_count") == 2  # metadata copied
    assert res.size == out.stat().st_size
    assert res.stored["blk.0.attn_norm.weight"] == "F32"  # vectors stay f32
    # ffn_down and attn_output rows are 96 long: not whole nvfp4 blocks (64), kept f32
    odd = [n for n in GGUFFile(src).tensors if n.endswith(("ffn_down.weight", "output.weight"))
           and n.startswith("blk.")]  # fmt: skip
    assert sorted(res.kept_f32) == (sorted(odd) if qtype == "nvfp4" else [])
    assert len(odd) == 4
    stored = set(res.stored.values()) - {"F32"}
    assert stored == ({qtype.upper()} if quant.llama_cpp_reads(qtype) else {qtype})
    assert ("blk.0.attn_q.weight" in f.tensors) == quant.llama_cpp_reads(qtype)
    ref = load(out, backend="interp", dequant="load")  # numpy reference values
    s = load(out, backend="interp")  # graph expressions over the packed bytes
    got = s.forward(PROMPT)
    assert _rel(got, ref.forward(PROMPT)) <= 1e-5
    assert _rel(got, want) <= TOL[qtype]


@pytest.mark.parametrize("qtype", ["nvfp4", pytest.param("fp8_e4m3", marks=pytest.mark.slow),
                                   pytest.param("mxfp4", marks=pytest.mark.slow)])  # fmt: skip
@pytest.mark.usefixtures("fast_compile")
@needs_compiled
def test_compiled_requantized_model_matches_interp(tiny, tmp_path, qtype: str) -> None:
    src, _ = tiny
    out = tmp_path / f"{qtype}.gguf"
    quant.quantize(src, out, qtype)
    ref = load(out, backend="interp", max_context=32)
    s = load(out, backend="compiled", max_context=32)
    want = [ref.forward(PROMPT[:5])] + [ref.forward([t]) for t in PROMPT[5:8]]
    got = [s.forward(PROMPT[:5])] + [s.forward([t]) for t in PROMPT[5:8]]
    assert _rel(np.stack(got), np.stack(want)) <= 1e-4


def test_requantizing_a_luminal_file(tiny, tmp_path) -> None:
    src, _ = tiny
    quant.quantize(src, tmp_path / "i8.gguf", "int8")
    res = quant.quantize(tmp_path / "i8.gguf", tmp_path / "q8.gguf", "q8_0")
    f = GGUFFile(tmp_path / "q8.gguf")
    assert f.type_name("blk.0.attn_q.weight") == "Q8_0"
    assert not any(k.startswith("luminal.quant.") for k in f.metadata)
    assert not any(n.endswith((".q", ".scale")) for n in f.tensors)
    assert res.stored["token_embd.weight"] == "Q8_0"


def test_cli(tiny, tmp_path, capsys) -> None:
    src, _ = tiny
    out = str(tmp_path / "o.gguf")
    assert cli.run([src, "-o", out, "--type", "fp8_e4m3", "--json", "-q"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["type"] == "fp8_e4m3"
    assert info["tensors"]["fp8_e4m3"] == 16  # 2 layers x 7 + embedding + head
    assert cli.run([src, "-o", out, "--type", "int8", "-q"]) == 2  # exists
    assert "exists (--force overwrites it)" in capsys.readouterr().err
    assert cli.run([src, "-o", out, "--type", "int8", "-q", "--force"]) == 0
    assert cli.run([str(tmp_path), "-o", out + "2", "--type", "int8"]) == 2
    assert "no config.json" in capsys.readouterr().err  # a folder is read as transformers
    assert cli.run([str(tmp_path / "none.gguf"), "-o", out + "3", "--type", "int8"]) == 2
    assert "no such file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.run([src, "-o", out + "4", "--type", "fp3"])
    # as a subcommand of another parser (how `luminal quantize` wires it)
    import argparse

    top = argparse.ArgumentParser(prog="luminal")
    sub = top.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("quantize")
    cli.add_arguments(q)
    q.set_defaults(fn=cli.main)
    args = top.parse_args(["quantize", src, "-o", out + "6", "--type", "mxfp4", "-q"])
    assert args.fn(args) == 0 and GGUFFile(out + "6").type_name("blk.0.attn_q.weight") == "MXFP4"
    with pytest.raises(ValueError, match="unknown quantization type 'fp3'"):
        quant.quantize(src, out + "5", "fp3")


def test_scales_option_and_weight_error(tiny, tmp_path, capsys) -> None:
    from luminal.loaders import lowp
    from luminal.loaders.gguf import GGUFWeights

    src, _ = tiny
    ws = GGUFWeights(GGUFFile(src), dequant="load")
    x = ws.values("blk.0.attn_q.weight")
    got, err = {}, {}
    for scales in lowp.SCALES:
        out = str(tmp_path / f"{scales}.gguf")
        assert cli.run([src, "-o", out, "--type", "mxfp4", "--scales", scales, "--json"]) == 0
        err[scales] = json.loads(capsys.readouterr().out)["rel_error"]
        got[scales] = GGUFFile(out).raw("blk.0.attn_q.weight").reshape(-1)
        want = lowp.FORMATS["mxfp4"].quantize(x, scales)["blocks"].reshape(-1)
        np.testing.assert_array_equal(got[scales], want)
    assert (got["mse"] != got["amax"]).any()
    assert 0 < err["mse"] < err["amax"] < 0.2
    # the error is over the quantized matrices: sqrt(sum (q - w)^2 / sum w^2)
    res = quant.quantize(src, tmp_path / "q8.gguf", "q8_0")
    q = GGUFWeights(GGUFFile(res.path), dequant="load")
    mats = [n for n in GGUFFile(src).tensors if ws.values(n).ndim == 2]
    e2 = sum(float(np.square(q.values(n).astype(np.float64) - ws.values(n)).sum()) for n in mats)
    w2 = sum(float(np.square(ws.values(n).astype(np.float64)).sum()) for n in mats)
    assert res.error == pytest.approx((e2 / w2) ** 0.5, rel=1e-9)
    assert quant.quantize(src, tmp_path / "f32.gguf", "f32").error is None
    with pytest.raises(ValueError, match="scales must be one of mse, amax, got 'min'"):
        quant.quantize(src, tmp_path / "x.gguf", "int8", scales="min")


def test_damaged_luminal_file_is_a_clear_error(tiny, tmp_path) -> None:
    from luminal.loaders.gguf import GGUFWeights

    src, _ = tiny
    path = str(tmp_path / "bad.gguf")
    w = gguf.GGUFWriter(path, "qwen3")
    w.add_string("luminal.quant.blk.0.attn_q.weight", json.dumps({"format": "int8",
                                                                 "shape": [4, 64]}))  # fmt: skip
    w.add_tensor("blk.0.attn_q.weight.q", np.zeros((4, 64), np.int8))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(GGUFError, match="lacks its part 'blk.0.attn_q.weight.scale'"):
        GGUFWeights(GGUFFile(path))
    bad = [("fp3", [4, 64], "luminal format 'fp3', which this luminal does not know"),
           ("int8", [3, 64], r"part blk.0.attn_q.weight.q has 256 values, not 3 rows"),
           ("int8", "x", "bad metadata")]  # fmt: skip
    for k, (fmt, shape, msg) in enumerate(bad):
        p2 = str(tmp_path / f"bad{k}.gguf")
        w = gguf.GGUFWriter(p2, "qwen3")
        w.add_string("luminal.quant.blk.0.attn_q.weight",
                     json.dumps({"format": fmt, "shape": shape}))  # fmt: skip
        w.add_tensor("blk.0.attn_q.weight.q", np.zeros((4, 64), np.int8))
        w.add_tensor("blk.0.attn_q.weight.scale", np.ones((4, 1), np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        with pytest.raises(GGUFError, match=msg):
            GGUFWeights(GGUFFile(p2)).get(lm.Graph(), "blk.0.attn_q.weight")


@pytest.mark.slow
def test_smollm2_llama_cpp_runs_gguf_types_and_refuses_luminal_ones(tmp_path) -> None:
    llama_cpp = pytest.importorskip("llama_cpp")
    from luminal.models import smollm2_path

    try:
        src = smollm2_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    for qtype, runs in (("mxfp4", True), ("int8", False)):
        out = str(tmp_path / f"{qtype}.gguf")
        quant.quantize(src, out, qtype)
        assert quant.llama_cpp_reads(qtype) == runs
        if runs:
            m = llama_cpp.Llama(out, n_ctx=64, n_threads=2, verbose=False)
            text = m("The capital of France is", max_tokens=4, temperature=0.0)
            assert "Paris" in text["choices"][0]["text"]
        else:
            with pytest.raises((ValueError, RuntimeError)):
                llama_cpp.Llama(out, n_ctx=64, n_threads=2, verbose=False)


def test_embed_type_keeps_embedding_and_head_apart(tiny, tmp_path) -> None:
    src, want = tiny
    out = tmp_path / "mix.gguf"
    res = quant.quantize(src, out, "fp8_e4m3", embed_type="q8_0")
    assert res.stored["token_embd.weight"] == res.stored["output.weight"] == "Q8_0"
    assert res.stored["blk.0.attn_q.weight"] == "fp8_e4m3"
    assert not quant.llama_cpp_reads("fp8_e4m3", "q8_0")
    assert not quant.llama_cpp_reads("q8_0", "int8") and quant.llama_cpp_reads("mxfp4", "q8_0")
    s = load(out, backend="interp")
    ref = load(out, backend="interp", dequant="load")
    assert _rel(s.forward(PROMPT), ref.forward(PROMPT)) <= 1e-5
    with pytest.raises(ValueError, match="llama.cpp's own mix"):
        quant.quantize(src, tmp_path / "x.gguf", "q4_k_m", embed_type="q8_0")
    with pytest.raises(ValueError, match="embed_type 'q6_k' must be one of"):
        quant.quantize(src, tmp_path / "x.gguf", "int8", embed_type="q6_k")


@pytest.mark.slow
def test_llama_cpp_quantizer_types_load_bit_exact(tmp_path) -> None:
    """A type written by llama.cpp's own quantizer (Q5_K_M: Q5_K and Q6_K tensors): luminal
    reads every tensor of the file, and the Q5_K expression equals gguf's dequantization."""
    qtype, kind = "q5_k_m", "Q5_K"
    pytest.importorskip("llama_cpp")
    from luminal.loaders import quants
    from luminal.loaders.gguf import GGUFWeights
    from luminal.models import smollm2_path

    try:
        src = smollm2_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    res = quant.quantize(src, tmp_path / f"{qtype}.gguf", qtype)
    assert kind in res.stored.values()
    f = GGUFFile(res.path)
    GGUFWeights(f)  # every type in the file is supported
    name = next(n for n, t in res.stored.items() if t == kind and n.startswith("blk."))
    got = quants.dequantize(kind, f.raw(name), f.shape(name))
    np.testing.assert_array_equal(got, f.dequantize(name))
