"""Creation ops (``F.arange(g, ...)`` / ``g.arange(...)``), symbolic sizes included."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import numpy as np
import pytest
import torch

import luminal as lm
import luminal.functional as F
from optest import check_op, rand


def test_arange():
    # the input only gives check_op a graph (and binds seq); the op ignores its values
    check_op("arange", lambda x: F.arange(x.graph, 50), lambda x: torch.arange(50), [rand(1)])
    check_op(
        "arange",
        lambda x: F.arange(x.graph, -3, 783, 7),
        lambda x: torch.arange(-3, 783, 7),
        [rand(1)],
    )
    check_op(
        "arange",
        lambda x: F.arange(x.graph, 10, -5, -3),
        lambda x: torch.arange(10, -5, -3),
        [rand(1)],
    )
    check_op(
        "arange",
        lambda x: F.arange(x.graph, 0.5, 3.0, 0.25),
        lambda x: torch.arange(0.5, 3.0, 0.25),
        [rand(1)],
    )
    check_op(
        "arange",
        lambda x: F.arange(x.graph, 5, dtype=lm.f32),
        lambda x: torch.arange(5, dtype=torch.float32),
        [rand(1)],
    )
    seq = lm.dim("seq", 1, 4096)
    check_op(
        "arange",
        lambda x: F.arange(x.graph, x.shape[0]) + x.sum().long(),
        lambda x: torch.arange(x.shape[0]) + x.sum().long(),
        [np.ones(7, np.float32)],
        shapes=[(seq,)],
        more=[[np.ones(1, np.float32)], [np.ones(300, np.float32)]],
    )
    # whole-valued float bounds and step with a symbolic end (XLNet's relative positions):
    # a float range of the same points, counted down from the size
    check_op(
        "arange",
        lambda x: F.arange(x.graph, x.shape[0], -3.0, -1.0) + x.sum(),
        lambda x: torch.arange(x.shape[0], -3.0, -1.0) + x.sum(),
        [np.ones(7, np.float32)],
        shapes=[(seq,)],
        more=[[np.ones(1, np.float32)], [np.ones(300, np.float32)]],
    )


def test_constants_and_likes():
    x = rand(3, 50)
    check_op("zeros", lambda t: F.zeros(t.graph, 3, 5), lambda t: torch.zeros(3, 5), [x])
    check_op(
        "ones",
        lambda t: t.graph.ones((2, 7), dtype=lm.i32),
        lambda t: torch.ones(2, 7, dtype=torch.int32),
        [x],
    )
    check_op("full", lambda t: F.full(t.graph, (4,), 2.5), lambda t: torch.full((4,), 2.5), [x])
    check_op("full", lambda t: F.full(t.graph, (4,), 7), lambda t: torch.full((4,), 7), [x])
    check_op("zeros_like", F.zeros_like, torch.zeros_like, [x])
    check_op("ones_like", F.ones_like, torch.ones_like, [x])
    check_op("full_like", lambda t: F.full_like(t, -1.5), lambda t: torch.full_like(t, -1.5), [x])
    # torch.empty_like holds arbitrary bytes (NaN * 0 is NaN): compare shape and dtype through zeros
    check_op("empty_like", lambda t: F.empty_like(t) * 0, lambda t: torch.zeros_like(t), [x])
    seq = lm.dim("seq", 1, 4096)
    check_op(
        "ones",
        lambda t: t + t.graph.ones(t.shape[0], 1),
        lambda t: t + 1,
        [rand(7, 3)],
        shapes=[(seq, 3)],
        more=[[rand(300, 3)]],
    )


@pytest.mark.parametrize("n,m", [(3, None), (5, 7), (50, 3)])
def test_eye(n, m):
    check_op(
        "eye",
        lambda t: F.eye(t.graph, n, m),
        lambda t: torch.eye(n, m if m is not None else n),
        [rand(1)],
    )


@pytest.mark.parametrize(
    "start,end,steps", [(0.0, 1.0, 5), (-3.0, 7.5, 783), (2.0, -2.0, 50), (1.0, 1.0, 1)]
)
def test_linspace(start, end, steps):
    check_op(
        "linspace",
        lambda t: t.graph.linspace(start, end, steps),
        lambda t: torch.linspace(start, end, steps),
        [rand(1)],
        atol=1e-6,
        rtol=1e-6,
    )
