"""Reductions, scans and softmax against PyTorch: odd sizes, permuted inputs, keepdim,
several dims, symbolic dims (mean over seq uses 1/seq), ties, NaN and -inf rows."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import numpy as np
import pytest
import torch

import luminal as lm
import luminal.functional as F
from optest import check_op, rand

# name, luminal fn(x, dim, keepdim), torch fn(x, dim, keepdim), needs float
REDUCE = [
    ("sum", lambda x, d, k: x.sum(d, keepdim=k), lambda x, d, k: x.sum(d, keepdim=k)),
    ("mean", lambda x, d, k: x.mean(d, keepdim=k), lambda x, d, k: x.mean(d, keepdim=k)),
    ("var", lambda x, d, k: x.var(d, keepdim=k), lambda x, d, k: x.var(d, keepdim=k)),
    (
        "std",
        lambda x, d, k: x.std(d, keepdim=k, correction=0),
        lambda x, d, k: x.std(d, keepdim=k, correction=0),
    ),
    ("amax", lambda x, d, k: x.amax(d, keepdim=k), lambda x, d, k: x.amax(d, keepdim=k)),
    ("amin", lambda x, d, k: x.amin(d, keepdim=k), lambda x, d, k: x.amin(d, keepdim=k)),
    (
        "logsumexp",
        lambda x, d, k: x.logsumexp(d, keepdim=k),
        lambda x, d, k: x.logsumexp(d, keepdim=k),
    ),
    ("norm", lambda x, d, k: x.norm(dim=d, keepdim=k), lambda x, d, k: x.norm(dim=d, keepdim=k)),
    (
        "any",
        lambda x, d, k: (x > 1.5).any(d, keepdim=k),
        lambda x, d, k: (x > 1.5).any(d, keepdim=k),
    ),
    (
        "all",
        lambda x, d, k: (x > -1.5).all(d, keepdim=k),
        lambda x, d, k: (x > -1.5).all(d, keepdim=k),
    ),
    (
        "count_nonzero",
        lambda x, d, k: F.count_nonzero(x > 0, d),
        lambda x, d, k: torch.count_nonzero(x > 0, d),
    ),
]
DIMS = [(1, False), (0, True), ((0, 2), False), (-1, True)]


@pytest.mark.parametrize("name,fn,ref", REDUCE, ids=[r[0] for r in REDUCE])
def test_reduce(name, fn, ref):
    for d, k in DIMS:
        # a permuted input: (50, 7, 3) seen as (3, 50, 7)
        check_op(
            name,
            lambda x, d=d, k=k: fn(x.permute(2, 0, 1), d, k),
            lambda x, d=d, k=k: ref(x.permute(2, 0, 1), d, k),
            [rand(50, 7, 3)],
            atol=1e-5,
            rtol=1e-5,
        )
    check_op(
        name,
        lambda x: fn(x, 0, False),
        lambda x: ref(x, 0, False),
        [rand(4097)],
        atol=1e-4,
        rtol=1e-5,
    )


@pytest.mark.filterwarnings("ignore:var\\(\\)")  # seq = 1: var divides by 0, as torch does
@pytest.mark.parametrize("name", ["sum", "mean", "var", "amax", "amin", "logsumexp", "norm"])
def test_reduce_symbolic(name):
    _, fn, ref = next(r for r in REDUCE if r[0] == name)
    seq = lm.dim("seq", 1, 4096)
    check_op(
        name,
        lambda x: fn(x, 0, False),
        lambda x: ref(x, 0, False),
        [rand(7, 5)],
        shapes=[(seq, 5)],
        more=[[rand(1, 5)], [rand(300, 5)]],
        atol=1e-5,
        rtol=1e-5,
    )
    check_op(
        name,
        lambda x: fn(x, None if name not in ("logsumexp",) else (0, 1), False),
        lambda x: ref(x, None, False) if name not in ("logsumexp",) else ref(x, (0, 1), False),
        [rand(7, 5)],
        shapes=[(seq, 5)],
        more=[[rand(300, 5)]],
        atol=1e-4,
        rtol=1e-5,
    )


def test_full_reductions_and_int_dtypes():
    ints = rand(50, 3, dtype=np.int32, low=-9, high=9)
    check_op("sum", lambda x: x.sum(), lambda x: x.sum(), [ints])
    check_op("sum", lambda x: x.sum(), lambda x: x.sum(), [rand(50, 3, dtype=bool)])
    check_op(
        "sum",
        lambda x: x.sum(1, dtype=lm.f64),
        lambda x: x.sum(1, dtype=torch.float64),
        [rand(50, 3)],
    )
    check_op("amax", lambda x: x.amax(), lambda x: x.amax(), [ints])
    check_op("amin", lambda x: x.amin(0), lambda x: x.amin(0), [ints])
    lim = np.array([[-(2**31), 2**31 - 1, 0]], dtype=np.int32)
    check_op("amin", lambda x: x.amin(1), lambda x: x.amin(1), [lim])
    check_op(
        "amin", lambda x: x.amin(1), lambda x: x.amin(1), [np.array([[0, 255, 7]], dtype=np.uint8)]
    )
    check_op("max", lambda x: x.max(), lambda x: x.max(), [rand(3, 50)])
    check_op("min", lambda x: x.min(), lambda x: x.min(), [rand(3, 50)])
    check_op("mean", lambda x: x.mean(), lambda x: x.mean(), [rand(783)])
    check_op("var", lambda x: x.var(unbiased=False), lambda x: x.var(unbiased=False), [rand(783)])
    check_op("std", lambda x: x.std(), lambda x: x.std(), [rand(783)])
    check_op("norm", lambda x: x.norm(), lambda x: x.norm(), [rand(7, 50)])


@pytest.mark.parametrize("p", [1, 2, float("inf"), float("-inf"), 0, 3])
def test_norm_orders(p):
    x = rand(7, 50)
    x[0, :3] = 0
    check_op("norm", lambda t: t.norm(p, 1), lambda t: t.norm(p, 1), [x], rtol=1e-5)
    check_op(
        "vector_norm",
        lambda t: F.vector_norm(t, p, (0, 1)),
        lambda t: torch.linalg.vector_norm(t, p, (0, 1)),
        [x],
        rtol=1e-5,
    )


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64])
def test_max_min_with_indices_ties(dtype):
    x = rand(7, 50, dtype=dtype, low=-3, high=3)  # few distinct values: many ties
    for name in ("max", "min"):
        check_op(
            name,
            lambda t, name=name: tuple(getattr(t, name)(1)),
            lambda t, name=name: tuple(getattr(t, name)(1)),
            [x],
        )
        check_op(
            name,
            lambda t, name=name: tuple(getattr(t, name)(0, keepdim=True)),
            lambda t, name=name: tuple(getattr(t, name)(0, keepdim=True)),
            [x],
        )
    for name in ("argmax", "argmin"):
        check_op(
            name,
            lambda t, name=name: getattr(t, name)(),
            lambda t, name=name: getattr(t, name)(),
            [x],
        )
        check_op(
            name,
            lambda t, name=name: getattr(t, name)(-1, keepdim=True),
            lambda t, name=name: getattr(t, name)(-1, keepdim=True),
            [x],
        )
    check_op("max", lambda a, b: F.max(a, b), torch.max, [x, rand(50, dtype=dtype, low=-3, high=3)])


def test_argmax_nan_and_symbolic():
    x = rand(5, 50)
    x[1, 7] = np.nan
    x[1, 9] = np.nan
    x[2, :] = -np.inf
    check_op("argmax", lambda t: t.argmax(1), lambda t: t.argmax(1), [x])
    check_op("max", lambda t: tuple(t.max(1)), lambda t: tuple(t.max(1)), [x])
    seq = lm.dim("seq", 1, 1024)
    check_op(
        "argmax",
        lambda t: t.argmax(0),
        lambda t: t.argmax(0),
        [rand(7, 3)],
        shapes=[(seq, 3)],
        more=[[rand(1, 3)], [rand(300, 3)]],
    )


def test_prod():
    x = rand(3, 50, low=0.5, high=1.5)
    x[0, 5] = -x[0, 5]
    x[1, 7] = 0.0
    check_op("prod", lambda t: t.prod(1), lambda t: t.prod(1), [x], rtol=1e-5)
    check_op(
        "prod", lambda t: t.prod(0, keepdim=True), lambda t: t.prod(0, keepdim=True), [x], rtol=1e-5
    )
    check_op("prod", lambda t: t.prod(), lambda t: t.prod(), [rand(7, low=-2, high=2)], rtol=1e-5)
    check_op(
        "prod",
        lambda t: t.prod(1),
        lambda t: t.prod(1),
        [rand(3, 7, dtype=np.int32, low=-4, high=4)],
    )
    seq = lm.dim("seq", 1, 512)
    check_op(
        "prod",
        lambda t: t.prod(0),
        lambda t: t.prod(0),
        [x[:, :5].T.copy()],
        shapes=[(seq, 3)],
        more=[[rand(1, 3)], [rand(300, 3, low=0.9, high=1.1)]],
        rtol=1e-4,
    )


@pytest.mark.parametrize("name", ["cumsum", "cumprod"])
def test_scans(name):
    lo = 0.9 if name == "cumprod" else -2
    f = lambda t, d: getattr(t, name)(d)  # noqa: E731
    check_op(
        name,
        lambda t: f(t.permute(1, 0), 1),
        lambda t: f(t.T, 1),
        [rand(50, 3, low=lo, high=1.1)],
        rtol=1e-5,
    )
    check_op(
        name,
        lambda t: f(t, 0),
        lambda t: f(t, 0),
        [rand(783, low=lo, high=1.1)],
        atol=1e-4,
        rtol=1e-5,
    )
    check_op(
        name, lambda t: f(t, 0), lambda t: f(t, 0), [rand(50, 3, dtype=np.int32, low=-3, high=3)]
    )
    seq = lm.dim("seq", 1, 512)
    check_op(
        name,
        lambda t: f(t, 0),
        lambda t: f(t, 0),
        [rand(7, 3, low=lo, high=1.1)],
        shapes=[(seq, 3)],
        more=[[rand(1, 3, low=lo, high=1.1)], [rand(300, 3, low=lo, high=1.1)]],
        atol=1e-4,
        rtol=1e-5,
    )
    check_op(
        name,
        lambda t: f(t, 0),
        lambda t: f(t, 0),
        [rand(4097, low=-1, high=1)],
        atol=1e-3,
        rtol=1e-4,
    )


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax(name):
    fn = getattr(F, name)
    ref = getattr(torch.nn.functional, name)
    x = rand(5, 50, low=-20, high=20)
    x[1, :] = -np.inf
    x[2, :3] = -np.inf
    x[3, 4] = np.inf
    check_op(name, lambda t: fn(t, -1), lambda t: ref(t, -1), [x], rtol=1e-5)
    check_op(
        name,
        lambda t: t.permute(1, 0).__getattribute__(name)(0),
        lambda t: ref(t.T, 0),
        [rand(3, 783)],
        rtol=1e-5,
    )
    seq = lm.dim("seq", 1, 512)
    check_op(
        name,
        lambda t: fn(t, 0),
        lambda t: ref(t, 0),
        [rand(7, 3)],
        shapes=[(seq, 3)],
        more=[[rand(1, 3)], [rand(300, 3)]],
        rtol=1e-5,
    )


def test_logsumexp_infinite_rows():
    x = rand(4, 50)
    x[0, :] = -np.inf
    x[1, 3] = np.inf
    check_op("logsumexp", lambda t: t.logsumexp(1), lambda t: t.logsumexp(1), [x])
