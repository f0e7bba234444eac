"""Memory-bound kernels (issue 4): caller-owned outputs (``Executor.run(..., out=)``), and the
C renderer's short forms of max, exp2 and the row kernels checked against PyTorch on odd sizes,
with infinities and NaN where an exp-like path meets them."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import luminal as lm
import luminal.functional as F


def _compile(g: lm.Graph):  # type: ignore[no-untyped-def]
    return lm.compile(g).executor


def _rand(*shape: int, seed: int = 0, scale: float = 1.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


# ----------------------------------------------------------------------------- run(out=)
def _softmax_executor(rows: int, cols: int):  # type: ignore[no-untyped-def]
    g = lm.Graph("sm_out")
    x = g.input("x", (rows, cols))
    g.output("y", F.softmax(x, -1))
    g.output("s", x.sum_reduce(1))
    return _compile(g)


def test_out_arrays_are_written_and_returned() -> None:
    ex = _softmax_executor(5, 33)
    x = _rand(5, 33)
    want = ex.run({"x": x})
    y = np.full((5, 33), np.nan, np.float32)
    for _ in range(2):  # reused across calls
        got = ex.run({"x": x}, out={"y": y})
        assert got["y"] is y
        np.testing.assert_array_equal(y, want["y"])
        np.testing.assert_array_equal(got["s"], want["s"])  # not given: a new array


@pytest.mark.parametrize(
    "bad, err",
    [
        ({"z": np.empty((5, 33), np.float32)}, "unknown output"),
        ({"y": np.empty((5, 33), np.float64)}, "expected float32"),
        ({"y": np.empty((5, 34), np.float32)}, r"expected float32 \(5, 33\)"),
        ({"y": np.empty((33, 5), np.float32).T}, "C-contiguous"),
        ({"y": [[0.0] * 33] * 5}, "numpy array"),
    ],
)
def test_out_arrays_are_checked(bad: dict, err: str) -> None:
    ex = _softmax_executor(5, 33)
    with pytest.raises((ValueError, TypeError), match=err):
        ex.run({"x": _rand(5, 33)}, out=bad)


def test_out_must_not_alias_an_input_or_be_read_only() -> None:
    ex = _softmax_executor(5, 33)
    x = _rand(5, 33)
    with pytest.raises(ValueError, match="shares memory"):
        ex.run({"x": x}, out={"y": x})
    ro = np.empty((5, 33), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        ex.run({"x": x}, out={"y": ro})


def test_out_array_of_a_raw_dtype() -> None:
    """bf16 crosses the boundary as raw bytes: the caller's bf16 array is written in place."""
    import ml_dtypes

    g = lm.Graph("bf16_out")
    x = g.input("x", (3, 5))
    g.output("y", (x * 2.0).cast(lm.bf16))
    ex = _compile(g)
    xv = _rand(3, 5)
    y = np.empty((3, 5), ml_dtypes.bfloat16)
    assert ex.run({"x": xv}, out={"y": y})["y"] is y
    np.testing.assert_array_equal(y, ex.run({"x": xv})["y"])


# ----------------------------------------------------------------------------- max forms
def test_elementwise_max_edges_match_the_reference() -> None:
    """maximum of two variables (lm_max2f) and against constants (lm_maxcf): NaN from either
    side, infinities, and +0 over -0 whichever side it is on."""
    vals = np.array([np.nan, -np.inf, np.inf, -0.0, 0.0, -1.5, 2.25, 3e38, -1e-45], np.float32)
    a = np.repeat(vals, vals.size)
    b = np.tile(vals, vals.size)
    g = lm.Graph("max_edges")
    ta, tb = g.input("a", a.shape), g.input("b", b.shape)
    g.output("ab", F.maximum(ta, tb))
    g.output("ba", F.maximum(tb, ta))
    g.output("relu", F.relu(ta))
    g.output("clamp", ta.clamp(-1.0, 2.0))
    g.output("hinge", F.maximum(ta, -0.0))
    got = _compile(g).run({"a": a, "b": b})
    ref = g.run({"a": a, "b": b})
    for k, r in ref.items():
        np.testing.assert_array_equal(np.isnan(got[k]), np.isnan(r), err_msg=k)
        ok = ~np.isnan(r)
        np.testing.assert_array_equal(got[k][ok], r[ok], err_msg=k)
        np.testing.assert_array_equal(np.signbit(got[k][ok]), np.signbit(r[ok]), err_msg=k)


# ----------------------------------------------------------------------------- vs PyTorch
@pytest.mark.parametrize("rows, cols", [(7, 1), (3, 17), (11, 257), (5, 4099)])
def test_softmax_matches_torch_with_infinities(rows: int, cols: int) -> None:
    x = _rand(rows, cols, seed=cols, scale=8.0)
    x[0, 0] = -np.inf
    if rows > 3 and cols > 2:
        x[1, :] = -np.inf  # all -inf: NaN in PyTorch too
        x[2, 1] = np.inf  # one +inf: NaN where inf - inf
        x[3, 2] = np.nan
    g = lm.Graph("sm")
    g.output("y", F.softmax(g.input("x", (rows, cols)), -1))
    y = _compile(g).run({"x": x})["y"]
    ref = torch.softmax(torch.from_numpy(x), -1).numpy()
    np.testing.assert_array_equal(np.isnan(y), np.isnan(ref))
    np.testing.assert_allclose(y, ref, rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("cols", [1, 15, 129, 1031])
def test_gelu_chain_matches_torch(cols: int) -> None:
    rows = 9
    x = _rand(rows, cols, seed=cols, scale=4.0)
    x[0, : min(cols, 4)] = np.array([np.inf, -np.inf, np.nan, -0.0], np.float32)[: min(cols, 4)]
    a, b, c = (_rand(cols, seed=k) for k in (1, 2, 3))
    g = lm.Graph("gelu_chain")
    tx = g.input("x", (rows, cols))
    ta, tb, tc = (g.input(n, (cols,)) for n in "abc")
    g.output("y", F.gelu(tx * ta + tb, approximate="tanh") * tc)
    g.output("e", F.gelu(tx, approximate="tanh"))
    got = _compile(g).run({"x": x, "a": a, "b": b, "c": c})
    tt = {k: torch.from_numpy(v) for k, v in {"x": x, "a": a, "b": b, "c": c}.items()}
    ref_y = torch.nn.functional.gelu(tt["x"] * tt["a"] + tt["b"], approximate="tanh") * tt["c"]
    ref_e = torch.nn.functional.gelu(tt["x"], approximate="tanh")
    # tanh's rational form is within 2.4e-7 of 1 near saturation; the chain scales that by c
    for k, r, atol in (("y", ref_y.numpy(), 3e-6), ("e", ref_e.numpy(), 1e-6)):
        np.testing.assert_array_equal(np.isnan(got[k]), np.isnan(r), err_msg=k)
        np.testing.assert_allclose(got[k], r, rtol=1e-5, atol=atol, err_msg=k)


@pytest.mark.parametrize("cols", [3, 67, 1029])
def test_norms_match_torch(cols: int) -> None:
    rows = 13
    x = _rand(rows, cols, seed=cols, scale=3.0) + 1.0
    w, b = _rand(cols, seed=1), _rand(cols, seed=2)
    g = lm.Graph("norms")
    tx, tw, tb = g.input("x", (rows, cols)), g.input("w", (cols,)), g.input("b", (cols,))
    g.output("ln", F.layer_norm(tx, (cols,), tw, tb, 1e-5))
    g.output("rms", F.rms_norm(tx, (cols,), tw, 1e-6))
    got = _compile(g).run({"x": x, "w": w, "b": b})
    t = {k: torch.from_numpy(v) for k, v in {"x": x, "w": w, "b": b}.items()}
    ref_ln = torch.nn.functional.layer_norm(t["x"], (cols,), t["w"], t["b"], 1e-5)
    ref_rms = torch.nn.functional.rms_norm(t["x"], (cols,), t["w"], 1e-6)
    np.testing.assert_allclose(got["ln"], ref_ln.numpy(), rtol=1e-5, atol=2e-5)
    np.testing.assert_allclose(got["rms"], ref_rms.numpy(), rtol=1e-5, atol=2e-5)


def test_exp_of_infinities_and_nan() -> None:
    """exp, sigmoid and tanh (exp2 inside) at the edges, against PyTorch."""
    x = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 88.8, -104.0, 89.0, -87.5, 1e-8], np.float32)
    x = np.concatenate([x, _rand(101, scale=30.0)])
    g = lm.Graph("exps")
    t = g.input("x", x.shape)
    g.output("exp", F.exp(t))
    g.output("sigmoid", F.sigmoid(t))
    g.output("tanh", F.tanh(t))
    got = _compile(g).run({"x": x})
    tx = torch.from_numpy(x)
    for k, r in (("exp", tx.exp()), ("sigmoid", tx.sigmoid()), ("tanh", tx.tanh())):
        r = r.numpy()
        np.testing.assert_array_equal(np.isnan(got[k]), np.isnan(r), err_msg=k)
        np.testing.assert_allclose(got[k], r, rtol=3e-6, atol=1e-30, err_msg=k)


# ----------------------------------------------------------------------------- next-row prefetch
def _kernel_sources(g: lm.Graph) -> list[str]:
    from luminal.codegen.cpu import render_kernel
    from luminal.compiler.lower import lower
    from luminal.compiler.pipeline import graph_passes

    low = lower(graph_passes(g))
    return [render_kernel(k, list(low.dims)).source for k in low.kernels]


@pytest.mark.parametrize("name, carries", [("softmax", True), ("layer_norm", True),
                                           ("rms_norm", False)])  # fmt: skip
def test_second_row_pass_prefetches_the_next_row(name: str, carries: bool) -> None:
    """The pass after the one that streams a row in prefetches the next row a strip at a time;
    RMS norm has no second pass (its element loop is too light to carry it)."""
    cols = 1000
    g = lm.Graph(name)
    x, w, b = g.input("x", (7, cols)), g.input("w", (cols,)), g.input("b", (cols,))
    if name == "softmax":
        g.output("y", F.softmax(x, -1))
    elif name == "layer_norm":
        g.output("y", F.layer_norm(x, (cols,), w, b, 1e-5))
    else:
        g.output("y", F.rms_norm(x, (cols,), w, 1e-6))
    (src,) = _kernel_sources(g)
    body = src[src.index("void k") :]
    assert (body.count("__builtin_prefetch(") == 1) == carries
    if carries:
        assert "lm_nx0 = (const char *)&b1[(1000*i0 + 1000)]" in body


def test_softmax_stages_its_output_in_the_row_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """A staged row whose values come from the row cache is normalized in place there and
    copied out from it: no second row buffer. Checked against PyTorch with the copy-out on."""
    from luminal.codegen.cpu import rows as c_rows

    monkeypatch.setattr(c_rows, "STREAM_BYTES", 0)  # stage every output
    g = lm.Graph("sm_stage")
    g.output("y", F.softmax(g.input("x", (6, 301)), -1))
    (src,) = _kernel_sources(g)
    body = src[src.index("void k") :]
    # the vector loop stores its part straight to the output; the rest is staged in the cache
    assert "lm_st[" not in body
    assert re.search(r"lm_copy_out\(&b0\[\(301\*i0\) \+ (v\d+)\], &lm_rc0\[\1 - 0\],", body)
    x = _rand(6, 301, scale=5.0)
    x[1, 3] = np.inf
    y = _compile(g).run({"x": x})["y"]
    ref = torch.softmax(torch.from_numpy(x), -1).numpy()
    np.testing.assert_array_equal(np.isnan(y), np.isnan(ref))
    np.testing.assert_allclose(y, ref, rtol=2e-6, atol=1e-7)


def test_compiled_graph_run_passes_out() -> None:
    g = lm.Graph("cg_out")
    n = lm.dim("n", 1, 64)
    g.output("y", F.softmax(g.input("x", (n, 9)), -1))
    cg = lm.compile(g)
    x = _rand(5, 9)
    y = np.empty((5, 9), np.float32)
    assert cg.run({"x": x}, out={"y": y}, n=5)["y"] is y
    np.testing.assert_array_equal(y, cg.run({"x": x})["y"])


@pytest.mark.parametrize("shift", [0, 1, 4, 13])
def test_streamed_vector_stores_into_unaligned_outputs(monkeypatch, shift: int) -> None:
    """Streamed output vectors need 64-byte addresses: into a caller's array starting 4*shift
    bytes past one, the first vector of a row is stored plainly and the loop steps to the
    boundary (overlapping it); every element still gets its value, nothing past the row."""
    from luminal.codegen.cpu import rows as c_rows

    monkeypatch.setattr(c_rows, "STREAM_BYTES", 0)  # stream every output
    rows, cols = 5, 181
    g = lm.Graph("sm_unaligned")
    xs = g.input("x", (rows, cols))
    g.output("y", F.softmax(xs, -1) * 2.0 + F.silu(xs))
    x = _rand(rows, cols, scale=4.0)
    x[2, 7] = -np.inf
    base = np.full(rows * cols + 32, 7.0, np.float32)
    y = base[shift : shift + rows * cols].reshape(rows, cols)
    _compile(g).run({"x": x}, out={"y": y})
    t = torch.from_numpy(x)
    ref = (torch.softmax(t, -1) * 2.0 + torch.nn.functional.silu(t)).numpy()
    np.testing.assert_allclose(y, ref, rtol=2e-6, atol=1e-6)
    assert (base[:shift] == 7.0).all() and (base[shift + rows * cols :] == 7.0).all()
