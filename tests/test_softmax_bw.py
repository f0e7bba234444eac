"""Row kernels at bandwidth (issue 21): softmax's exponential pass is one vector loop over the
row that prefetches the next row per step, and streamed outputs are stored by a head loop up
to the first 64-byte boundary, then whole aligned vectors. Checked against numpy at odd sizes,
with input and output arrays off a 64-byte boundary (a numpy array's usual 16 bytes and
odd float offsets), masked rows (-inf, partly and wholly) and NaN."""

from __future__ import annotations

import re

import numpy as np
import pytest

import luminal as lm
import luminal.functional as F
from luminal.codegen.cpu import rows as c_rows


def _body(g: lm.Graph) -> str:
    from luminal.codegen.cpu import render_kernel
    from luminal.compiler.lower import lower
    from luminal.compiler.pipeline import graph_passes

    low = lower(graph_passes(g))
    (src,) = [render_kernel(k, list(low.dims)).source for k in low.kernels]
    return src[src.index("void k") :]


def _softmax_graph(rows: int, cols: int) -> lm.Graph:
    g = lm.Graph("sm_bw")
    g.output("y", F.softmax(g.input("x", (rows, cols)), -1))
    return g


def test_exp_pass_is_one_vector_loop_prefetching_the_next_row() -> None:
    body = _body(_softmax_graph(4096, 4096))
    # one pass over the row: the strip loop runs once, no strip-level prefetch burst
    strip = re.search(r"const int64_t (\w+)_sl = 4096;", body)
    assert strip is not None and "lm_k += 64" not in body
    loop = body[body.index("lm_vexp2f(") :]
    loop = loop[: loop.index("}")]
    assert f"if (lm_pf) __builtin_prefetch(lm_nx0 + {strip[1]} * 4, 0, 3);" in loop
    assert body.count("__builtin_prefetch(") == 1


def test_streamed_stores_are_a_head_then_aligned_vectors() -> None:
    body = _body(_softmax_graph(4096, 4096))
    assert "lm_stream_ok(&b0[(4096*i0) + 0], lm_nt)" in body
    assert "lm_stream_head(" in body
    assert body.count("lm_vstore_out(") == 1  # the head loop's, at most one vector
    assert "lm_vstore_s(" in body


def test_layer_norm_keeps_its_strips() -> None:
    """A scalar second pass (layer norm's squares) keeps the strip loop and its prefetches."""
    g = lm.Graph("ln_bw")
    x, w, b = g.input("x", (64, 1000)), g.input("w", (1000,)), g.input("b", (1000,))
    g.output("y", F.layer_norm(x, (1000,), w, b, 1e-5))
    body = _body(g)
    assert re.search(rf"const int64_t \w+_sl = {c_rows.STRIP};", body) and "lm_k += 64" in body


def _offset(a: np.ndarray, floats: int) -> np.ndarray:
    """A copy of ``a`` at ``floats`` floats past a 64-byte boundary."""
    buf = np.empty(a.size + 16 + floats, np.float32)
    skip = (-(buf.ctypes.data // 4)) % 16
    out = buf[skip + floats : skip + floats + a.size].reshape(a.shape)
    out[...] = a
    assert out.ctypes.data % 64 == 4 * floats
    return out


def _np_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("rows, cols", [(5, 17), (7, 1000), (9, 4099), (3, 64)])
@pytest.mark.parametrize("off_in, off_out", [(0, 0), (4, 4), (1, 3), (0, 15), (3, 0)])
def test_softmax_odd_sizes_and_offsets(
    monkeypatch: pytest.MonkeyPatch, stream: bool, rows: int, cols: int, off_in: int, off_out: int
) -> None:
    if stream:
        monkeypatch.setattr(c_rows, "STREAM_BYTES", 0)  # every output streamed
    ex = lm.compile(_softmax_graph(rows, cols)).executor
    x = np.random.default_rng(rows * cols).standard_normal((rows, cols)).astype(np.float32) * 4
    x[::3, cols // 2 :] = -np.inf  # masked keys
    x[1, :] = -np.inf  # a wholly masked row: NaN, as numpy gives
    if rows > 4:
        x[4, cols // 3] = np.nan
    xin = _offset(x, off_in)
    guard = np.full(rows * cols + 32, 7.0, np.float32)
    skip = (-(guard.ctypes.data // 4)) % 16
    y = guard[skip + off_out : skip + off_out + rows * cols].reshape(rows, cols)
    ex.run({"x": xin}, out={"y": y})
    ref = _np_softmax(x)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(ref))
    ok = ~np.isnan(ref)
    np.testing.assert_allclose(y[ok], ref[ok], rtol=2e-6, atol=1e-7)
    # nothing written around the output
    assert (guard[: skip + off_out] == 7.0).all()
    assert (guard[skip + off_out + rows * cols :] == 7.0).all()


@pytest.mark.parametrize("off", [0, 4, 1])
def test_streamed_elementwise_and_layer_norm_at_offsets(
    monkeypatch: pytest.MonkeyPatch, off: int
) -> None:
    monkeypatch.setattr(c_rows, "STREAM_BYTES", 0)
    rows, cols = 6, 1037
    g = lm.Graph("ln_gelu_bw")
    x, w, b = g.input("x", (rows, cols)), g.input("w", (cols,)), g.input("b", (cols,))
    g.output("ln", F.layer_norm(x, (cols,), w, b, 1e-5))
    g.output("ge", F.gelu(x * w + b, approximate="tanh"))
    ex = lm.compile(g).executor
    rng = np.random.default_rng(off)
    xv, wv, bv = (rng.standard_normal(s).astype(np.float32) for s in ((rows, cols), cols, cols))
    out = {n: _offset(np.zeros((rows, cols), np.float32), off) for n in ("ln", "ge")}
    ex.run({"x": _offset(xv, off), "w": wv, "b": bv}, out=out)
    x64 = xv.astype(np.float64)
    mu = x64.mean(-1, keepdims=True)
    ln = (x64 - mu) / np.sqrt(((x64 - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * wv + bv
    z = x64 * wv + bv
    ge = 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z**3)))
    np.testing.assert_allclose(out["ln"], ln, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out["ge"], ge, rtol=1e-4, atol=1e-5)
