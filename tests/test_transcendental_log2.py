"""The CPU kernels' log2 (``lm_log2f``, codegen/cpu/kernel.py) against f64: a dense sweep of
float bit patterns over every positive binade (subnormal inputs included) and the edges
(+-0, negatives, +-inf, NaN), through compiled plans. Rows of 4096 run loops the compiler
vectorizes, rows of 15 scalar code."""

from __future__ import annotations

import numpy as np
import pytest

import luminal as lm

# every positive float is within this of f64 log2 (tools/fit_log2.py: 0.93 in its emulation)
LOG2_MAX_ULP = 0.96

_EDGES = [0.0, -0.0, np.inf, -np.inf, np.nan, -1.0, -1e-45, 1e-45, 1.1754942e-38, 1.1754944e-38,
          1.0, 2.0, 0.5, 0.70710677, 0.7071068, 1.4142135, 1.4142137, 3.4028235e38,
          0.99999994, 1.0000001]  # fmt: skip


def _sweep(count: int) -> np.ndarray:
    step = (1 << 31) // count - 1
    bits = np.arange(1, 0x7F800000, step, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([bits.view(np.float32), np.array(_EDGES, np.float32)])


def _run(x: np.ndarray, cols: int) -> np.ndarray:
    rows = -(-x.size // cols)
    xs = np.resize(x, rows * cols).reshape(rows, cols)
    g = lm.Graph(f"log2_{cols}")
    g.output("y", g.input("x", xs.shape).log2())
    return lm.compile(g).run({"x": xs})["y"].reshape(-1)[: x.size]


@pytest.mark.parametrize("cols", [4096, 15], ids=["vector", "scalar"])
def test_log2_within_its_bound_over_every_binade(cols: int) -> None:
    x = _sweep(1 << 21)
    got = _run(x, cols)
    finite = np.isfinite(x) & (x > 0)
    ref = np.log2(x[finite].astype(np.float64))
    r = ref.astype(np.float32)
    spacing = np.spacing(np.abs(r)).astype(np.float64)
    err = np.abs(got[finite].astype(np.float64) - ref) / spacing
    err[ref == 0] = np.abs(got[finite][ref == 0]) / 2.0**-149
    worst = int(np.argmax(err))
    assert err[worst] <= LOG2_MAX_ULP, (
        f"log2({x[finite][worst]!r}) = {got[finite][worst]!r}, f64 {ref[worst]!r}: "
        f"{err[worst]:.3f} ulp"
    )
    e = dict(zip(_EDGES, got[-len(_EDGES) :].tolist(), strict=True))
    assert e[0.0] == -np.inf and got[-len(_EDGES) + 1] == -np.inf  # +0 and -0
    assert e[np.inf] == np.inf and e[1.0] == 0.0 and e[2.0] == 1.0 and e[0.5] == -1.0
    for v in (-np.inf, -1.0, -1e-45):
        assert np.isnan(e[v]), v
    assert np.isnan(got[-len(_EDGES) + _EDGES.index(np.nan)])
    assert e[1e-45] == -149.0


def test_log2_vectorized_and_scalar_loops_agree() -> None:
    x = _sweep(1 << 19)
    v, s = _run(x, 4096), _run(x, 15)
    nan = np.isnan(v) & np.isnan(s)
    np.testing.assert_array_equal(v[~nan], s[~nan])
