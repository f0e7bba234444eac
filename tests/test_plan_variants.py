"""Plans with variants chosen by a bound dim (format version 3, ``Step.when``): two compiled
programs of one signature merged by ``luminal.plan.by_dim`` run exactly one of them per call,
share inputs, outputs and in-place state, and survive a save and a fresh load."""

import numpy as np
import pytest

import luminal as lm
from luminal.graph import dtypes as dt
from luminal.graph.ops import Op
from luminal.graph.view import idx_vars
from luminal.plan import Plan, PlanError, by_dim
from luminal.runtime import Executor
from luminal.tensor import Tensor
from optest import rand

N = lm.dim("n", 1, 64)


def _graph(scale: float, shift: float, n=N) -> lm.Graph:
    """y = x * w + shift, and the rows of x written into a state (rows 0..n-1) in place."""
    g = lm.Graph(f"v{scale}")
    x = g.input("x", (n, 7))
    state = g.input("state", (64, 7))
    w = g.weight("w", data=np.full((7,), scale, np.float32))
    g.output("y", x.mul(w.expand((n, 7))).add(shift))
    rows = Tensor(g.add_op(Op.IOTA, [], arg=idx_vars((n,))[0], shape=(n,), dtype=dt.i32))
    written = Tensor(g.add_op(Op.SCATTER, [state.edge, rows.edge, x.mul(scale).edge]))
    g.output("state_new", written, updates="state")
    return g


@pytest.fixture(scope="module")
def merged() -> Plan:
    a, b = lm.compile(_graph(2.0, 0.0)).plan, lm.compile(_graph(3.0, 1.0)).plan
    return by_dim([a, b], "n", [1, 16])


@pytest.mark.parametrize("rows, scale, shift", [(1, 2.0, 0.0), (15, 2.0, 0.0), (16, 3.0, 1.0),
                                                (41, 3.0, 1.0)])  # fmt: skip
def test_one_variant_runs_per_call(merged, tmp_path, rows, scale, shift):
    path = tmp_path / "m.lmp"
    merged.save(path)
    ex = Executor(path)
    x, state = rand(rows, 7), rand(64, 7)
    want = state.copy()
    want[:rows] = x * scale
    out = ex.run({"x": x, "state": state})
    np.testing.assert_allclose(out["y"], x * scale + shift, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(state, want, rtol=1e-6)  # the variant's update, in place
    assert out["state_new"] is state


def test_conditions_in_the_file_and_profile(merged):
    plan = Plan.from_bytes(merged.to_bytes())
    assert all(s.when is not None for s in plan.steps)
    assert "when" in plan.describe() and plan.metadata["variants"] == "n: [1, 16), [16, 65)"
    ex = Executor(plan)
    ex.set_profiling(True)
    ex.run({"x": rand(3, 7), "state": rand(64, 7)})
    calls = [r["calls"] for r in ex.profile()]
    names = [plan.kernels[getattr(s, "kernel", 0)].name for s in plan.steps]
    n_first = len([n for n in names if not n.startswith("v1/")])
    assert sum(calls[:n_first]) > 0 and sum(calls[n_first:]) == 0  # only the first variant ran


def test_by_dim_refuses_what_it_cannot_merge():
    a = lm.compile(_graph(2.0, 0.0)).plan
    g = lm.Graph("other")
    g.output("y", g.input("x", (N, 7)).mul(2.0))
    other = lm.compile(g).plan
    with pytest.raises(PlanError, match="other inputs or outputs"):
        by_dim([a, other], "n", [1, 16])
    with pytest.raises(ValueError, match="must increase"):
        by_dim([a, a], "n", [2, 16])
    with pytest.raises(ValueError, match="no dim 'm'"):
        by_dim([a, a], "m", [1, 16])


def test_each_variant_compiled_for_its_part_of_the_range():
    """The long-step variant compiled for n >= 16 only (its search measured there); the merged
    plan's range is the union."""
    a = lm.compile(_graph(2.0, 0.0)).plan
    b = lm.compile(_graph(3.0, 1.0, lm.dim("n", 16, 64))).plan
    m = by_dim([a, b], "n", [1, 16])
    assert [(d.name, d.min, d.max) for d in m.dims] == [("n", 1, 64)]
    ex = Executor(m)
    for rows, scale, shift in ((3, 2.0, 0.0), (30, 3.0, 1.0)):
        x = rand(rows, 7)
        out = ex.run({"x": x, "state": rand(64, 7)})
        np.testing.assert_allclose(out["y"], x * scale + shift, rtol=1e-6, atol=1e-6)
    with pytest.raises(PlanError, match=r"runs n in \[8, 64\] but was compiled for \[16, 64\]"):
        by_dim([a, b], "n", [1, 8])
