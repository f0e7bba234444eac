"""Starting from compiled plans: ``luminal-run`` is a console script that runs the bundled C++
program, and a plan from the plan cache runs through it with no Python."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import luminal

ROOT = Path(__file__).resolve().parents[1]


def test_luminal_run_is_a_console_script() -> None:
    tomllib = pytest.importorskip("tomllib")
    with open(ROOT / "pyproject.toml", "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    assert scripts["luminal-run"] == "luminal.cli:run_native"
    mod, _, fn = scripts["luminal-run"].partition(":")
    assert callable(getattr(__import__(mod, fromlist=[fn]), fn))


def test_luminal_run_script_runs_a_cached_plan(tmp_path: Path) -> None:
    """The script execs the binary: a plan loaded from the plan cache (weights in its own
    weights file) runs and matches numpy."""
    from luminal import plan_cache as pc

    w = np.random.default_rng(0).standard_normal((5, 4000)).astype(np.float32)
    g = luminal.Graph("startup")
    x = g.input("x", (luminal.dim("seq", 1, 16), 5))
    g.output("y", x.matmul(g.weight("w", data=w)))
    cache = pc.PlanCache(tmp_path / "plans")
    key = pc.make_key(pc.graph_fingerprint(g), "cpu", {})
    path, _ = cache.get_or_build(key, lambda: luminal.compile(g, search=False, cache=False).plan)
    assert path.with_suffix(".weights").exists()
    xs = np.random.default_rng(1).standard_normal((3, 5)).astype(np.float32)
    np.save(tmp_path / "x.npy", xs)
    code = (
        "import sys; from luminal.cli import run_native; sys.argv[0] = 'luminal-run'; run_native()"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(path), "--input", f"x={tmp_path / 'x.npy'}",
         "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120, env={**os.environ},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    np.testing.assert_allclose(np.load(tmp_path / "out" / "y.npy"), xs @ w, rtol=1e-4, atol=1e-4)
    bad = subprocess.run([sys.executable, "-c", code, str(tmp_path / "missing.lmp")],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert bad.returncode != 0 and "missing.lmp" in bad.stderr


def _greedy_cpp() -> Path:
    for d in luminal.__path__:
        exe = Path(d) / "bin" / "greedy_decode"
        if exe.is_file():
            return exe
    pytest.skip("the C++ example greedy_decode is not built with this luminal")


def _python_greedy(session, prompt: list[int], n: int) -> list[int]:  # noqa: ANN001
    logits, out = session.forward(prompt), []
    for _ in range(n):
        out.append(int(np.argmax(logits)))
        logits = session.forward([out[-1]])
    return out


def _decode_plan(model, cache_dir: Path) -> tuple[object, Path]:  # noqa: ANN001
    """A session on the decode plan alone, and that plan's file in the plan cache."""
    from luminal.models import LlamaSession
    from luminal.plan_cache import PlanCache

    session = LlamaSession(model, "compiled", prefill_min=None)
    (entry,) = PlanCache(cache_dir).entries()
    return session, entry.path


def test_cpp_example_decodes_like_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The C++ example (csrc/examples/greedy_decode.cpp, luminal.hpp only) loads the cached
    decode plan of a small random Llama and decodes the greedy tokens Python decodes."""
    from luminal.models.base import DictWeights
    from luminal.models.llama import Llama, LlamaConfig

    exe = _greedy_cpp()
    monkeypatch.setenv("LUMINAL_PLAN_CACHE_DIR", str(tmp_path / "plans"))
    monkeypatch.setenv("LUMINAL_SEARCH_BUDGET_S", "0")  # the default kernels: a quick compile
    rng = np.random.default_rng(0)
    cfg = LlamaConfig(vocab_size=67, hidden_size=32, intermediate_size=48, n_layers=2,
                      n_heads=4, n_kv_heads=2, head_dim=8, context_length=48)  # fmt: skip
    shapes = {"token_embd.weight": (67, 32), "output_norm.weight": (32,)}
    for i in range(2):
        p = f"blk.{i}."
        shapes |= {p + "attn_norm.weight": (32,), p + "ffn_norm.weight": (32,),
                   p + "attn_q.weight": (32, 32), p + "attn_k.weight": (16, 32),
                   p + "attn_v.weight": (16, 32), p + "attn_output.weight": (32, 32),
                   p + "ffn_gate.weight": (48, 32), p + "ffn_up.weight": (48, 32),
                   p + "ffn_down.weight": (32, 48)}  # fmt: skip
    ws = {k: (rng.standard_normal(s) * (0.5 if len(s) > 1 else 0.1) + (len(s) == 1))
          .astype(np.float32) for k, s in shapes.items()}  # fmt: skip
    session, plan = _decode_plan(Llama(cfg, DictWeights(ws)), tmp_path / "plans")
    prompt = [5, 17, 3, 42, 8]
    want = _python_greedy(session, prompt, 6)
    out = subprocess.run([str(exe), str(plan), "6", *map(str, prompt)], capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert [int(t) for t in out.stdout.split()] == want
    bad = subprocess.run([str(exe), str(tmp_path / "none.lmp"), "1", "1"], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert bad.returncode == 1 and "none.lmp" in bad.stderr


@pytest.mark.slow
def test_cpp_example_decodes_smollm2_like_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SmolLM2-135M-Instruct: the cached decode plan, decoded greedily from C++, gives the
    tokens LlamaSession gives."""
    from luminal.models import load_gguf, smollm2_path

    exe = _greedy_cpp()
    monkeypatch.setenv("LUMINAL_PLAN_CACHE_DIR", str(tmp_path / "plans"))
    try:
        model, tok = load_gguf(smollm2_path(), max_context=256)
    except FileNotFoundError as e:
        pytest.skip(str(e))
    session, plan = _decode_plan(model, tmp_path / "plans")
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": "What is 2+2?"}]))
    want = _python_greedy(session, prompt, 8)
    out = subprocess.run([str(exe), str(plan), "8", *map(str, prompt)], capture_output=True,
                         text=True, timeout=600)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert [int(t) for t in out.stdout.split()] == want
