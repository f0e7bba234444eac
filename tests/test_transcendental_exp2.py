"""The CPU kernels' exp2 and reciprocal against f64 (issue 21; bounds in docs/cpu-kernels.md):
a dense sweep of float bit patterns over exp2's whole range (subnormal and overflowing
results included) and the edges (+-0, +-inf, NaN, subnormal inputs), through compiled plans.
A row of 4096 runs the vector form (``lm_vexp2f``, AVX-512's where the compiler targets it),
rows of 15 (shorter than a vector) the scalar form ``lm_exp2f``."""

from __future__ import annotations

import numpy as np
import pytest

import luminal as lm

# every float in [-152, 130] is within this of f64 exp2 (tools/exp2_ulp.py: 0.952 for both forms)
EXP2_MAX_ULP = 0.96

_EDGES = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1.1754942e-38, 1e-30, -1e-30,
          127.99999, 128.0, 128.5, 129.0, 130.0, 3e38, -3e38, -125.5, -126.0, -126.5, -149.0,
          -149.5, -150.0, -150.5, -151.0, -160.0, 0.5, -0.5, 1.0, 2.0, 88.7, -87.3]  # fmt: skip


def _sweep(lo: float, hi: float, count: int) -> np.ndarray:
    """About ``count`` floats of [lo, hi] evenly spaced in bit pattern (so every binade, the
    tiny arguments near 0 included, gets its share; an odd step, so the low mantissa bits
    vary too), plus the edges."""
    step = (1 << 32) // count - 1
    bits = np.arange(0, 1 << 32, step, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    x = x[np.isfinite(x) & (x >= lo) & (x <= hi)]
    return np.concatenate([x, np.array(_EDGES, np.float32)])


def _ulps(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """|got - ref| in units of the last place of ref rounded to f32 (subnormal spacing below
    the normal range); 0 where both are the same infinity (a ref past f32's range rounds to
    one), inf where one is NaN alone."""
    with np.errstate(over="ignore", invalid="ignore"):
        r = ref.astype(np.float32)
        ref = np.where(np.isinf(r), r.astype(np.float64), ref)
        spacing = np.spacing(np.abs(r)).astype(np.float64)
        spacing = np.maximum(spacing, 2.0**-149)
        err = np.abs(got.astype(np.float64) - ref) / spacing
    same_inf = np.isinf(got) & np.isinf(ref) & (np.sign(got) == np.sign(ref))
    err[same_inf] = 0.0
    err[(np.isinf(ref) | np.isinf(got)) & ~same_inf] = np.inf
    nan_got, nan_ref = np.isnan(got), np.isnan(ref)
    err[nan_got & nan_ref] = 0.0
    err[nan_got ^ nan_ref] = np.inf
    return err


def _run(op: str, x: np.ndarray, cols: int) -> np.ndarray:
    rows = -(-x.size // cols)
    xs = np.resize(x, rows * cols).reshape(rows, cols)
    g = lm.Graph(f"{op}_{cols}")
    t = g.input("x", xs.shape)
    g.output("y", t.exp2() if op == "exp2" else t.reciprocal())
    y = lm.compile(g).run({"x": xs})["y"]
    return y.reshape(-1)[: x.size]


@pytest.mark.parametrize("cols", [4096, 15], ids=["vector", "scalar"])
def test_exp2_within_its_bound_over_the_whole_range(cols: int) -> None:
    x = _sweep(-152.0, 130.0, 1 << 21)
    got = _run("exp2", x, cols)
    with np.errstate(over="ignore"):
        ref = np.exp2(x.astype(np.float64))
    err = _ulps(got, ref)
    worst = int(np.argmax(err))
    assert err[worst] <= EXP2_MAX_ULP, f"exp2({x[worst]!r}) = {got[worst]!r}, f64 {ref[worst]!r}"
    # the edges exactly as exp2f gives them
    e = got[-len(_EDGES) :]

    def at(v: float) -> float:
        return float(e[next(i for i, u in enumerate(_EDGES) if u == v)])

    assert np.isnan(e[_EDGES.index(np.nan)])
    assert at(np.inf) == np.inf and at(-np.inf) == 0.0 and at(128.0) == np.inf
    assert at(0.0) == 1.0 and at(1e-45) == 1.0 and at(-1e-45) == 1.0 and e[1] == 1.0
    assert at(-160.0) == 0.0 and at(3e38) == np.inf and at(-3e38) == 0.0
    assert at(-149.0) == 2.0**-149 and at(-126.0) == 2.0**-126


def test_exp2_vector_and_scalar_forms_agree() -> None:
    """The vector form computes the scalar form's polynomial: the same results, so a row's
    vector part and its scalar rest never disagree."""
    x = _sweep(-152.0, 130.0, 1 << 20)
    v, s = _run("exp2", x, 4096), _run("exp2", x, 15)
    both_nan = np.isnan(v) & np.isnan(s)
    np.testing.assert_array_equal(v[~both_nan], s[~both_nan])


@pytest.mark.parametrize("cols", [4096, 15], ids=["vector", "scalar"])
def test_reciprocal_is_correctly_rounded(cols: int) -> None:
    """1/x is the IEEE division (vdivps), not an estimate: at most half an ulp, and the
    edges (+-0 -> +-inf, +-inf -> +-0, subnormal x -> inf, NaN) as IEEE gives them."""
    x = _sweep(-3.4e38, 3.4e38, 1 << 20)
    got = _run("recip", x, cols)
    with np.errstate(divide="ignore", over="ignore"):
        ref = 1.0 / x.astype(np.float64)
    assert _ulps(got, ref).max() <= 0.5
    with np.errstate(divide="ignore", over="ignore"):
        want = (np.float32(1.0) / x).astype(np.float32)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan], want[~nan])
