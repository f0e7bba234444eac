"""A few hundred mutated plans: each raises PlanError (or loads, when re-sealed), no crash."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def _fuzz_module():
    path = Path(__file__).resolve().parents[1] / "bench" / "fuzz_plan.py"
    spec = importlib.util.spec_from_file_location("fuzz_plan", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_mutated_plans_never_crash() -> None:
    totals = _fuzz_module().run(iterations=400, batch=200, seed=1234)
    assert totals["crashes"] == 0, totals["failures"]
    assert totals["failures"] == [], totals["failures"][:5]
    assert totals["plan_errors"] > 300


def test_example_plan_loads() -> None:
    from luminal import _rt, runtime  # noqa: F401

    plan = _fuzz_module().example_plan()
    loaded = _rt.Plan.from_bytes(plan.to_bytes(), ".")
    assert loaded.num_steps == 3 and [d[0] for d in loaded.dims] == ["seq"]
