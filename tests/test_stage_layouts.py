"""Staged copies of a convolution's patches (compiler/stage.py) in row order or summed axis
first, chosen by measurement (compiler/search/fusion.py ``choose_layouts``); both layouts
compute the convolution exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import luminal as lm
from kernel_cache import use_kernel_cache
from luminal.compile import build_plan
from luminal.compiler.lower import lower
from luminal.compiler.search.fusion import choose_layouts
from luminal.compiler.search.tuner import Tuner
from luminal.compiler.stage import stage_strided_reads, summed_major_operands
from luminal.functional import conv as C
from luminal.graph.ops import Op
from optest import rand

B = lm.dim("b", 1, 16)


def _conv(stride: int, cin: int = 5, cout: int = 20) -> lm.Graph:
    g = lm.Graph("conv")
    x = g.input("x", (B, cin, 13, 11))
    w = g.weight("w", data=rand(cout, cin, 3, 3))
    g.output("y", C.conv2d(x, w, None, stride=stride, padding=1))
    return g


def _ref(g: lm.Graph, x: np.ndarray, stride: int) -> np.ndarray:
    w = torch.from_numpy(np.asarray(g.weights["w"]))
    return TF.conv2d(torch.from_numpy(x), w, None, stride=stride, padding=1).numpy()


def _copy_shapes(g: lm.Graph) -> list[tuple]:
    return [n.shape for n in g.nodes if n.op is Op.CAST and n.srcs[0][0].dtype is n.dtype]


@pytest.mark.parametrize("stride", [1, 2])
def test_patches_copied_summed_axis_first_match_torch(stride) -> None:
    g = _conv(stride)
    major = summed_major_operands(g)
    assert len(major) == 1, "a conv's patches are read along a row of outputs"
    copies: dict[int, tuple[int, int]] = {}
    staged = stage_strided_reads(g, major, copies)
    assert list(copies.values()) == list(major)
    (shape,) = _copy_shapes(staged)
    assert tuple(shape[:3]) == (5, 3, 3), f"channels and taps lead the copy: {shape}"
    (rows,) = _copy_shapes(stage_strided_reads(g))
    assert tuple(rows[-3:]) == (5, 3, 3), f"the row-order copy ends with a patch: {rows}"
    for b in (1, 3):
        x = rand(b, 5, 13, 11)
        np.testing.assert_allclose(staged.run({"x": x})["y"], _ref(g, x, stride),
                                   rtol=1e-4, atol=1e-4)  # fmt: skip


def test_operands_read_along_the_summed_axis_keep_row_order() -> None:
    seq = lm.dim("seq", 1, 32)
    g = lm.Graph("hm")
    a = g.input("a", (4, seq, 16))
    w = g.weight("w", data=rand(64, 24))
    g.output("y", a.permute(1, 0, 2).reshape(seq, 64).matmul(w))
    assert summed_major_operands(g) == frozenset()


@pytest.mark.parametrize("prefer", ["rows", "columns"])
def test_layout_chosen_by_measurement(prefer, tmp_path, monkeypatch) -> None:
    use_kernel_cache(monkeypatch, tmp_path)
    g = _conv(1)
    major = summed_major_operands(g)
    copies: dict[int, tuple[int, int]] = {}
    low = lower(stage_strided_reads(g))
    alt = lower(stage_strided_reads(g, major, copies))
    seen = []

    def measure(sub, dims):
        side = "columns" if any(b.name.startswith("columns:") for b in sub.buffers) else "rows"
        seen.append(side)
        return 1.0 if side == prefer else 2.0

    def evaluate(sub, dims):
        from luminal.targets import get

        return get("cpu").evaluate(sub, dims)

    chosen = choose_layouts(low, alt, copies, Tuner(measure, "test", evaluate))
    assert set(seen) == {"rows", "columns"}, "both layouts are measured"
    assert chosen == (set(major) if prefer == "columns" else set())
    prog = alt if chosen else low
    ex = lm.load(build_plan(prog, "conv").to_bytes())
    for b in (2, 4):
        x = rand(b, 5, 13, 11)
        np.testing.assert_allclose(ex.run({"x": x})["y"], _ref(g, x, 1), rtol=1e-4, atol=1e-4)


def test_compile_searches_layouts_and_matches_torch(tmp_path, monkeypatch) -> None:
    use_kernel_cache(monkeypatch, tmp_path)
    g = _conv(2, cin=7, cout=24)
    cg = lm.compile(g)
    for b in (1, 5):
        x = rand(b, 7, 13, 11)
        np.testing.assert_allclose(cg.run({"x": x})["y"], _ref(g, x, 2), rtol=1e-4, atol=1e-4)
