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
