"""CPU codegen: a masked value of arithmetic alone (each side of a ``where`` over computed
values) is computed everywhere and selected by its mask, so its loop is straight-line code;
a masked read (a padded window) keeps its guard. Values checked against numpy, the edges
(+-inf, NaN, both sides' overflow) included."""

from __future__ import annotations

import numpy as np

import luminal as lm
import luminal.functional as F


def _kernels(cg: lm.CompiledGraph) -> str:
    return "\n".join(k.code.decode().split("#endif /* LM_PRELUDE */")[-1] for k in cg.plan.kernels)


def test_where_of_computed_sides_has_no_branch_and_is_exact() -> None:
    g = lm.Graph("softplus_where")
    x = g.input("x", (3, 37))
    g.output("y", F.where(x > 20.0, x, (x.exp() + 1.0).log()))
    cg = lm.compile(g)
    body = _kernels(cg)
    assert "lm_bits_f32(lm_f32_bits(" in body
    assert "if (" not in body.split("for (int64_t i1")[-1].split("++i0")[0]
    xs = np.random.default_rng(0).uniform(-5, 30, (3, 37)).astype(np.float32)
    xs[0, :6] = [np.inf, -np.inf, np.nan, 88.0, 100.0, -0.0]
    got = cg.run({"x": xs})["y"]
    with np.errstate(over="ignore"):
        want = np.where(xs > 20, xs, np.log1p(np.exp(xs.astype(np.float64)))).astype(np.float32)
    np.testing.assert_allclose(got, want, rtol=3e-6, atol=1e-6)
    assert np.isnan(got[0, 2]) and got[0, 0] == np.inf and got[0, 1] == 0.0


def test_a_padded_read_keeps_its_guard() -> None:
    g = lm.Graph("pad_exp")
    x = g.input("x", (4, 9))
    g.output("y", F.pad(x, (2, 3)).exp())
    cg = lm.compile(g)
    xs = np.random.default_rng(1).standard_normal((4, 9)).astype(np.float32)
    got = cg.run({"x": xs})["y"]
    np.testing.assert_allclose(got, np.exp(np.pad(xs, ((0, 0), (2, 3)))), rtol=2e-6)
