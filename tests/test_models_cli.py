"""The ``luminal`` command line: ``generate`` / ``embed`` on the default models (reference
interpreter), ``compile`` / ``run`` on a tiny graph (the real models' compiles are slow-marked)."""

from __future__ import annotations

import json
import os
import textwrap

import numpy as np
import pytest

import luminal as lm
from luminal.cli import main
from luminal.plan import Plan

TINY = textwrap.dedent("""
    import numpy as np
    import luminal as lm

    def build():
        g = lm.Graph("tiny")
        seq = lm.dim("seq", 1, 64)
        x = g.input("x", (seq, 4))
        w = g.weight("w", data=np.arange(16, dtype=np.float32).reshape(4, 4) / 10 - 0.7)
        g.output("y", (x @ w).relu())
        g.output("total", x.sum())
        return g

    def not_a_graph():
        return 3
""")


@pytest.fixture(autouse=True)
def _own_plan_cache(tmp_path, monkeypatch) -> None:
    """Each test sees its commands compile (a plan cached by another run would skip stages)."""
    monkeypatch.setenv("LUMINAL_PLAN_CACHE_DIR", str(tmp_path / "plans"))


@pytest.mark.slow
def test_generate_second_run_loads_cached_plans(capsys, monkeypatch) -> None:
    """``luminal generate`` twice: the second builds no graph and compiles nothing (both plans
    come from the plan cache) and prints the same text; ``luminal cache list`` shows them."""
    from luminal.models import smollm2_path

    _have(smollm2_path)
    # templated, past PREFILL_MIN tokens: the first run compiles the prefill plan
    prompt = (
        "The capital of France is Paris and the capital of Germany is Berlin. "
        "The capital of Italy is"
    )
    args = ["generate", "-n", "3", "--ctx", "64", prompt]
    monkeypatch.setenv("LUMINAL_SEARCH_BUDGET_S", "0")  # default kernels: a quicker compile
    assert main(args) == 0
    first = capsys.readouterr()
    assert main(args) == 0
    second = capsys.readouterr()
    assert "lowering" in first.err and "lowering" not in second.err, second.err
    assert "from the plan cache" in second.err and second.out == first.out
    assert main(["cache", "list"]) == 0
    # the decode and prefill plans, and the plan that merges them (what a warm start maps)
    listing = capsys.readouterr().out
    assert "3 plans" in listing and "llama decode" in listing and "llama prefill" in listing


def _have(fn) -> None:
    pytest.importorskip("tokenizers")
    pytest.importorskip("gguf")
    try:
        fn()
    except FileNotFoundError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def tiny_plan(tmp_path_factory) -> tuple[str, str]:
    """(graph spec, plan path): the tiny graph compiled once by ``luminal compile``."""
    d = tmp_path_factory.mktemp("cli")
    (d / "tiny.py").write_text(TINY)
    spec, plan = f"{d / 'tiny.py'}:build", str(d / "tiny.lmp")
    assert main(["compile", "--graph", spec, "-o", plan]) == 0
    return spec, plan


def _tiny_graph(spec: str) -> lm.Graph:
    from luminal.cli import _graph_from_spec

    return _graph_from_spec(spec)


def test_compile_writes_a_plan_and_reports_stages(tmp_path, capsys) -> None:
    (tmp_path / "tiny.py").write_text(TINY)
    plan = tmp_path / "t.lmp"
    assert main(["compile", "--graph", f"{tmp_path / 'tiny.py'}:build", "-o", str(plan)]) == 0
    out = capsys.readouterr()
    assert plan.is_file() and f"wrote {plan}" in out.out
    assert "dims: seq 1..64" in out.out and "x f32(seq, 4)" in out.out
    for stage in ("lowering", "generating code for", "loading the plan", "done in"):
        assert stage in out.err, out.err
    assert lm.load(str(plan)).inputs == {"x": np.dtype(np.float32)}


LINEAR = textwrap.dedent("""
    import numpy as np
    import luminal as lm

    def build():
        g = lm.Graph("lin")
        x = g.input("x", (lm.dim("seq", 1, 64), 40))
        w = g.weight("w", data=np.random.default_rng(0).standard_normal((24, 40)).astype("f4"))
        g.output("y", x @ w.transpose(0, 1))
        return g
""")


@pytest.mark.parametrize("precision", ["f32", "bf16"])
def test_compile_matmul_precision(precision, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("LUMINAL_MATMUL_PRECISION", "")  # restored after main sets it
    (tmp_path / "lin.py").write_text(LINEAR)
    plan = tmp_path / "lin.lmp"
    args = ["compile", "--graph", f"{tmp_path / 'lin.py'}:build", "-o", str(plan), "--no-search"]
    assert main([*args, "--matmul-precision", precision]) == 0
    weights = [b for b in Plan.load(str(plan)).buffers if b.role.name == "weight"]
    assert [b.dtype.name for b in weights] == [precision]


def test_compile_progress_callback() -> None:
    seen: list[str] = []
    g = lm.Graph("cb")
    x = g.input("x", (3,))
    g.output("y", x * 2)
    lm.compile(g, progress=seen.append)
    assert seen[0].startswith("lowering") and any("kernels" in m for m in seen[1:])


def test_run_matches_the_interpreter(tiny_plan, tmp_path, capsys) -> None:
    spec, plan = tiny_plan
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out_dir = tmp_path / "out"
    assert main(["run", plan, "-i", f"x={tmp_path / 'x.npy'}", "-o", str(out_dir)]) == 0
    printed = capsys.readouterr().out
    assert "y: float32 (5, 4)" in printed and "total: float32 ()" in printed
    want = _tiny_graph(spec).run({"x": x})
    for name in ("y", "total"):
        np.testing.assert_allclose(np.load(out_dir / f"{name}.npy"), want[name], rtol=1e-5)


def test_run_takes_exact_int64_for_float_and_explicit_dims(tiny_plan, tmp_path) -> None:
    spec, plan = tiny_plan
    x = np.arange(12).reshape(3, 4)  # int64, as numpy saves Python ints
    np.save(tmp_path / "x.npy", x)
    argv = ["run", plan, "-i", f"x={tmp_path / 'x.npy'}", "-d", "seq=3", "-o", str(tmp_path)]
    assert main(argv) == 0
    want = _tiny_graph(spec).run({"x": x.astype(np.float32)})["y"]
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), want, rtol=1e-5)


@pytest.mark.parametrize(
    "args,message",
    [
        (["-i", "x"], "expected NAME=FILE.npy"),
        (["-i", "=x.npy"], "expected NAME=FILE.npy"),
        (["-d", "seq"], "expected NAME=INTEGER"),
        (["-d", "seq=five"], "must be an integer"),
        (["-i", "x={d}/missing.npy"], "no such file"),
        (["-i", "x={d}/x.npy", "-i", "x={d}/x.npy"], "given twice"),
        (["-i", "x={d}/wrong.npy"], "has shape (3, 5), expected (3, 4)"),
        (["-i", "x={d}/frac.npy"], "do not convert exactly"),
        (["-i", "x={d}/x.npy", "-d", "seq=4"], "expected (4, 4)"),
        (["-i", "x={d}/x.npy", "-d", "batch=2"], "unknown dim 'batch'"),
        ([], "missing input(s) ['x']"),
        (["-i", "x={d}/x.npy", "-i", "z={d}/x.npy"], "unknown input(s) ['z']"),
    ],
)
def test_run_errors_are_clear(tiny_plan, tmp_path, capsys, args, message) -> None:
    _, plan = tiny_plan
    np.save(tmp_path / "x.npy", np.zeros((3, 4), np.float32))
    np.save(tmp_path / "wrong.npy", np.zeros((3, 5), np.float32))
    np.save(tmp_path / "frac.npy", np.full((3, 4), 0.5, np.float64) + 1e-12)
    argv = ["run", plan, "-o", str(tmp_path / "out")] + [a.format(d=tmp_path) for a in args]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_run_missing_plan_and_bad_plan(tmp_path, capsys) -> None:
    assert main(["run", str(tmp_path / "none.lmp")]) == 2
    assert "no such plan file" in capsys.readouterr().err
    bad = tmp_path / "bad.lmp"
    bad.write_bytes(b"not a plan at all")
    assert main(["run", str(bad)]) == 2
    assert "luminal: error:" in capsys.readouterr().err


@pytest.mark.parametrize(
    "spec,message",
    [
        ("tiny.py", "expected FILE.py:FUNCTION"),
        ("missing.py:build", "no such file"),
        ("tiny.py:nothing", "has no function 'nothing'"),
        ("tiny.py:not_a_graph", "returned int, not a luminal.Graph"),
    ],
)
def test_compile_graph_spec_errors(tmp_path, capsys, spec, message) -> None:
    (tmp_path / "tiny.py").write_text(TINY)
    path, sep, fn = spec.partition(":")
    assert main(["compile", "--graph", str(tmp_path / path) + sep + fn]) == 2
    assert message in capsys.readouterr().err


def test_compile_unknown_model_file(tmp_path, capsys) -> None:
    f = tmp_path / "weights.bin"
    f.write_bytes(b"\0" * 8)
    assert main(["compile", "--model", str(f)]) == 2
    assert "not a GGUF file or a model folder" in capsys.readouterr().err


@pytest.mark.slow
def test_compile_default_models(tmp_path, capsys) -> None:
    from luminal.models import minilm_dir, smollm2_path

    _have(smollm2_path)
    _have(minilm_dir)
    plan = tmp_path / "smollm2.lmp"
    assert main(["compile", "--ctx", "64", "--no-search", "-o", str(plan)]) == 0
    out = capsys.readouterr()
    assert "tokens i32(seq)" in out.out and "pos 0..63" in out.out and "lowering" in out.err
    ex = lm.load(str(plan))
    assert set(ex.dims) == {"seq", "pos"} and "logits" in ex.outputs
    plan = tmp_path / "minilm.lmp"
    assert main(["compile", "--kind", "embed", "--no-search", "-o", str(plan)]) == 0
    assert "embeddings" in lm.load(str(plan)).outputs
    assert os.path.getsize(plan) > 20e6  # the weights travel inside the plan


def test_embed_json(capsys) -> None:
    from luminal.models import minilm_dir

    _have(minilm_dir)
    assert main(["embed", "hello world", "a second sentence", "--json", "--backend", "interp"]) == 0
    out = capsys.readouterr()
    emb = np.asarray(json.loads(out.out.strip().splitlines()[-1]))
    assert emb.shape == (2, 384)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    assert "backend interp" in out.err


def test_generate_streams_and_reports_speed(capsys) -> None:
    from luminal.models import smollm2_path

    _have(smollm2_path)
    argv = ["generate", "Paris is", "--no-chat", "-n", "3", "--backend", "interp", "--ctx", "16"]
    assert main(argv) == 0
    out = capsys.readouterr()
    assert out.out.strip()  # some text came out
    assert "prefill 2 tokens" in out.err and "tok/s" in out.err
    assert "reference interpreter" in out.err


def test_generate_prompt_longer_than_context(capsys) -> None:
    from luminal.models import smollm2_path

    _have(smollm2_path)
    argv = ["generate", "one two three four five six seven", "--no-chat", "--ctx", "4"]
    assert main(argv + ["--backend", "interp"]) == 2
    assert "context limit is 4" in capsys.readouterr().err


def test_missing_model_file_is_a_clear_error(capsys, tmp_path) -> None:
    missing = str(tmp_path / "nope.gguf")
    assert main(["generate", "hi", "--model", missing, "--backend", "interp"]) == 2
    assert "nope.gguf" in capsys.readouterr().err


def test_generate_and_embed_take_any_model_folder(tmp_path, capsys) -> None:
    """``--model`` goes through ``luminal.models.load``: a Qwen3 folder generates what
    transformers generates; a folder of the wrong kind is a clear error."""
    from test_zoo_decoders import PROMPT, _word_tokenizer, hf_greedy, make_hf

    hf = make_hf("qwen3", tmp_path / "qwen3")
    want = hf_greedy(hf, PROMPT, 6)
    _word_tokenizer(tmp_path / "qwen3", eos=0)
    text = " ".join(f"w{t}" for t in PROMPT)
    argv = ["generate", "--model", str(tmp_path / "qwen3"), "--backend", "interp", "--no-chat",
            "--ignore-eos", "-n", "6", text]  # fmt: skip
    assert main(argv) == 0
    assert capsys.readouterr().out.split() == [f"w{t}" for t in want]
    assert main(["embed", "--model", str(tmp_path / "qwen3"), "--backend", "interp", "x"]) == 2
    assert "not a sentence encoder" in capsys.readouterr().err


def test_serve_and_quantize_are_subcommands(tmp_path, capsys) -> None:
    """``luminal serve`` and ``luminal quantize`` reach their modules; bad input is exit 2."""
    out = str(tmp_path / "out.gguf")
    assert main(["quantize", str(tmp_path / "missing.gguf"), "-o", out, "--type", "q8_0"]) == 2
    assert "missing.gguf" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["serve", "--port", "not-a-port"])
