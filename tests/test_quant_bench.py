"""bench/quant.py's pieces without running the model (the run itself takes minutes): argument
handling and the JSON line's keys (``<fmt>_decode_tok_s``, ``<fmt>_top1_agree``, ``<fmt>_kl``,
``calibration``, ``<fmt>_vs_llamacpp``; null where llama.cpp does not read the file)."""

from __future__ import annotations

import importlib.util
import os

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")


def _bench():
    spec = importlib.util.spec_from_file_location("bench_quant", os.path.join(BENCH, "quant.py"))
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # not __main__: no re-exec
    return mod


def test_arguments_and_json_keys(capsys) -> None:
    b = _bench()
    a = b.parse_args(["--quick", "--formats", "int8,mxfp4+q8_0"])
    assert (a.tokens, a.decode, a.formats) == (32, 8, ["int8", "mxfp4+q8_0"])
    assert b.parse_args([]).formats == list(b.DEFAULT_FORMATS)
    row = {"file_mib": 70.0, "decode_tok_s": 100.0, "prefill_tok_s": 900.0, "ppl": 9.5,
           "top1_agree": 0.9, "greedy_agree": 0.5, "compile_s": 3.0}  # fmt: skip
    res = {"threads": 2, "tokens": 32, "quick": True, "formats": {
        "f32": {**row, "llamacpp_decode_tok_s": 50.0, "vs_llamacpp": 2.0},
        "mxfp4": {**row, "llamacpp_decode_tok_s": 80.0, "vs_llamacpp": 1.25},
        "int8": dict(row),
        "nvfp4": {"file_mib": 74.0, "skipped": "failed: boom"},
    }}  # fmt: skip
    flat = b.report(res)
    out = capsys.readouterr().out
    assert "nvfp4" in out and "skipped: failed: boom" in out
    assert flat["mxfp4_decode_tok_s"] == 100.0 and flat["mxfp4_top1_agree"] == 0.9
    assert flat["mxfp4_vs_llamacpp"] == 1.25 and flat["int8_vs_llamacpp"] is None
    assert "nvfp4_decode_tok_s" not in flat and flat["quick"] is True
    assert flat["calibration"] is None and "mxfp4_kl" not in flat
    res["calibration"], res["calib_method"] = "calibration.txt", "awq+gptq"
    res["formats"]["mxfp4"]["kl"] = 0.51234567  # type: ignore[index]
    flat = b.report(res)
    out = capsys.readouterr().out
    assert flat["mxfp4_kl"] == 0.5123 and flat["calibration"] == "calibration.txt"
    assert "calibrated on calibration.txt (awq+gptq)" in out and "0.5123" in out
    assert flat["calib_method"] == "awq+gptq"
    a = b.parse_args(["--calibration", "default"])
    assert os.path.basename(a.calibration) == "calibration.txt" and os.path.isfile(a.calibration)
    assert a.calib_method == "awq+gptq"
    assert b.parse_args(["--calib-method", "awq"]).calib_method == "awq"
    assert b.parse_args(["--calib-tokens", "64"]).calib_tokens == 64
    assert b.parse_args(["--calib-act-order"]).calib_act_order and not a.calib_act_order
    assert a.calib_damp == 0.1 and b.parse_args(["--calib-damp", "0.1"]).calib_damp == 0.1
    with pytest.raises(SystemExit):
        b.parse_args(["--keep-sensitive", "0.2"])  # no calibration text to measure on
    k = b.parse_args(["--calibration", "default", "--keep-sensitive", "0.2", "--keep-type", "bf16"])
    assert (k.keep_sensitive, k.keep_type) == (0.2, "bf16") and a.keep_sensitive == 0.0
    res["keep_sensitive"], res["keep_type"] = 0.2, "q8_0"
    flat = b.report(res)
    assert (flat["keep_sensitive"], flat["keep_type"]) == (0.2, "q8_0")
