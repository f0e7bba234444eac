"""Movement ops (views, cat, pad, repeats, triangles) and x[...] indexing against PyTorch."""

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

X = rand(3, 50, 7)
# name, fn on one (3, 50, 7) tensor (same code for luminal and torch)
SAME = [
    ("reshape", lambda t: t.reshape(7, -1, 3)),
    ("permute", lambda t: t.permute(2, 0, 1)),
    # torch refuses view on non-contiguous strides; luminal's contiguous() is a no-op
    ("view", lambda t: t.contiguous().view(7, -1, 3)),
    ("view", lambda t: t.contiguous().view((-1,))),
    ("view", lambda t: t[:, 1:4].contiguous().view(-1, 7)),
    ("transpose", lambda t: t.transpose(0, 2)),
    ("swapaxes", lambda t: t.swapaxes(-1, 1)),
    ("t", lambda t: t[0].t()),
    ("T", lambda t: t[:, 0].T),
    ("mT", lambda t: t.mT),
    ("expand", lambda t: t[:, :1].expand(3, 5, 7)),
    ("expand_as", lambda t: t[0, :1, :].expand_as(t)),
    ("broadcast_to", lambda t: t[:, :, 2:3].broadcast_to((2, 3, 50, 4))),
    ("squeeze", lambda t: t[:, 1:2].squeeze(1)),
    ("unsqueeze", lambda t: t.unsqueeze(-2)),
    ("flatten", lambda t: t.flatten(1)),
    ("unflatten", lambda t: t.unflatten(1, (5, -1))),
    ("narrow", lambda t: t.narrow(1, 3, 17)),
    ("select", lambda t: t.select(1, -4)),
    ("movedim", lambda t: t.movedim(0, -1)),
    ("moveaxis", lambda t: t.moveaxis((0, 1), (1, 2))),
    ("flip", lambda t: t.flip((0, 2))),
    ("roll", lambda t: t.roll((3, -1), (1, 2))),
    ("roll", lambda t: t.roll(11)),
    ("repeat", lambda t: t[:, :4].repeat(2, 1, 3, 1)),
    ("tile", lambda t: t[0, :4].tile((3,))),
    ("repeat_interleave", lambda t: t[:, :5].repeat_interleave(3, dim=1)),
    ("repeat_interleave", lambda t: t[0, :4].repeat_interleave(2)),
    ("tril", lambda t: t.tril()),
    ("tril", lambda t: t.tril(-2)),
    ("triu", lambda t: t.triu(3)),
    ("diagonal", lambda t: t.diagonal()),
    ("diagonal", lambda t: t.diagonal(2, 1, 2)),
    ("diagonal", lambda t: t.diagonal(-3, 2, 1)),
    ("diag", lambda t: t[0, 0].diag()),
    ("diag", lambda t: t[0, 0].diag(-2)),
    ("diag", lambda t: t[0].diag(1)),
    ("chunk", lambda t: tuple(t.chunk(3, 1))),
    ("split", lambda t: tuple(t.split(16, 1))),
    ("split", lambda t: tuple(t.split([10, 30, 10], 1))),
    ("unbind", lambda t: tuple(t.unbind(0))),
    ("__getitem__", lambda t: t[1]),
    ("__getitem__", lambda t: t[-1, 3:-5:4]),
    ("__getitem__", lambda t: t[..., 1::3]),
    ("__getitem__", lambda t: t[None, :, None, 2, -2:]),
    ("__getitem__", lambda t: t[:, 100:]),
    ("__getitem__", lambda t: t[:, -100:5]),
    ("__getitem__", lambda t: t[0, ..., None]),
]


@pytest.mark.parametrize("name,fn", SAME, ids=[f"{s[0]}{i}" for i, s in enumerate(SAME)])
def test_movement(name, fn):
    check_op(name, fn, fn, [X])
    # also through a permuted (non-contiguous) input of the same logical shape
    check_op(
        name, lambda t: fn(t.permute(2, 0, 1)), lambda t: fn(t.permute(2, 0, 1)), [rand(50, 7, 3)]
    )


def test_view_errors_match_torch():
    g = lm.Graph("view")
    x = g.input("x", (3, 50, 7))
    with pytest.raises(ValueError, match="only one dim can be -1"):
        x.view(-1, -1)
    with pytest.raises(ValueError, match="cannot view"):
        x.view(4, -1)
    with pytest.raises(TypeError, match="view\\(dtype\\)"):
        x.view(lm.i32)
    assert x.view(-1).layout.shape == (1050,) and x.view(3, 350).shape == (3, 350)


def test_tril_keeps_inf_nan_exact():
    x = rand(5, 5)
    x[0, 3], x[3, 0] = np.inf, np.nan
    check_op("tril", lambda t: t.tril(), lambda t: t.tril(), [x])
    check_op("triu", lambda t: t.triu(), lambda t: t.triu(), [x])


def test_cat_stack():
    a, b, c = rand(3, 5), rand(4, 5), rand(1, 5)
    check_op(
        "cat", lambda x, y, z: F.cat([x, y, z]), lambda x, y, z: torch.cat([x, y, z]), [a, b, c]
    )
    check_op(
        "cat", lambda x, y: F.cat([x.T, y.T], 1), lambda x, y: torch.cat([x.T, y.T], 1), [a, b]
    )
    check_op(
        "cat",
        lambda x, y: F.cat([x, y], 0),
        lambda x, y: torch.cat([x, y], 0),
        [rand(3, 5, dtype=bool), rand(2, 5, dtype=bool)],
    )
    check_op(
        "cat",
        lambda x, y: F.cat([x, y], -1),
        lambda x, y: torch.cat([x, y], -1),
        [rand(3, 2, dtype=np.int32), rand(3, 5)],
    )
    check_op(
        "stack", lambda x, y: F.stack([x, y], 1), lambda x, y: torch.stack([x, y], 1), [a, a * 2]
    )
    check_op(
        "stack", lambda x, y: F.stack([x, y], -1), lambda x, y: torch.stack([x, y], -1), [a, a * 2]
    )
    x = rand(2, 3)
    x[0, 0], x[1, 1] = np.inf, np.nan
    check_op("cat", lambda p, q: F.cat([p, q]), lambda p, q: torch.cat([p, q]), [x, x])
    seq = lm.dim("seq", 1, 512)
    check_op(
        "cat",
        lambda p, q: F.cat([p, q]),
        lambda p, q: torch.cat([p, q]),
        [rand(7, 3), rand(2, 3)],
        shapes=[(seq, 3), None],
        more=[[rand(1, 3), rand(2, 3)], [rand(300, 3), rand(2, 3)]],
    )


PADS = [
    ((1, 2), "constant", None),
    ((2, 0, 1, 3), "constant", 1.5),
    ((-1, 2, 0, -2), "constant", None),
    ((3, 1), "constant", float("-inf")),
    ((2, 3), "reflect", None),
    ((1, 2, 2, 1), "replicate", None),
    ((2, 3, 1, 0), "circular", None),
    ((0, 0, 1, 1), "constant", 7.0),
]


@pytest.mark.parametrize("pad,mode,value", PADS)
def test_pad(pad, mode, value):
    kw = {} if value is None else {"value": value}
    check_op(
        "pad",
        lambda t: F.pad(t, pad, mode, **kw),
        lambda t: TF.pad(t, pad, mode, **kw),
        [rand(2, 5, 7)],
    )
    if mode == "constant":
        check_op(
            "pad",
            lambda t: F.pad(t, pad, mode, value=3),
            lambda t: TF.pad(t, pad, mode, value=3),
            [rand(2, 5, 7, dtype=np.int32)],
        )


def test_symbolic_views():
    seq = lm.dim("seq", 1, 512)
    more = [[rand(1, 6)], [rand(300, 6)]]
    cases = [
        ("flip", lambda t: t.flip(0), None),
        ("roll", lambda t: t.roll(2, 0), None),
        ("__getitem__", lambda t: t[1:, ::2], None),
        ("__getitem__", lambda t: t[-1], None),
        ("transpose", lambda t: t.transpose(0, 1), None),
        ("flatten", lambda t: t.flatten(), None),
        ("repeat", lambda t: t.repeat(2, 1), None),
        ("tril", lambda t: t.tril(), None),
        (
            "pad",
            lambda t: F.pad(t, (1, 1, 2, 0), value=-1.0),
            lambda t: TF.pad(t, (1, 1, 2, 0), value=-1.0),
        ),
        (
            "pad",
            lambda t: F.pad(t, (1, 1, 0, 1), mode="replicate"),
            lambda t: TF.pad(t[None], (1, 1, 0, 1), mode="replicate")[0],
        ),
    ]
    for name, fn, ref in cases:
        check_op(name, fn, ref or fn, [rand(7, 6)], shapes=[(seq, 6)], more=more)
