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
