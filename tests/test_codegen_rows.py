"""Row kernels on the CPU (codegen/c_rows.py): a row reduction hoisted out of the inner loop
fuses with the reductions it depends on, a costly row-sum body is computed once per element,
and large outputs are staged and streamed. Results must equal the reference interpreter's,
including rows of -inf and NaN."""

from __future__ import annotations

import numpy as np
import pytest

import luminal as lm
import luminal.functional as F
from luminal.codegen.cpu import render_kernel
from luminal.codegen.cpu import rows as c_rows
from luminal.compiler.lower import lower
from luminal.compiler.pipeline import graph_passes


def _graph(name: str, rows: int, cols: int):
    g = lm.Graph(name)
    x = g.input("x", (rows, cols))
    w = g.input("w", (cols,))
    b = g.input("b", (cols,))
    fns = {
        "softmax": lambda: F.softmax(x, -1),
        "log_softmax": lambda: F.log_softmax(x, -1),
        "layer_norm": lambda: F.layer_norm(x, (cols,), w, b, 1e-5),
        "rms_norm": lambda: F.rms_norm(x, (cols,), w, 1e-6),
        "gelu": lambda: F.gelu(x * w + b, approximate="tanh"),
    }
    g.output("y", fns[name]())
    return g


def _inputs(rows: int, cols: int, specials: bool) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(rows * 7919 + cols)
    x = rng.standard_normal((rows, cols), dtype=np.float32) * 3
    if specials and rows >= 4:
        x[0, :] = -np.inf  # softmax: NaN row; log_softmax: NaN row
        x[1, cols // 2] = np.inf
        x[2, 0] = np.nan
        x[3, :] = 0.0
    return {
        "x": x,
        "w": rng.standard_normal(cols, dtype=np.float32),
        "b": rng.standard_normal(cols, dtype=np.float32),
    }


def _sources(g: lm.Graph) -> list[str]:
    low = lower(graph_passes(g))
    return [render_kernel(k, list(low.dims)).source for k in low.kernels]


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "layer_norm", "rms_norm"])
def test_row_reductions_fuse_into_one_kernel(name):
    # the row max (mean) is hoisted out of the row sum's loop: no pass of its own over memory
    assert len(lower(graph_passes(_graph(name, 6, 50))).kernels) == 1


def test_softmax_exponentials_computed_once():
    (src,) = _sources(_graph("softmax", 6, 50))
    # the sum loop writes exp values into the row cache; the element loop only reads them
    body = src[src.index("void k") :]
    assert "lm_rc0[" in body
    assert body.count("lm_exp2f(") == 1


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("name", ["softmax", "log_softmax", "layer_norm", "rms_norm", "gelu"])
@pytest.mark.parametrize("rows,cols", [(5, 783), (9, 50), (4, 4096)])
def test_row_kernels_match_reference(monkeypatch, name, rows, cols, stream):
    if stream:
        # every output counts as large: staged runs, non-temporal copy-out (unaligned heads)
        monkeypatch.setattr(c_rows, "STREAM_BYTES", 0)
    g = _graph(name, rows, cols)
    srcs = _sources(g)
    assert any("lm_copy_out(" in s[s.index("void k") :] for s in srcs) == stream
    inputs = _inputs(rows, cols, specials=name != "gelu")
    ref = g.run(inputs)["y"]
    out = lm.compile(g, search=False).run(inputs)["y"]
    np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-6, equal_nan=True)
    assert np.array_equal(np.isnan(out), np.isnan(ref))
