"""Sorting and order statistics (functional/ordering.py) against PyTorch: odd sizes, ties,
NaN, signed zeros, integers; logcumsumexp with -inf and inf."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import numpy as np
import pytest
import torch

import luminal as lm
import luminal.functional as F
from optest import check_op, rand


def _with_ties_and_nans(*shape: int) -> np.ndarray:
    a = rand(*shape, low=-3, high=3)
    flat = a.reshape(-1)
    flat[::7] = 0.5  # ties
    flat[3::11] = np.nan
    flat[5::13] = -0.0
    return a


@pytest.mark.parametrize("dim,descending", [(1, False), (-1, True), (0, True)])
def test_sort_stable_order(dim, descending):
    a = _with_ties_and_nans(3, 50, 7)

    def ref(x):
        return tuple(torch.sort(x, dim=dim, descending=descending, stable=True))

    check_op("sort", lambda x: tuple(F.sort(x, dim, descending)), ref, [a])


def test_sort_integers_and_argsort():
    a = rand(5, 37, dtype=np.int64, low=-4, high=4)  # many ties
    check_op("argsort", lambda x: F.argsort(x, 1),
             lambda x: torch.sort(x, dim=1, stable=True)[1], [a])  # fmt: skip


def test_topk_kthvalue():
    a = rand(4, 29, 3)
    check_op("topk", lambda x: tuple(F.topk(x, 5, 1)), lambda x: tuple(torch.topk(x, 5, 1)), [a])
    check_op("topk_smallest", lambda x: tuple(F.topk(x, 2, -1, largest=False)),
             lambda x: tuple(torch.topk(x, 2, -1, largest=False)), [a])  # fmt: skip
    check_op("kthvalue", lambda x: tuple(F.kthvalue(x, 7, 1, keepdim=True)),
             lambda x: tuple(torch.kthvalue(x, 7, 1, keepdim=True)), [a])  # fmt: skip


def test_median_nanmedian():
    a = rand(6, 31)
    a[1, 4] = a[1, 9] = np.nan
    b = a.copy()
    b[3, :] = np.nan  # nanmedian's index in such a row is PyTorch's nth_element's, unchecked
    check_op("median", lambda x: tuple(F.median(x, 1)), lambda x: tuple(torch.median(x, 1)), [b])
    for name, f, t in (("median", F.median, torch.median), ("nanmedian", F.nanmedian,
                                                            torch.nanmedian)):  # fmt: skip
        check_op(name, lambda x, f=f: tuple(f(x, 1)), lambda x, t=t: tuple(t(x, 1)), [a])
        check_op(name + "_all", lambda x, f=f: f(x), lambda x, t=t: t(x), [a], more=[[a * 0 + 1]])


def test_logcumsumexp():
    b = rand(5, 77, low=-40, high=40)
    b[1, 3] = -np.inf
    b[2, :] = -np.inf
    b[3, 10] = np.inf
    b[4, 20] = np.nan
    check_op("logcumsumexp", lambda x: F.logcumsumexp(x, 1),
             lambda x: torch.logcumsumexp(x, 1), [b])  # fmt: skip


def test_sort_limits_are_errors():
    g = lm.Graph()
    with pytest.raises(ValueError, match="at most"):
        F.sort(g.input("x", (F.MAX_SORT + 1,)))
    with pytest.raises(ValueError, match="static size"):
        F.topk(g.input("y", (lm.dim("n", 1, 64),)), 1)
    with pytest.raises(ValueError, match="out of range"):
        F.topk(g.input("z", (5,)), 6)


def test_sort_along_a_symbolic_axis():
    # a mixture of experts sorts its token-expert pairs by expert id: a symbolic length
    # full of ties, in a stable order
    g = lm.Graph()
    n = lm.dim("n", 1, 256)
    x = g.input("x", (2, n))
    v, i = F.sort(x, -1, descending=True)
    g.output("v", v)
    g.output("i", i)
    cg = lm.compile(g)
    for length in (1, 19, 77):
        a = _with_ties_and_nans(2, length)
        got = cg.run({"x": a})
        want = torch.sort(torch.from_numpy(a), dim=-1, descending=True, stable=True)
        np.testing.assert_array_equal(got["v"], want.values.numpy())
        np.testing.assert_array_equal(got["i"], want.indices.numpy())
