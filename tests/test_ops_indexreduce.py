"""scatter_reduce / index_reduce (functional/indexreduce.py) against PyTorch: colliding
indices, positions no index reaches, an index shorter than the input in other dims."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import numpy as np
import pytest

import luminal as lm
import luminal.functional as F
from optest import RNG, check_op, rand

REDUCES = ("sum", "prod", "mean", "amax", "amin")


@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(include_self):
    x = rand(7, 5)
    src = rand(9, 4)
    idx = RNG.integers(0, 7, size=(6, 3)).astype(np.int64)  # shorter than src and x in dim 1

    def fn(a, i, s):
        return tuple(F.scatter_reduce(a, 0, i, s, r, include_self=include_self) for r in REDUCES)

    def ref(a, i, s):
        return tuple(a.scatter_reduce(0, i, s, r, include_self=include_self) for r in REDUCES)

    check_op("scatter_reduce", fn, ref, [x, idx, src])


def test_index_reduce():
    x = rand(3, 11, 2)
    src = rand(3, 13, 2)
    idx = RNG.integers(0, 11, size=(13,)).astype(np.int64)

    def fn(a, i, s):
        return tuple(F.index_reduce(a, 1, i, s, r, include_self=False) for r in REDUCES[1:])

    def ref(a, i, s):
        return tuple(a.index_reduce(1, i, s, r, include_self=False) for r in REDUCES[1:])

    check_op("index_reduce", fn, ref, [x, idx, src])


def test_bad_reduce_is_an_error():
    g = lm.Graph()
    x, i = g.input("x", (4,)), g.input("i", (4,), "i64")
    with pytest.raises(ValueError, match="reduce must be one of"):
        F.scatter_reduce(x, 0, i, x, "median")
