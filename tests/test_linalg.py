import numpy as np
import pytest
import torch

import luminal as lm
from luminal.functional import linalg as LA
from optest import check_op, rand

seq = lm.dim("seq", 1, 4096)


@pytest.mark.parametrize(
    "sa,sb",
    [
        ((3, 50), (50, 7)),  # mm
        ((50,), (50,)),  # dot
        ((50,), (50, 3)),  # vector @ matrix
        ((3, 50), (50,)),  # matrix @ vector
        ((2, 3, 5), (5, 4)),  # batched @ matrix
        ((5,), (2, 5, 4)),  # vector @ batch
        ((2, 1, 3, 5), (4, 5, 7)),  # broadcast batch dims
        ((1, 1), (1, 1)),
    ],
)
def test_matmul_shapes(sa, sb):
    check_op("matmul", LA.matmul, torch.matmul, [rand(*sa), rand(*sb)])


def test_matmul_large_odd():
    check_op("matmul", LA.matmul, torch.matmul, [rand(3, 783), rand(783, 5)], atol=1e-4)


def test_matmul_noncontiguous_and_dtypes():
    check_op(
        "matmul",
        lambda a, b: LA.matmul(a.permute(1, 0), b.slice(1, 1, 3, 2)),
        lambda a, b: a.T @ b[:, 1:7:2],
        [rand(5, 3), rand(5, 8)],
    )
    check_op(
        "matmul",
        LA.matmul,
        torch.matmul,
        [rand(4, 6, dtype=np.int32, low=-5, high=5), rand(6, 3, dtype=np.int32, low=-5, high=5)],
    )
    check_op(
        "matmul",
        LA.matmul,
        torch.matmul,
        [rand(4, 6, dtype=np.float16), rand(6, 3, dtype=np.float16)],
        atol=1e-2,
        rtol=1e-2,
    )


def test_matmul_symbolic():
    check_op(
        "matmul",
        LA.matmul,
        torch.matmul,
        [rand(2, 7, 16), rand(16, 9)],
        shapes=[(2, seq, 16), None],
        more=[[rand(2, 1, 16), rand(16, 9)], [rand(2, 300, 16), rand(16, 9)]],
        atol=1e-4,
    )


def test_mm_bmm_mv_dot_outer():
    check_op("mm", LA.mm, torch.mm, [rand(3, 5), rand(5, 4)])
    check_op("bmm", LA.bmm, torch.bmm, [rand(2, 3, 5), rand(2, 5, 4)])
    check_op("mv", LA.mv, torch.mv, [rand(3, 5), rand(5)])
    check_op("dot", LA.dot, torch.dot, [rand(50), rand(50)])
    check_op("outer", LA.outer, torch.outer, [rand(3), rand(5)])


def test_linear():
    w, b = rand(7, 50), rand(7)
    check_op("linear", LA.linear, torch.nn.functional.linear, [rand(2, 3, 50), w, b])
    check_op("linear", LA.linear, torch.nn.functional.linear, [rand(50), w])
    check_op("linear", LA.linear, torch.nn.functional.linear, [rand(3, 50), rand(50)])
    check_op(
        "linear",
        LA.linear,
        torch.nn.functional.linear,
        [rand(7, 16), rand(4, 16), rand(4)],
        shapes=[(seq, 16), None, None],
        more=[[rand(1, 16), rand(4, 16), rand(4)]],
    )


def test_addmm_baddbmm():
    check_op(
        "addmm",
        lambda i, a, b: LA.addmm(i, a, b, beta=0.5, alpha=2.0),
        lambda i, a, b: torch.addmm(i, a, b, beta=0.5, alpha=2.0),
        [rand(4), rand(3, 5), rand(5, 4)],
    )
    check_op("baddbmm", LA.baddbmm, torch.baddbmm, [rand(2, 3, 4), rand(2, 3, 5), rand(2, 5, 4)])


@pytest.mark.parametrize(
    "eq,shapes",
    [
        ("ij,jk->ik", [(3, 5), (5, 4)]),
        ("bij,bjk", [(2, 3, 5), (2, 5, 4)]),
        ("i,i->", [(7,), (7,)]),
        ("ij->ji", [(3, 4)]),
        ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]),
        ("...ij,...jk->...ik", [(2, 3, 4), (4, 5)]),
        ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
        ("ij->", [(3, 4)]),
    ],
)
def test_einsum(eq, shapes):
    check_op(
        "einsum",
        lambda *xs: LA.einsum(eq, *xs),
        lambda *xs: torch.einsum(eq, *xs),
        [rand(*s) for s in shapes],
    )


def test_bad_shapes():
    g = lm.Graph()
    a, b = g.input("a", (3, 4)), g.input("b", (5, 6))
    with pytest.raises(
        ValueError, match=r"matmul: shapes \(3, 4\) and \(5, 6\).*inner dims 4 and 5"
    ):
        LA.matmul(a, b)
    with pytest.raises(ValueError, match="matmul: shapes"):
        LA.matmul(g.input("c", (2, 3, 4)), g.input("d", (3, 4, 2)))
    with pytest.raises(ValueError, match=r"linear: input \(3, 4\) and weight \(5, 6\)"):
        LA.linear(a, b)
    with pytest.raises(ValueError, match="bmm: expected"):
        LA.bmm(a, b)
    with pytest.raises(ValueError, match="matmul: both arguments"):
        LA.matmul(g.constant(1.0), a)
    with pytest.raises(ValueError, match="einsum: label 'j' has sizes"):
        LA.einsum("ij,jk->ik", a, b)
    with pytest.raises(ValueError, match="repeated label"):
        LA.einsum("ii->i", g.input("e", (3, 3)))
    # a symbolic inner dim must be the same dim on both sides
    with pytest.raises(ValueError, match="inner dims"):
        LA.matmul(g.input("f", (3, seq)), g.input("h", (lm.dim("other", 1, 10), 2)))
