"""Calibrated quantization (``luminal.quant.calibrate``): GPTQ on a synthetic layer lowers the
output error below round-to-nearest's for every format with scales, its parts are the format's
own (numpy dequantizer, graph expression, a compiled matmul), the same inputs give the same
bytes; the calibration forward gives luminal's logits and transformers' layer inputs on tiny
Llama / Qwen2 models; ``quantize(calibration=...)`` writes a file luminal runs, with the
calibration recorded; bad input is a clear error. Slow tier: SmolLM2 calibrated."""

from __future__ import annotations

import json

import numpy as np
import pytest

import luminal as lm
from luminal import quant
from luminal.loaders import lowp
from luminal.loaders.gguf import GGUFFile, GGUFWeights
from luminal.quant import calibrate

GRID = [n for n, f in lowp.FORMATS.items() if f.grid is not None]


def _layer(rows: int = 24, cols: int = 256, n: int = 1024, seed: int = 0):
    """Weights and inputs X = Z A with a few large, correlated directions."""
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(cols, cols)) * 0.1
    a[:4] *= 30
    x = (rng.normal(size=(n, cols)) @ a).astype(np.float32)
    w = (rng.normal(size=(rows, cols)) * 0.05).astype(np.float32)
    return w, x, calibrate.inverse_factor(x.T.astype(np.float64) @ x)


def _out_err(x: np.ndarray, w: np.ndarray, q: np.ndarray) -> float:
    return float(np.linalg.norm(x.astype(np.float64) @ (w - q).T.astype(np.float64)))


@pytest.mark.parametrize("scales", lowp.SCALES)
@pytest.mark.parametrize("fmt", GRID)
def test_gptq_beats_round_to_nearest_and_packs_the_format(fmt: str, scales: str) -> None:
    w, x, u = _layer()
    f = lowp.FORMATS[fmt]
    assert f.grid is not None
    parts, q = calibrate.gptq(w, u, f.grid(w, scales))
    lowp.check_parts(f, parts, w.shape, fmt)
    np.testing.assert_array_equal(f.dequantize(parts), q)  # the loop's values are the file's
    np.testing.assert_array_equal(lowp.dequantize(fmt, parts, w.shape), q)  # graph expression
    rtn = f.dequantize(f.quantize(w, scales))
    assert _out_err(x, w, q) < 0.5 * _out_err(x, w, rtn)
    again, _ = calibrate.gptq(w, u, f.grid(w, scales))
    assert all(again[k].tobytes() == parts[k].tobytes() for k in parts)


@pytest.mark.parametrize("fmt", GRID)
def test_act_order(fmt: str) -> None:
    """Columns loudest input first, scales fixed from the weight: the parts are the format's,
    the scales round to nearest's, and the output error below GPTQ's in column order."""
    w, x, u = _layer()
    f = lowp.FORMATS[fmt]
    assert f.grid is not None
    h = x.T.astype(np.float64) @ x
    order = calibrate.act_order(h)
    np.testing.assert_array_equal(np.diag(h)[order], np.sort(np.diag(h))[::-1])
    u = calibrate.inverse_factor(h, 0.01)  # (with 0.1, the default, nvfp4 gains nothing)
    parts, q = calibrate.gptq(w, calibrate.inverse_factor(h[order][:, order], 0.01),
                              f.grid(w, "mse"), order)  # fmt: skip
    np.testing.assert_array_equal(f.dequantize(parts), q)
    rtn = f.quantize(w, "mse")
    for k in {p.name for p in f.parts} - {"q", "blocks"}:  # the scale parts
        np.testing.assert_array_equal(parts[k], rtn[k])
    if fmt in ("mxfp4", "nvfp4"):  # the block scales: an e8m0 byte per 17, four e4m3 per 36
        cut = {"mxfp4": (17, 1), "nvfp4": (36, 4)}[fmt]
        got, want = (p["blocks"].reshape(-1, cut[0])[:, : cut[1]] for p in (parts, rtn))
        np.testing.assert_array_equal(got, want)
    _, plain = calibrate.gptq(w, u, f.grid(w, "mse"))
    assert _out_err(x, w, q) < 0.97 * _out_err(x, w, plain)


def test_gptq_importance_is_the_remaining_columns_saliency() -> None:
    """1 / u_jj^2 is 1 / [H_F^-1]_jj over the columns F = j.. not yet quantized (OBS), per
    column in the weight's order, with or without act-order."""
    _, x, _ = _layer(cols=32)
    h = x.T.astype(np.float64) @ x
    h += 0.01 * np.mean(np.diag(h)) * np.eye(32)  # inverse_factor's damping, done here
    for order in (None, calibrate.act_order(h)):
        o = np.arange(32) if order is None else order
        hp = h[o][:, o]
        want = np.empty(32)
        for j in range(32):
            want[o[j]] = 1 / np.linalg.inv(hp[j:, j:])[0, 0]
        got = calibrate.gptq_importance(calibrate.inverse_factor(hp, 1e-12), order)
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_per_row_scale_comes_from_the_whole_row() -> None:
    w, _, u = _layer()
    f = lowp.FORMATS["int8"]
    assert f.grid is not None
    parts, _ = calibrate.gptq(w, u, f.grid(w, "amax"))
    np.testing.assert_array_equal(parts["scale"], f.quantize(w, "amax")["scale"])


def test_dead_inputs_are_rounded_to_nearest() -> None:
    """A column no input reaches takes no error: its values are round-to-nearest's."""
    w, x, _ = _layer(cols=64)
    x[:, 5] = 0
    u = calibrate.inverse_factor(x.T.astype(np.float64) @ x)
    f = lowp.FORMATS["int8"]
    assert f.grid is not None
    _, q = calibrate.gptq(w, u, f.grid(w, "amax"))
    rtn = f.dequantize(f.quantize(w, "amax"))
    np.testing.assert_array_equal(q[:, 5], rtn[:, 5])
    assert not np.array_equal(q[:, 6:], rtn[:, 6:])  # live columns took earlier errors
    with pytest.raises(ValueError, match="columns"):
        calibrate.gptq(w, u[:10, :10], f.grid(w, "amax"))


def _rtn(fmt: str):
    f = lowp.FORMATS[fmt]
    return lambda v, imp=None: f.dequantize(f.quantize(v, "mse"))


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "int8", "fp8_e4m3"])
def test_input_scales_lower_the_output_error(fmt: str) -> None:
    """Inputs with a few loud channels: scaling those columns up before rounding (1/s folded
    into the input) gives a lower output error than rounding the weight as it is; alpha 0 is
    no scaling, so the search never does worse."""
    rng = np.random.default_rng(1)
    w = (rng.normal(size=(48, 128)) * 0.05).astype(np.float32)
    x = rng.normal(size=(512, 128)).astype(np.float32)
    x[:, :6] *= 20
    h = x.T.astype(np.float64) @ x
    rtn = _rtn(fmt)
    s = calibrate.input_scale(h, [(w, rtn)])
    assert s.shape == (128,) and s.dtype == np.float32
    q = rtn(w * s) / s
    assert _out_err(x, w, q) < 0.9 * _out_err(x, w, rtn(w))
    assert s[:6].min() > s[6:].max()  # the loud channels got the larger scales
    np.testing.assert_array_equal(calibrate.input_scale(h, [(w, rtn)], alphas=(0.0,)), 1)
    # tied columns share one scale; a column no input reaches keeps 1
    x[:, 100] = 0
    tie = np.arange(128) // 2
    s = calibrate.input_scale(x.T.astype(np.float64) @ x, [(w, rtn)], tie, alphas=(0.5,))
    np.testing.assert_array_equal(s[0::2], s[1::2])
    x[:, 101] = 0
    s = calibrate.input_scale(x.T.astype(np.float64) @ x, [(w, rtn)], tie, alphas=(0.5,))
    assert s[100] == s[101] == 1


def test_calibrated_weight_through_a_compiled_matmul() -> None:
    w, x, u = _layer(rows=20, cols=128)
    f = lowp.FORMATS["nvfp4"]
    assert f.grid is not None
    parts, q = calibrate.gptq(w, u, f.grid(w, "mse"))
    g = lm.Graph("calibrated")
    n = lm.dim("n", 1, 8)
    g.output("y", g.input("x", (n, 128)) @ lowp.weight(g, "w", "nvfp4", parts, w.shape).T)
    xs = x[:5]
    got = lm.compile(g).run({"x": xs})["y"]
    want = xs @ q.T
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


# --------------------------------------------------------------------------- tiny models

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from luminal.models.llama import from_hf  # noqa: E402

IDS = [5, 17, 3, 42, 8, 60, 1, 9, 33, 71, 12, 40, 2, 7]


def _hf(kind: str, tied: bool):
    torch.manual_seed(0)
    common = dict(vocab_size=80, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                  rope_theta=1000.0, rms_norm_eps=1e-5, tie_word_embeddings=tied)  # fmt: skip
    cls = ((transformers.Qwen2Config, transformers.Qwen2ForCausalLM) if kind == "qwen2"
           else (transformers.LlamaConfig, transformers.LlamaForCausalLM))  # fmt: skip
    hf = cls[1](cls[0](**common)).eval()
    with torch.no_grad():  # random norms and biases so a wrong mapping shows
        for n, p in hf.named_parameters():
            if "norm" in n:
                p.uniform_(0.5, 1.5)
            elif n.endswith("bias"):
                p.normal_(0, 0.5)
    return hf


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter: q/k rows reordered for adjacent-pair RoPE."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


class _Arrays:
    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        self.arrays = arrays

    def has(self, name: str) -> bool:
        return name in self.arrays

    def values(self, name: str) -> np.ndarray:
        return self.arrays[name]


def _model(kind: str, tied: bool):
    """transformers' model and luminal's Llama over GGUF-layout arrays (llama: permuted q/k,
    adjacent-pair RoPE, as in a GGUF file)."""
    hf = _hf(kind, tied)
    arrays = {k: v.detach().numpy().copy() for k, v in hf.state_dict().items()}
    model = from_hf(hf.config.to_dict(), arrays)
    if kind == "llama":
        ws = model.weights.arrays  # type: ignore[attr-defined]
        for i in range(2):
            ws[f"blk.{i}.attn_q.weight"] = _permute(ws[f"blk.{i}.attn_q.weight"], 4)
            ws[f"blk.{i}.attn_k.weight"] = _permute(ws[f"blk.{i}.attn_k.weight"], 2)
        model.config.rope_interleaved = True
    return hf, model


@pytest.mark.parametrize("kind,tied", [("llama", True), ("llama", False), ("qwen2", False)])
def test_statistics_are_the_layers_inputs(kind: str, tied: bool) -> None:
    """X^T X per input against transformers' layer inputs (hooks); the forward's logits
    against luminal's graph."""
    hf, model = _model(kind, tied)
    cal = calibrate.Calibration(model.config, _Arrays(model.weights.arrays), IDS)
    seen: dict[str, np.ndarray] = {}

    def hook(key: str):
        def f(mod, args):
            seen[key] = args[0][0].detach().numpy().astype(np.float64)

        return f

    layers = hf.model.layers
    for i, layer in enumerate(layers):
        layer.self_attn.q_proj.register_forward_pre_hook(hook(f"{i}.attn"))
        layer.self_attn.o_proj.register_forward_pre_hook(hook(f"{i}.attn_out"))
        layer.mlp.gate_proj.register_forward_pre_hook(hook(f"{i}.ffn"))
        layer.mlp.down_proj.register_forward_pre_hook(hook(f"{i}.ffn_mid"))
    hf.lm_head.register_forward_pre_hook(hook("head"))
    with torch.no_grad():
        hf(torch.tensor([IDS]))
    got = dict(cal.hessians())
    assert sorted(got) == sorted(seen)
    for k, v in seen.items():
        want = v.T @ v
        np.testing.assert_allclose(got[k], want, rtol=2e-4, atol=2e-5 * np.abs(want).max(),
                                   err_msg=k)  # fmt: skip
    assert cal.key("token_embd.weight") == ("head" if tied else None)
    assert cal.key("blk.1.ffn_up.weight") == "1.ffn" and cal.key("blk.1.attn_norm.weight") is None
    x = model.weights.arrays["token_embd.weight"][IDS]
    for i in range(2):
        x = cal._block(i, x, {})
    logits = cal.final(x) @ model.weights.arrays[cal.head()].T
    g = model.build(logits="all")
    ref = g.run({"tokens": np.asarray(IDS, np.int32), **model.new_cache()}, pos=0)["logits"]
    np.testing.assert_allclose(logits, ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max())


@pytest.mark.parametrize("kind,tied", [("llama", True), ("llama", False), ("qwen2", False)])
def test_folded_scales_keep_the_model(kind: str, tied: bool) -> None:
    """Input scales folded into the norms and v / up rows leave the f32 model's logits as they
    were, and each layer's updated X^T X is that of the scaled model's inputs."""
    _, model = _model(kind, tied)
    arrays = model.weights.arrays
    cal = calibrate.Calibration(model.config, _Arrays(arrays), IDS)
    new: dict[str, np.ndarray] = {}
    scaled: dict[str, np.ndarray] = {}
    for hs in cal.layers():
        new.update(cal.fold_scales(hs, lambda n: arrays[n], lambda n: _rtn("int8"), (0.5,)))
        scaled.update(hs)
    changed = {"attn_norm", "ffn_norm", "attn_v", "ffn_up", "attn_q", "attn_output", "ffn_down"}
    assert changed <= {n.split(".")[2] for n in new if n.startswith("blk.1.")}
    assert ("output.weight" in new) != tied and "token_embd.weight" not in new
    if kind == "qwen2":
        assert "blk.0.attn_v.bias" in new and "blk.0.attn_q.bias" not in new
    folded = calibrate.Calibration(model.config, _Arrays({**arrays, **new}), IDS)

    def logits(c: calibrate.Calibration) -> np.ndarray:
        x = arrays["token_embd.weight"][IDS]
        for i in range(2):
            x = c._block(i, x, {})
        return c.final(x) @ c._w(c.head()).T

    want = logits(cal)
    np.testing.assert_allclose(logits(folded), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    for k, v in folded.hessians():
        np.testing.assert_allclose(scaled[k], v, rtol=1e-3, atol=1e-4 * np.abs(v).max(),
                                   err_msg=k)  # fmt: skip


def _write_llama(path: str, tied: bool = True, loud: bool = False) -> None:
    """A tiny llama GGUF (f32) as llama.cpp's converter lays it out; ``loud``: a few hidden
    channels 20x larger out of the norms (as trained LLMs have)."""
    _, model = _model("llama", tied)
    c = model.config
    if loud:
        for n, a in model.weights.arrays.items():
            if n.endswith("norm.weight"):
                a[:4] *= 20
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(c.n_layers)
    w.add_context_length(c.context_length)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.n_heads)
    w.add_head_count_kv(c.n_kv_heads)
    w.add_rope_freq_base(c.rope_theta)
    w.add_layer_norm_rms_eps(c.rms_eps)
    for name, a in model.weights.arrays.items():
        w.add_tensor(name, np.ascontiguousarray(a, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("cal") / "llama.gguf")
    _write_llama(path)
    return path


@pytest.mark.parametrize("qtype", ["nvfp4", "mxfp4", "int8"])
def test_quantize_with_calibration_writes_a_file_luminal_runs(
    tiny_llama, tmp_path, monkeypatch, qtype
) -> None:
    # the tiny file has no tokenizer: the text's tokens are given
    monkeypatch.setattr(calibrate, "text_tokens", lambda f, text, n: IDS[:n])
    out = tmp_path / "c.gguf"
    res = quant.quantize(tiny_llama, out, qtype, calibration="some calibration text",
                         calib_tokens=10)  # fmt: skip
    info = json.loads(GGUFFile(out).get(calibrate.CALIB_KEY))
    assert info == res.calibration and info["matrices"] == 15 and info["tokens"] == 10
    assert info["damp"] == calibrate.DAMP
    assert quant.describe(res)["calibration"] == info
    plain = tmp_path / "p.gguf"
    quant.quantize(tiny_llama, plain, qtype)
    assert calibrate.CALIB_KEY not in GGUFFile(plain).metadata
    s = lm.models.load(out, backend="interp")
    assert np.isfinite(s.forward(IDS[:6])).all()
    # requantizing a calibrated file does not carry its record over
    quant.quantize(out, tmp_path / "r.gguf", "int8")
    assert calibrate.CALIB_KEY not in GGUFFile(tmp_path / "r.gguf").metadata


def test_bad_calibration_input_is_a_clear_error(tiny_llama, tmp_path) -> None:
    out = tmp_path / "o.gguf"
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        quant.quantize(tiny_llama, out, "int8", calibration=tmp_path / "nope.txt")
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        quant.quantize(tiny_llama, out, "int8", calibration="missing.txt")
    (tmp_path / "empty.txt").write_text(" \n")
    with pytest.raises(ValueError, match="empty"):
        quant.quantize(tiny_llama, out, "int8", calibration=tmp_path / "empty.txt")
    for t in ("q4_k_m", "q8_0", "bf16"):
        with pytest.raises(ValueError, match=f"calibration applies.*not {t}"):
            quant.quantize(tiny_llama, out, t, calibration="some text")
    with pytest.raises(ValueError, match="tokenizer"):  # the tiny file has none
        quant.quantize(tiny_llama, out, "int8", calibration="some text")
    with pytest.raises(ValueError, match="calib_damp"):
        quant.quantize(tiny_llama, out, "int8", calibration="some text", calib_damp=0)
    with pytest.raises(ValueError, match="calib_tokens"):
        quant.quantize(tiny_llama, out, "int8", calibration="some text", calib_tokens=0)
    with pytest.raises(ValueError, match="calib_method"):
        quant.quantize(tiny_llama, out, "int8", calibration="some text", calib_method="x")
    assert not out.exists()


@pytest.mark.parametrize("method", ["awq", "awq+gptq"])
def test_quantize_with_input_scales(tmp_path, monkeypatch, method) -> None:
    """The file holds the folded norms and the scaled matrices, records the method, and gives
    the f32 model's logits up to int8's rounding. (Each group's output error is lower, above;
    the whole model's need not be: two random layers fed 14 tokens are not a trained model.)"""
    monkeypatch.setattr(calibrate, "text_tokens", lambda f, text, n: IDS[:n])
    src = str(tmp_path / "loud.gguf")
    _write_llama(src, loud=True)
    out = tmp_path / "a.gguf"
    res = quant.quantize(src, out, "int8", calibration="some calibration text",
                         calib_method=method)  # fmt: skip
    assert res.calibration is not None and res.calibration["method"] == method
    assert res.calibration["matrices"] == 15
    a, b = GGUFWeights(GGUFFile(src)), GGUFWeights(GGUFFile(out))
    for n in ("blk.0.attn_norm.weight", "blk.1.ffn_norm.weight"):
        s = a.values(n) / b.values(n)  # the scales, > 1 on the loud channels
        assert s[:4].min() > s[4:].max()
    ref = lm.models.load(src, backend="interp").forward(IDS)
    got = lm.models.load(out, backend="interp").forward(IDS)
    assert np.linalg.norm(got - ref) < 0.1 * np.linalg.norm(ref)  # int8 rounding, exact folds


def test_cli_calibration(tiny_llama, tmp_path, monkeypatch, capsys) -> None:
    from luminal.quant import cli

    monkeypatch.setattr(calibrate, "text_tokens", lambda f, text, n: IDS[:n])
    text = tmp_path / "calib text.txt"  # a path with a space is still a file
    text.write_text("words for calibration")
    out = str(tmp_path / "o.gguf")
    assert cli.run([tiny_llama, "-o", out, "--type", "mxfp8", "--calibration", str(text),
                    "--calib-tokens", "8", "--calib-damp", "0.1"]) == 0  # fmt: skip
    assert "calibrated 15 matrices on 8 tokens (awq+gptq)" in capsys.readouterr().out
    assert json.loads(GGUFFile(out).get(calibrate.CALIB_KEY))["damp"] == 0.1
    assert cli.run([tiny_llama, "-o", out, "--type", "nvfp4", "--calibration", str(text),
                    "--calib-method", "awq+gptq", "--calib-act-order", "--force"]) == 0  # fmt: skip
    assert "(awq+gptq)" in capsys.readouterr().out
    info = json.loads(GGUFFile(out).get(calibrate.CALIB_KEY))
    assert info["method"] == "awq+gptq" and info["act_order"] is True and info["importance"]
    args = [tiny_llama, "-o", out, "--type", "nvfp4", "--calibration", str(text), "--force"]
    assert cli.run(args) == 0
    weighted = GGUFFile(out).raw("blk.0.ffn_up.weight.blocks").copy()
    assert cli.run([*args, "--no-calib-importance"]) == 0
    assert json.loads(GGUFFile(out).get(calibrate.CALIB_KEY))["importance"] is False
    assert not np.array_equal(GGUFFile(out).raw("blk.0.ffn_up.weight.blocks"), weighted)
    assert cli.run([tiny_llama, "-o", out, "--type", "int8", "--force",
                    "--calibration", str(tmp_path / "no.txt")]) == 2  # fmt: skip
    assert "no.txt: no such file" in capsys.readouterr().err


@pytest.mark.slow
def test_smollm2_calibrated_file(tmp_path) -> None:
    from luminal.models import smollm2_path

    out = tmp_path / "m.gguf"
    res = quant.quantize(smollm2_path(), out, "mxfp4", calibration=calibrate.TEXT,
                         calib_tokens=64)  # fmt: skip
    assert res.calibration is not None and res.calibration["tokens"] == 64
    assert res.calibration["matrices"] == 30 * 7 + 1  # tied head: token_embd, calibrated
    f = GGUFFile(out)
    assert f.type_name("blk.0.attn_q.weight") == "MXFP4"
    s = lm.models.load(out, backend="interp", max_context=16)
    assert np.isfinite(s.forward([1, 2, 3])).all()


def test_bench_numpy_forward_is_luminals(tiny_llama, tmp_path) -> None:
    """bench/quant.py --numpy's logits (the calibration forward over a file's dequantized
    weights) are luminal's, for an f32 and a quantized file, at every position."""
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "bench", "quant.py")
    spec = importlib.util.spec_from_file_location("bench_quant", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)  # not __main__: no re-exec
    q = tmp_path / "q.gguf"
    quant.quantize(tiny_llama, q, "fp8_e4m3")
    got = []
    for p in (tiny_llama, str(q)):
        got.append(np.stack(bench.numpy_logits(p, IDS)))
        s = lm.models.load(p, backend="interp", max_context=16)
        want = np.stack([s.forward([t]) for t in IDS])
        np.testing.assert_allclose(got[-1], want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
    assert np.abs(got[1] - got[0]).max() > 1e-3 * np.abs(got[0]).max()  # the fp8 values read


# --------------------------------------------------------------------------- sensitivity


@pytest.mark.parametrize("tied", [True, False])
def test_sensitivity_is_the_models_kl_with_one_matrix_rounded(tied: bool) -> None:
    """Each measure equals the KL of a whole forward with only that matrix replaced (the
    cached layers before it are the f32 model's); unchanged values cost nothing."""
    from luminal.quant import sensitivity

    _, model = _model("llama", tied)
    arrays = model.weights.arrays
    cal = calibrate.Calibration(model.config, _Arrays(arrays), IDS)
    names = ["blk.0.attn_q.weight", "blk.1.ffn_down.weight", "token_embd.weight"]
    names += [] if tied else ["output.weight"]
    rng = np.random.default_rng(0)

    def noisy(name: str, v: np.ndarray) -> np.ndarray:
        return v + rng.normal(size=v.shape).astype(np.float32) * 0.05 * np.abs(v).mean()

    kl = sensitivity.measure(cal, names, noisy)
    assert sorted(kl) == sorted(names) and all(v > 0 for v in kl.values())

    def logp(arr: dict[str, np.ndarray]) -> np.ndarray:
        c = calibrate.Calibration(model.config, _Arrays(arr), IDS)
        x = arr["token_embd.weight"][IDS]
        for i in range(2):
            x = c._block(i, x, None)
        return sensitivity._log_softmax(c.final(x) @ c._w(c.head()).T)

    ref = logp(arrays)
    rng = np.random.default_rng(0)  # the same noise, in the same order
    for name in names:
        p = logp({**arrays, name: noisy(name, arrays[name])})
        want = float(np.mean(np.sum(np.exp(ref) * (ref - p), axis=-1)))
        assert kl[name] == pytest.approx(want, rel=1e-3), name
    same = sensitivity.measure(cal, names, lambda n, v: v)
    assert all(abs(v) < 1e-9 for v in same.values())


def test_choose_keeps_the_most_kl_per_weight_within_the_budget() -> None:
    from luminal.quant import sensitivity

    kl = {"a": 4.0, "b": 1.0, "c": 3.0, "d": 0.5}
    sizes = {"a": 400, "b": 50, "c": 100, "d": 450}  # per weight: c .03, b .02, a .01, d .001
    assert sensitivity.choose(kl, sizes, 0.0) == []
    assert sensitivity.choose(kl, sizes, 0.1) == ["c"]
    assert sensitivity.choose(kl, sizes, 0.15) == ["c", "b"]
    assert sensitivity.choose(kl, sizes, 0.5) == ["c", "b"]  # a does not fit; d would
    assert sensitivity.choose(kl, sizes, 0.6) == ["c", "b", "a"]
    assert sensitivity.choose(kl, sizes, 1.0) == ["c", "b", "a", "d"]
    with pytest.raises(ValueError, match="fraction"):
        sensitivity.choose(kl, sizes, 1.5)


def test_quantize_keeps_the_sensitive_matrices(tiny_llama, tmp_path, monkeypatch) -> None:
    from luminal.quant import cli

    monkeypatch.setattr(calibrate, "text_tokens", lambda f, text, n: IDS[:n])
    out = tmp_path / "k.gguf"
    res = quant.quantize(tiny_llama, out, "mxfp4", calibration="some calibration text",
                         keep_sensitive=0.3, keep_type="q8_0")  # fmt: skip
    assert res.calibration is not None
    keep = res.calibration["keep"]
    assert keep["fraction"] == 0.3 and keep["type"] == "q8_0"
    assert len(res.sensitivity) == 15  # 14 layer matrices and the tied embedding / head
    f = GGUFFile(out)
    assert json.loads(f.get(calibrate.CALIB_KEY))["keep"] == keep
    sizes = {n: int(np.prod(f.tensors[n].shape)) for n in res.sensitivity}
    assert keep["matrices"] == quant.sensitivity.choose(res.sensitivity, sizes, 0.3)
    assert 0 < sum(sizes[n] for n in keep["matrices"]) <= 0.3 * sum(sizes.values())
    for n in res.sensitivity:
        assert f.type_name(n) == ("Q8_0" if n in keep["matrices"] else "MXFP4"), n
    assert res.calibration["matrices"] == 15 - len(keep["matrices"])
    s = lm.models.load(out, backend="interp")
    assert np.isfinite(s.forward(IDS[:6])).all()
    # a luminal format keeps its container version key when kept matrices are plain GGUF
    res = quant.quantize(tiny_llama, tmp_path / "i.gguf", "int8", embed_type="q8_0",
                         calibration="some calibration text", keep_sensitive=0.2,
                         keep_type="bf16")  # fmt: skip
    assert "token_embd.weight" not in res.sensitivity and len(res.sensitivity) == 14
    f = GGUFFile(tmp_path / "i.gguf")
    assert {f.type_name(n) for n in res.calibration["keep"]["matrices"]} == {"BF16"}
    assert np.isfinite(lm.models.load(f.path, backend="interp").forward(IDS[:4])).all()
    with pytest.raises(ValueError, match="calibration"):
        quant.quantize(tiny_llama, tmp_path / "x.gguf", "mxfp4", keep_sensitive=0.2)
    with pytest.raises(ValueError, match="keep_sensitive must be"):
        quant.quantize(tiny_llama, tmp_path / "x.gguf", "mxfp4", calibration="some text",
                       keep_sensitive=2.0)  # fmt: skip
    with pytest.raises(ValueError, match="keep_type"):
        quant.quantize(tiny_llama, tmp_path / "x.gguf", "mxfp4", calibration="some text",
                       keep_sensitive=0.2, keep_type="q4_k_m")  # fmt: skip
    text = tmp_path / "t.txt"
    text.write_text("words for calibration")
    assert cli.run([tiny_llama, "-o", str(tmp_path / "c.gguf"), "--type", "nvfp4",
                    "--calibration", str(text), "--keep-sensitive", "0.25"]) == 0  # fmt: skip
    info = json.loads(GGUFFile(tmp_path / "c.gguf").get(calibrate.CALIB_KEY))["keep"]
    assert info["type"] == "q8_0" and info["matrices"]
