"""compiler/stage.py: an operand of a summed product read through a div/mod split of the summed
axis, and shared across output rows, is copied contiguously once; results stay exact."""

from __future__ import annotations

import numpy as np
import pytest

import luminal as lm
from luminal.compiler.stage import stage_strided_reads, strided_sum_operands
from luminal.graph.ops import Op

RNG = np.random.default_rng(0)


def _head_major_matmul(heads: int, hd: int, n: int) -> tuple[lm.Graph, np.ndarray]:
    """(heads, seq, hd) read as (seq, heads * hd), times a (heads * hd, n) weight."""
    seq = lm.dim("seq", 1, 32)
    g = lm.Graph("hm")
    a = g.input("a", (heads, seq, hd))
    w = RNG.standard_normal((heads * hd, n)).astype(np.float32)
    x = a.permute(1, 0, 2).reshape(seq, heads * hd)
    g.output("y", x.matmul(g.weight("w", data=w)))
    return g, w


def _copies(g: lm.Graph) -> int:
    return sum(1 for n in g.nodes if n.op is Op.CAST and n.srcs[0][0].dtype is n.dtype)


@pytest.mark.parametrize(("heads", "hd", "n", "seq"), [(3, 24, 40, 1), (5, 12, 17, 7)])
def test_head_major_operand_is_copied_once_and_matches(heads, hd, n, seq) -> None:
    g, w = _head_major_matmul(heads, hd, n)
    assert len(strided_sum_operands(g)) == 1
    staged = stage_strided_reads(g)
    assert _copies(staged) == 1
    a = RNG.standard_normal((heads, seq, hd)).astype(np.float32)
    ref = a.transpose(1, 0, 2).reshape(seq, heads * hd) @ w
    np.testing.assert_allclose(staged.run({"a": a})["y"], ref, rtol=1e-5, atol=1e-5)
    cg = lm.compile(g)
    assert any("cast" in k.name for k in cg.plan.kernels)  # the copy is its own kernel
    np.testing.assert_allclose(cg.run({"a": a})["y"], ref, rtol=1e-5, atol=1e-5)


def test_contiguous_and_index_split_of_other_axes_are_not_staged() -> None:
    g = lm.Graph("plain")
    x = g.input("x", (4, 48))
    g.output("y", x.matmul(g.weight("w", data=np.ones((48, 8), np.float32))))
    assert strided_sum_operands(g) == {} and stage_strided_reads(g) is g
    # grouped heads: the kv head is h // 3, a split of an output axis, not of the summed one
    g2 = lm.Graph("gqa")
    q = g2.input("q", (6, 5, 16))
    k = g2.input("k", (2, 5, 16))
    kk = k.reshape(2, 1, 5, 16).expand(2, 3, 5, 16).reshape(6, 5, 16)
    g2.output("s", q.matmul(kk.permute(0, 2, 1)))
    assert strided_sum_operands(g2) == {}


def test_weights_and_rarely_reused_operands_are_left_alone() -> None:
    g = lm.Graph("w")
    x = g.input("x", (2, 96))
    w = g.weight("w", data=RNG.standard_normal((4, 24, 8)).astype(np.float32))
    g.output("y", x.matmul(w.permute(1, 0, 2).reshape(96, 8)))  # strided weight: repacked later
    assert strided_sum_operands(g) == {}
    g2 = lm.Graph("few")
    a = g2.input("a", (3, 2, 8))
    b = g2.input("b", (24, 4))
    g2.output("y", a.permute(1, 0, 2).reshape(2, 24).matmul(b))  # each value read 4 times
    assert strided_sum_operands(g2) == {}


def test_flag_turns_the_pass_off(monkeypatch) -> None:
    from luminal.compiler.pipeline import STAGES

    names = [s.name for s in STAGES]
    assert names.index("egraph") < names.index("stage") < names.index("lower")
    monkeypatch.setenv("LUMINAL_STAGE", "0")
    g, w = _head_major_matmul(3, 16, 20)
    cg = lm.compile(g)
    assert not any("cast" in k.name for k in cg.plan.kernels)
    a = RNG.standard_normal((3, 2, 16)).astype(np.float32)
    ref = a.transpose(1, 0, 2).reshape(2, 48) @ w
    np.testing.assert_allclose(cg.run({"a": a})["y"], ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("symbolic", [False, True])
def test_patches_of_an_upsampled_image_copy_whole_rows(symbolic) -> None:
    """A 3x3 conv after a 2x nearest upsample reads its image at (tap + column) // 2: no split
    of the column makes that read affine, so the copy's innermost loop runs over whole rows
    (or whole patches) rather than a 2-long part of each, in either layout, and the result is
    exact."""
    import torch

    from luminal.compiler.stage import summed_major_operands

    s = lm.dim("s", 2, 64)
    g = lm.Graph("up_conv")
    h = s // 2 if symbolic else 5
    x = g.input("x", (2, 5, h, h))
    up = x.reshape(2, 5, h, 1, h, 1).expand(2, 5, h, 2, h, 2).reshape(2, 5, 2 * h, 2 * h)
    w = g.input("w", (32, 5, 3, 3))
    g.output("y", lm.functional.conv2d(up, w, padding=1))
    xv = RNG.standard_normal((2, 5, 5, 5)).astype(np.float32)
    wv = RNG.standard_normal((32, 5, 3, 3)).astype(np.float32)
    up_t = torch.nn.functional.interpolate(torch.tensor(xv), scale_factor=2.0, mode="nearest")
    want = torch.nn.functional.conv2d(up_t, torch.tensor(wv), padding=1).numpy()
    dims = {"s": 10} if symbolic else {}
    for major in (frozenset(), summed_major_operands(g)):
        staged = stage_strided_reads(g, major)
        copies = [n for n in staged.nodes if n.op is Op.CAST]
        assert len(copies) == 1
        assert copies[0].shape[-1] in (45, 2 * h), copies[0].shape
        got = lm.compile(staged).run({"x": xv, "w": wv}, **dims)["y"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
