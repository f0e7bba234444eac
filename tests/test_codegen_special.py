"""The C renderer's vectorizable forms keep the reference semantics at the edges: lm_exp2f
(inf, -inf, NaN, subnormal results), the integer-key float max (NaN propagates, -inf for an
all -inf row), and reductions over 2-4 values written out."""

import numpy as np

import luminal as lm
import luminal.functional as F


def _run(g, **inputs):
    return lm.compile(g).run(inputs)


def test_exp2_edges_match_numpy():
    edges = [np.inf, -np.inf, np.nan, 0.0, -0.0, 1.0, -1.0, 127.9, 128.0, 200.0, -126.5]
    edges += [-149.0, -149.6, -150.0, -160.0, 0.3, -7.77, 30.5]
    x = np.array(edges, np.float32)
    x = np.concatenate([x, np.random.default_rng(0).uniform(-140, 120, 977).astype(np.float32)])
    g = lm.Graph("exp2")
    t = g.input("x", x.shape)
    g.output("y", t.exp2())
    y = _run(g, x=x)["y"]
    with np.errstate(over="ignore"):  # exp2(200) overflows f32 to inf, as it should
        ref = np.exp2(x.astype(np.float64)).astype(np.float32)
    assert np.array_equal(np.isnan(y), np.isnan(ref))
    fin = ~np.isnan(ref)
    np.testing.assert_allclose(y[fin], ref[fin], rtol=3e-7, atol=1e-45)


def test_row_max_propagates_nan_and_keeps_minus_inf():
    x = np.random.default_rng(1).standard_normal((5, 37)).astype(np.float32)
    x[1, 17] = np.nan
    x[2, :] = -np.inf
    x[3, 5] = np.inf
    x[4, :] = -0.0
    g = lm.Graph("rowmax")
    t = g.input("x", x.shape)
    g.output("y", t.max_reduce(1))
    y = _run(g, x=x)["y"]
    assert np.isnan(y[1]) and y[2] == -np.inf and y[3] == np.inf and y[4] == 0.0
    np.testing.assert_array_equal(y[0], x[0].max())


def test_clamp_and_relu_with_nan_and_infinities():
    x = np.array([[np.nan, -np.inf, np.inf, -3.0, 0.5, 7.0, -0.0]], np.float32)
    g = lm.Graph("clamp")
    t = g.input("x", x.shape)
    g.output("r", F.relu(t))
    g.output("c", t.clamp(-1.0, 2.0))
    out = _run(g, x=x)
    ref = g.run({"x": x})  # the reference interpreter
    for k in ("r", "c"):
        np.testing.assert_array_equal(np.isnan(out[k]), np.isnan(ref[k]))
        np.testing.assert_array_equal(out[k][~np.isnan(ref[k])], ref[k][~np.isnan(ref[k])])
