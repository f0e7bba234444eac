"""Rotating the residual stream before quantizing (``luminal.quant.rotate``, ``quantize(...,
rotate=...)``, ``luminal quantize --rotate``): the matrices are orthogonal, the rotated f32
model is the same function (luminal's graph, the bench's numpy forward, llama.cpp), its norm
weights are ones, a tied head is untied only when it must be, the file records the rotation,
calibration runs on the rotated model, and bad input is a clear error."""

from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import gguf  # noqa: E402

import luminal as lm  # noqa: E402
from luminal import quant  # noqa: E402
from luminal.loaders.gguf import GGUFFile, GGUFWeights  # noqa: E402
from luminal.quant import calibrate, rotate  # noqa: E402
from test_quant_calibrate import IDS, _Arrays, _model, _write_llama  # noqa: E402


@pytest.mark.parametrize("n", [4, 12, 48, 64, 72, 576, 1536])
def test_hadamard_matrices(n: int) -> None:
    h = rotate.hadamard(n)
    assert h is not None and set(np.unique(h)) == {-1.0, 1.0}
    np.testing.assert_array_equal(h @ h.T, n * np.eye(n))


@pytest.mark.parametrize("kind", rotate.KINDS)
@pytest.mark.parametrize("n", [64, 576, 10, 36])
def test_orthogonal(kind: str, n: int) -> None:
    q = rotate.orthogonal(n, kind, seed=3)
    np.testing.assert_allclose(q @ q.T, np.eye(n), atol=1e-12)
    np.testing.assert_array_equal(q, rotate.orthogonal(n, kind, seed=3))  # seeded
    assert not np.array_equal(q, rotate.orthogonal(n, kind, seed=4))
    if kind == "hadamard" and rotate.hadamard(n) is not None:  # every entry +-1/sqrt(n)
        np.testing.assert_allclose(np.abs(q), 1 / np.sqrt(n))
    if kind == "hadamard" and n == 10:  # no order-10 Hadamard built: blocks of 8 and 2
        assert rotate.hadamard(10) is None
        assert np.count_nonzero(q) == 64 + 4
    with pytest.raises(ValueError, match="rotation kind"):
        rotate.orthogonal(n, "givens")


def _logits(arrays: dict[str, np.ndarray], config) -> np.ndarray:
    cal = calibrate.Calibration(config, _Arrays(arrays), IDS)
    x = arrays["token_embd.weight"][IDS]
    for i in range(config.n_layers):
        x = cal._block(i, x, None)
    return cal.final(x) @ cal._w(cal.head()).T


@pytest.mark.parametrize("heads", [True, False])
@pytest.mark.parametrize("kind,tied", [("llama", True), ("llama", False), ("qwen2", False)])
def test_rotation_keeps_the_function(kind: str, tied: bool, heads: bool) -> None:
    """On random llama / qwen2 weights (random norms, q/k/v biases), the rotated tensors give
    the same logits through the numpy forward; norms are ones; every matrix changed."""
    _, model = _model(kind, tied)
    arrays = model.weights.arrays
    names = list(arrays)
    new, record = rotate.rotate(model.config, _Arrays(arrays), names, "hadamard", heads=heads)
    assert record == {"kind": "hadamard", "seed": rotate.SEED, "dim": 64, "heads": heads,
                      "untied_head": tied, "kept": []}  # fmt: skip
    kept = ("q.bias", "k.bias") if heads else ("q.bias", "k.bias", "v.bias")  # reader biases
    same = {"rope_freqs.weight"} | {n for n in names if n.endswith(kept)}
    assert set(new) == {n for n in names if n not in same} | {"output.weight"}
    for n, a in new.items():
        if n.endswith("norm.weight"):
            np.testing.assert_array_equal(a, 1)
        elif a.ndim == 2 and n in arrays:
            assert np.abs(a - arrays[n]).max() > 0.1 * np.abs(arrays[n]).max(), n
    want = _logits(arrays, model.config)
    got = _logits({**arrays, **new}, model.config)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def test_loud_channels_are_left_alone() -> None:
    """A residual channel far louder than the rest is found, Q is the identity there, and the
    model is still the same function."""
    _, model = _model("llama", False)
    arrays = dict(model.weights.arrays)
    arrays["token_embd.weight"] = arrays["token_embd.weight"].copy()
    arrays["token_embd.weight"][:, 5] *= 100
    weights = _Arrays(arrays)
    assert rotate.loud_channels(model.config, weights, IDS) == [5]
    assert rotate.loud_channels(model.config, weights, IDS, ratio=1e6) == []
    q = rotate.orthogonal(64, "hadamard", keep=[5, 9])
    np.testing.assert_allclose(q @ q.T, np.eye(64), atol=1e-12)
    assert q[5, 5] == q[9, 9] == 1 and np.count_nonzero(q[5]) == np.count_nonzero(q[:, 9]) == 1
    new, record = rotate.rotate(model.config, weights, list(arrays), keep=[5])
    assert record["kept"] == [5]
    np.testing.assert_allclose(new["token_embd.weight"][:, 5], arrays["token_embd.weight"][:, 5])
    want = _logits(arrays, model.config)
    got = _logits({**arrays, **new}, model.config)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def test_tied_head_stays_tied_under_a_constant_final_norm() -> None:
    _, model = _model("llama", True)
    arrays = dict(model.weights.arrays)
    arrays["output_norm.weight"] = np.full(64, 1.25, np.float32)
    new, record = rotate.rotate(model.config, _Arrays(arrays), list(arrays))
    assert not record["untied_head"] and "output.weight" not in new
    np.testing.assert_array_equal(new.get("output_norm.weight", arrays["output_norm.weight"]),
                                  1.25)  # fmt: skip
    want = _logits(arrays, model.config)
    got = _logits({**arrays, **new}, model.config)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def _bench():
    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "bench", "quant.py")
    spec = importlib.util.spec_from_file_location("bench_quant", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)  # not __main__: no re-exec
    return bench


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("rot") / "llama.gguf")
    _write_llama(path)  # tied head, random norms
    return path


@pytest.fixture
def no_tokenizer(monkeypatch) -> None:
    """The tiny files have no tokenizer: a text's tokens are given."""
    monkeypatch.setattr(calibrate, "text_tokens", lambda f, text, n: IDS[:n])


@pytest.mark.parametrize("kind", rotate.KINDS)
def test_rotated_f32_file_is_the_same_model(tiny, tmp_path, no_tokenizer, kind: str) -> None:
    """Through luminal's graph (prompt, then decode steps with the cache) and through
    bench/quant.py --numpy's forward."""
    out = tmp_path / "rot.gguf"
    res = quant.quantize(tiny, out, "f32", rotate=kind)
    assert res.rotation is not None and res.rotation["kind"] == kind
    f = GGUFFile(out)
    assert json.loads(f.get(rotate.ROTATION_KEY)) == res.rotation == quant.describe(res)["rotation"]
    assert "output.weight" in f.tensors and res.rotation["untied_head"]  # random final norm
    w = GGUFWeights(f)
    for n in f.tensors:
        if n.endswith("norm.weight"):
            np.testing.assert_array_equal(w.values(n), 1)
    a, b = (lm.models.load(p, backend="interp") for p in (tiny, out))
    for step in (IDS[:-2], IDS[-2:-1], IDS[-1:]):
        want, got = a.forward(step), b.forward(step)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
    bench = _bench()
    want, got = (np.stack(bench.numpy_logits(p, IDS)) for p in (tiny, str(out)))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
    # requantizing keeps the record (the weights stay rotated); rotating again is refused
    quant.quantize(out, tmp_path / "q.gguf", "int8")
    assert json.loads(GGUFFile(tmp_path / "q.gguf").get(rotate.ROTATION_KEY)) == res.rotation
    with pytest.raises(ValueError, match="already rotated"):
        quant.quantize(out, tmp_path / "r.gguf", "int8", rotate=True)


def test_rotation_then_calibration(tiny, tmp_path, no_tokenizer) -> None:
    """Calibration and the sensitivity mix run on the rotated model: both records are in the
    file, and the int8 file is close to the original model."""
    out = tmp_path / "c.gguf"
    res = quant.quantize(tiny, out, "int8", calibration="some calibration text", rotate=True,
                         keep_sensitive=0.2)  # fmt: skip
    f = GGUFFile(out)
    assert json.loads(f.get(rotate.ROTATION_KEY))["kind"] == rotate.KIND
    info = json.loads(f.get(calibrate.CALIB_KEY))
    kept = info["keep"]["matrices"]
    # untied: the head is a matrix of its own (calibrated or kept), the embedding a lookup
    assert kept and info["matrices"] + len(set(kept) - {"token_embd.weight"}) == 15
    assert "output.weight" in res.sensitivity and "token_embd.weight" in res.sensitivity
    ref = lm.models.load(tiny, backend="interp").forward(IDS)
    got = lm.models.load(out, backend="interp").forward(IDS)
    assert np.linalg.norm(got - ref) < 0.1 * np.linalg.norm(ref)


def test_cli_rotate(tiny, tmp_path, capsys, no_tokenizer) -> None:
    from luminal.quant import cli

    out = str(tmp_path / "o.gguf")
    assert cli.run([tiny, "-o", out, "--type", "q8_0", "--rotate"]) == 0
    text = capsys.readouterr().out
    assert f"rotated the residual stream ({rotate.KIND}, seed 0, value heads too)" in text
    assert "0 loud channels left alone: []" in text
    assert "output head untied from the embedding" in text and "+0.0 MiB" in text
    assert cli.run([tiny, "-o", out, "--type", "q8_0", "--rotate", "random", "--force",
                    "--rotate-loud", "0"]) == 0  # fmt: skip
    info = json.loads(GGUFFile(out).get(rotate.ROTATION_KEY))
    assert info["kind"] == "random" and info["loud"] == 0
    with pytest.raises(SystemExit):
        cli.run([tiny, "-o", out, "--type", "q8_0", "--rotate", "givens", "--force"])
    assert "invalid choice: 'givens'" in capsys.readouterr().err


def test_bad_rotation_input_is_a_clear_error(tiny, tmp_path) -> None:
    out = tmp_path / "o.gguf"
    with pytest.raises(ValueError, match="rotate must be.*hadamard"):
        quant.quantize(tiny, out, "int8", rotate="givens")
    with pytest.raises(ValueError, match="rotate_loud"):
        quant.quantize(tiny, out, "int8", rotate=True, rotate_loud=-1)
    with pytest.raises(ValueError, match="tokenizer"):  # the loud channels need a text's tokens
        quant.quantize(tiny, out, "int8", rotate=True)
    other = str(tmp_path / "gpt2.gguf")
    w = gguf.GGUFWriter(other, "gpt2")
    w.add_tensor("token_embd.weight", np.ones((8, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="rotate applies to llama-family.*'gpt2'.*supported"):
        quant.quantize(other, out, "int8", rotate=True)
    _, model = _model("llama", False)
    arrays = {**model.weights.arrays, "blk.0.attn_q_norm.weight": np.ones(16, np.float32)}
    with pytest.raises(ValueError, match="does not know: blk.0.attn_q_norm.weight"):
        rotate.rotate(model.config, _Arrays(arrays), list(arrays))
    assert not out.exists()


@pytest.mark.parametrize("kind", ["llama", "qwen2-tied"])
def test_llama_cpp_runs_the_rotated_file(tmp_path, kind: str) -> None:
    """llama.cpp reads the rotated files (an untied head for the tied model): f32 gives
    transformers' logits, q8_0 is as close to them as the unrotated q8_0 file, and luminal's
    logits of the rotated q8_0 file are llama.cpp's."""
    llama_cpp = pytest.importorskip("llama_cpp")
    pytest.importorskip("tokenizers")
    from test_quant_hf import _hf_logits, _ids, _rel, _save

    folder = str(tmp_path / kind)
    _save(folder, kind)
    ids = _ids(folder)
    want = _hf_logits(folder, ids)
    err = {}
    for qtype, rot in (("f32", True), ("q8_0", False), ("q8_0", True)):
        out = str(tmp_path / f"{qtype}-{rot}.gguf")
        res = quant.quantize(folder, out, qtype, rotate=rot)
        assert (res.rotation is not None) == rot
        m = llama_cpp.Llama(out, n_ctx=64, n_threads=1, logits_all=True, verbose=False)
        m.eval(ids)
        got = np.asarray(m.scores[: len(ids)], np.float32)
        m.close()
        err[qtype, rot] = _rel(got, want)
        if rot and qtype == "q8_0":
            s = lm.models.load(out, backend="interp")
            # llama.cpp: f16 KV cache, q8 activations for Q8_0 weights
            assert _rel(s.forward(ids), got[-1]) < 0.02
    assert err["f32", True] < 1e-3
    assert err["q8_0", True] < 1.5 * err["q8_0", False]  # (0.010-0.012 both, when written)


@pytest.mark.slow
def test_smollm2_rotated_f32_is_the_same_model(tmp_path) -> None:
    """SmolLM2: the massive-activation channels are found and left alone, the head is untied
    (its final norm weight is not a constant), and the rotated f32 file gives the same logits
    through the bench's numpy forward."""
    from luminal.models import smollm2_path

    src = smollm2_path()
    out = tmp_path / "rot.gguf"
    res = quant.quantize(src, out, "f32", rotate=True)
    assert res.rotation is not None and res.rotation["untied_head"]
    assert res.rotation["kept"] == [17, 247, 507]
    ids = list(range(100, 132))
    bench = _bench()
    want, got = (np.stack(bench.numpy_logits(p, ids)) for p in (src, str(out)))
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-5 * np.abs(want).max())
    assert (got.argmax(-1) == want.argmax(-1)).all()
