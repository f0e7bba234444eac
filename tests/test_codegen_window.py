"""Padding masks as loop windows (codegen/cpu/kernel.py): a mask affine in the inner index is
the inner loop's bounds, with zeros stored around it, and the outer indices of a thread's tasks
advance like an odometer. The results must equal PyTorch's at odd sizes, at window edges
(empty, partial and full windows, strided reads whose bound needs a floor division) and for
symbolic sizes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import luminal as lm
import luminal.functional as F
from luminal.codegen.cpu import render_kernel
from luminal.compiler.lower import lower
from luminal.compiler.pipeline import graph_passes
from luminal.functional import conv as C
from optest import check_op, rand


def _pad_graph(shape, pads, step):
    g = lm.Graph("pad_window")
    x = g.input("x", shape)
    y = F.pad(x, pads)
    if step > 1:  # every step-th column of the padded rows: the mask's coefficient is step
        y = y[..., ::step]
    g.output("y", y)
    return g


@pytest.mark.parametrize("step", [1, 2, 3])
@pytest.mark.parametrize("pads", [(1, 2), (5, 0), (0, 7), (3, 3, 1, 2)])
def test_pad_windows_match_torch(pads, step):
    shape = (3, 5, 11)
    g = _pad_graph(shape, pads, step)
    low = lower(graph_passes(g))
    srcs = [render_kernel(k, list(low.dims)).source for k in low.kernels]
    # a loop window, or for rows shorter than a vector, one vector of lanes whose loads read
    # only the window's (no per-element test either way)
    assert any("lm_wlo" in s or "lm_vload_f32_lanes(" in s for s in srcs), (
        "the padding mask did not become a loop window"
    )
    check_op(
        "pad_window",
        lambda x: F.pad(x, pads)[..., ::step] if step > 1 else F.pad(x, pads),
        lambda x: TF.pad(x, pads)[..., ::step],
        [rand(*shape)],
    )


@pytest.mark.parametrize(
    "kw", [{"padding": 1}, {"stride": 2, "padding": 2}, {"stride": 3, "padding": 1, "dilation": 2}]
)
def test_padded_conv_symbolic_size(kw):
    h, b = lm.dim("h", 5, 512), lm.dim("b", 1, 64)
    x, w = rand(2, 3, 13, 17), rand(4, 3, 3, 3)
    check_op(
        "conv2d_window",
        lambda x, w: F.relu(C.conv2d(x, w, None, **kw)),
        lambda x, w: torch.relu(TF.conv2d(x, w, None, **kw)),
        [x, w],
        shapes=[(b, 3, h, 17), None],
        more=[[rand(3, 3, 9, 17), w], [rand(1, 3, 5, 17), w]],
        atol=1e-4,
    )


def test_window_empty_and_partial_rows():
    # rows entirely in the padding (the rest of the mask false), rows cut at both ends
    g = lm.Graph("window_rows")
    x = g.input("x", (4, 6))
    g.output("y", F.pad(x, (3, 4, 2, 2)) * 2.0)
    xv = np.arange(24, dtype=np.float32).reshape(4, 6)
    out = lm.compile(g).run({"x": xv})["y"]
    np.testing.assert_array_equal(out, TF.pad(torch.from_numpy(xv), (3, 4, 2, 2)).numpy() * 2)


def test_conv_whose_output_is_empty_at_the_dims_low_end_compiles():
    # at h = 1..4 this conv has no output rows: the search measures at the dim's smallest
    # value too, where the GEMM is empty (0 columns, leading dimension 0): nothing to check
    h = lm.dim("h", 1, 512)
    g = lm.Graph("conv_low_end")
    x, w = g.input("x", (1, 3, h, 17)), g.input("w", (4, 3, 3, 3))
    g.output("y", C.conv2d(x, w, None, stride=3, padding=1, dilation=2))
    cg = lm.compile(g)
    wv = rand(4, 3, 3, 3)
    for hv in (13, 5):
        xv = rand(1, 3, hv, 17)
        want = TF.conv2d(torch.from_numpy(xv), torch.from_numpy(wv), None, 3, 1, 2).numpy()
        np.testing.assert_allclose(cg.run({"x": xv, "w": wv})["y"], want, atol=1e-4)
    assert cg.run({"x": rand(1, 3, 2, 17), "w": wv})["y"].shape == (1, 4, 0, 5)
