"""Indexing with tensors (gather/scatter family, embedding, one_hot, masked_fill, x[idx])."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import luminal as lm
import luminal.functional as F
from optest import check_op, rand

RNG = np.random.default_rng(1)


def idx(high, *shape, dtype=np.int64):
    return RNG.integers(0, high, size=shape).astype(dtype)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_gather(dim):
    x = rand(5, 50, 7)
    n = x.shape[dim]
    shape = [4, 33, 7]
    shape[dim] = 9
    i = idx(n, *shape)
    check_op("gather", lambda a, b: a.gather(dim, b), lambda a, b: a.gather(dim, b), [x, i])
    check_op(
        "gather",
        lambda a, b: F.gather(a.permute(1, 0, 2), dim, b),
        lambda a, b: a.permute(1, 0, 2).gather(dim, b),
        [rand(50, 5, 7), idx((5, 50, 7)[dim], *shape, dtype=np.int32)],
    )


def test_take_along_dim_take_index_select():
    x = rand(7, 50)
    check_op(
        "take_along_dim",
        lambda a, b: F.take_along_dim(a, b, 1),
        lambda a, b: torch.take_along_dim(a, b, 1),
        [x, idx(50, 1, 9)],
    )
    check_op("take", lambda a, b: a.take(b), lambda a, b: a.take(b), [x, idx(350, 4, 5) - 100])
    for d in (0, 1):
        check_op(
            "index_select",
            lambda a, b, d=d: a.index_select(d, b),
            lambda a, b, d=d: a.index_select(d, b),
            [x, idx(x.shape[d], 11)],
        )
    check_op(
        "index_select",
        lambda a, b: a.T.index_select(1, b),
        lambda a, b: a.T.index_select(1, b),
        [x, idx(7, 3, dtype=np.int32)],
    )


def test_embedding_one_hot():
    w = rand(783, 16)
    check_op("embedding", lambda i, w: F.embedding(i, w), TF.embedding, [idx(783, 3, 50), w])
    seq = lm.dim("seq", 1, 1024)
    check_op(
        "embedding",
        lambda i, w: F.embedding(i, w),
        TF.embedding,
        [idx(783, 7), w],
        shapes=[(seq,), None],
        more=[[idx(783, 1), w], [idx(783, 300), w]],
    )
    check_op("one_hot", lambda i: F.one_hot(i, 13), lambda i: TF.one_hot(i, 13), [idx(13, 5, 7)])


def _unique_index(n_src, n_dst, cols):
    """Each column a permutation prefix: no duplicate targets (PyTorch leaves those undefined)."""
    return np.stack([RNG.permutation(n_dst)[:n_src] for _ in range(cols)], axis=1).astype(np.int64)


def test_scatter():
    dest = rand(50, 7)
    i = _unique_index(9, 50, 7)
    check_op(
        "scatter",
        lambda d, i, s: d.scatter(0, i, s),
        lambda d, i, s: d.scatter(0, i, s),
        [dest, i, rand(9, 7)],
    )
    check_op(
        "scatter",
        lambda d, i, s: d.scatter(0, i, s),
        lambda d, i, s: d.scatter(0, i, s),
        [dest, i[:, :4].copy(), rand(12, 9)],
    )  # src and index smaller than dest elsewhere
    i1 = _unique_index(5, 7, 50).T.copy()
    check_op(
        "scatter",
        lambda d, i: d.scatter(1, i, value=-1.0),
        lambda d, i: d.scatter(1, i, -1.0),
        [dest, i1],
    )
    check_op(
        "scatter",
        lambda d, i, s: d.T.scatter(1, i, s),
        lambda d, i, s: d.T.scatter(1, i, s),
        [dest, i[:5, :].T.copy(), rand(7, 5)],
    )


def test_scatter_add_index_add_index_put():
    dest = rand(50, 7)
    i = idx(50, 80, 7)  # duplicates accumulate
    check_op(
        "scatter_add",
        lambda d, i, s: d.scatter_add(0, i, s),
        lambda d, i, s: d.scatter_add(0, i, s),
        [dest, i, rand(80, 7)],
        rtol=1e-5,
    )
    check_op(
        "scatter_add",
        lambda d, i, s: d.scatter_add(1, i, s),
        lambda d, i, s: d.scatter_add(1, i, s),
        [dest, idx(7, 30, 9), rand(30, 9)],
        rtol=1e-5,
    )
    check_op(
        "index_add",
        lambda d, i, s: d.index_add(0, i, s),
        lambda d, i, s: d.index_add(0, i, s),
        [dest, idx(50, 20), rand(20, 7)],
        rtol=1e-5,
    )
    check_op(
        "index_add",
        lambda d, i, s: d.index_add(1, i, s, alpha=2.0),
        lambda d, i, s: d.index_add(1, i, s, alpha=2.0),
        [dest, idx(7, 4), rand(50, 4)],
        rtol=1e-5,
    )
    rows = RNG.permutation(50)[:6].astype(np.int64)
    check_op(
        "index_put",
        lambda d, i, v: d.index_put((i,), v),
        lambda d, i, v: d.index_put((i,), v),
        [dest, rows, rand(6, 7)],
    )
    check_op(
        "index_put",
        lambda d, i, v: d.index_put((i,), v, accumulate=True),
        lambda d, i, v: d.index_put((i,), v, accumulate=True),
        [dest, idx(50, 9), rand(9, 7)],
        rtol=1e-5,
    )


def test_index_put_after_none():
    """cache[:, :, pos] = new (a KV cache write), and += with negative and repeated positions."""
    cache = rand(3, 5, 50, 7)
    pos = np.array([4, 17, -1], np.int64)
    check_op(
        "index_put",
        lambda c, p, v: c.index_put((None, None, p), v),
        lambda c, p, v: torch.ops.aten.index_put(c, [None, None, p], v),
        [cache, pos, rand(3, 5, 3, 7)],
    )
    check_op(
        "index_put",
        lambda c, p, v: c.index_put((None, p), v, accumulate=True),
        lambda c, p, v: torch.ops.aten.index_put(c, [None, p], v, accumulate=True),
        [rand(3, 50, 7), np.array([2, -3, 2, 0], np.int64), rand(3, 4, 7)],
        rtol=1e-5,
    )


def test_masked_fill():
    x = rand(3, 50)
    x[0, 0], x[1, 1] = np.inf, np.nan
    m = rand(3, 50, dtype=bool)
    check_op(
        "masked_fill",
        lambda a, m: a.masked_fill(m, float("-inf")),
        lambda a, m: a.masked_fill(m, float("-inf")),
        [x, m],
    )
    check_op(
        "masked_fill", lambda a, m: a.masked_fill(m, 2), lambda a, m: a.masked_fill(m, 2), [x, m[0]]
    )
    check_op(
        "masked_fill",
        lambda a, m: a.masked_fill(m, 5),
        lambda a, m: a.masked_fill(m, 5),
        [rand(3, 50, dtype=np.int32), m],
    )


def test_getitem_advanced():
    x = rand(7, 50, 5)
    i, j = idx(7, 4), idx(50, 3, 4)
    cases = [
        lambda a, i, j: a[i],
        lambda a, i, j: a[:, j],
        lambda a, i, j: a[i, j],
        lambda a, i, j: a[i, :, 2],
        lambda a, i, j: a[1, j],
        lambda a, i, j: a[:, j, -1],
        lambda a, i, j: a[i - 7],
        lambda a, i, j: a[..., j % 5],
    ]
    for fn in cases:
        check_op("__getitem__", fn, fn, [x, i, j])
    check_op("__getitem__", lambda a: a[[0, 2, -1]], lambda a: a[[0, 2, -1]], [x])
