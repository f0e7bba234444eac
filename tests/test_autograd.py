"""Autograd (``luminal.compiler.autograd``): each primitive's VJP and each kind of view
against central finite differences in f64, symbolic dims kept, gradient graphs compiled like
any graph, and the errors of ``luminal.train.grad``."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import luminal as lm
import optest
from luminal import functional as F
from luminal.compiler import autograd
from luminal.graph import dtypes as dt
from luminal.graph import symbolic as sym
from luminal.graph.ops import Op
from luminal.graph.view import View, idx_vars
from luminal.tensor import Tensor
from luminal.train import grad

RNG = np.random.default_rng(7)


def _prim(op: Op, *ts: Tensor, arg: object = None) -> Tensor:
    return Tensor(ts[0].graph.add_op(op, [t.edge for t in ts], arg))


def _loss_graph(build, arrays, shapes=None, **dims):
    """Graph of sum(build(*xs) * ct) with gradients w.r.t. every f64 input; returns
    (graph, feed) with the cotangent fixed."""
    g = lm.Graph("fd")
    xs = []
    for i, a in enumerate(arrays):
        shp = shapes[i] if shapes and shapes[i] is not None else a.shape
        xs.append(g.input(f"x{i}", shp, dt.to_dtype(a.dtype)))
    y = build(*xs)
    ct = g.input("ct", y.shape, y.dtype)
    loss = (y * ct).sum()
    g.output("loss", loss)
    floats = [i for i, a in enumerate(arrays) if a.dtype == np.float64]
    for i, gi in zip(floats, grad(loss, [xs[i] for i in floats])):
        g.output(f"g{i}", gi)
    g.verify()
    feed = {f"x{i}": a for i, a in enumerate(arrays)}
    yshape = tuple(int(sym.evaluate(s, dims)) for s in y.shape)
    feed["ct"] = RNG.uniform(-1, 1, yshape).astype(y.dtype.np_type)
    return g, feed, floats


def fd_check(build, arrays, shapes=None, eps=1e-6, tol=1e-6, **dims):
    """Autograd's gradient of sum(build(...) * ct) against central differences in f64."""
    g, feed, floats = _loss_graph(build, arrays, shapes, **dims)
    got = g.run(feed, **dims)
    for i in floats:
        a = feed[f"x{i}"]
        num = np.zeros_like(a)
        for j in np.ndindex(a.shape):
            for sgn in (1, -1):
                b = a.copy()
                b[j] += sgn * eps
                num[j] += sgn * float(g.run({**feed, f"x{i}": b}, **dims)["loss"]) / (2 * eps)
        np.testing.assert_allclose(got[f"g{i}"], num, atol=tol, rtol=tol, err_msg=f"input {i}")
    return got


def r(*shape, lo=-2.0, hi=2.0):
    return RNG.uniform(lo, hi, shape)


UNARY = [
    (Op.EXP2, r(3, 5)),
    (Op.LOG2, r(3, 5, lo=0.5, hi=3)),
    (Op.SIN, r(3, 5)),
    (Op.SQRT, r(3, 5, lo=0.5, hi=3)),
    (Op.RECIP, r(3, 5, lo=0.5, hi=3)),
]


@pytest.mark.parametrize("op,x", UNARY, ids=[u[0].name for u in UNARY])
def test_unary_vjp(op, x):
    fd_check(lambda a: _prim(op, a), [x])


@pytest.mark.parametrize("op", [Op.ADD, Op.MUL])
def test_add_mul_vjp(op):
    fd_check(lambda a, b: _prim(op, a, b), [r(4, 3), r(4, 3)])


def test_mod_vjp():
    a, b = r(4, 3, lo=0.1, hi=5), r(4, 3, lo=0.7, hi=1.3)
    fd_check(lambda x, y: _prim(Op.MOD, x, y), [a, b], eps=1e-7, tol=1e-5)


def test_less_than_gives_zero_and_masks():
    a, b = r(5, 4), r(5, 4)
    got = fd_check(lambda x, y: _prim(Op.LESS_THAN, x, y).cast(dt.f64) * x, [a, b])
    assert np.all(got["g1"] == 0)


@pytest.mark.parametrize("axis", [0, 1])
def test_sum_and_max_reduce_vjp(axis):
    fd_check(lambda x: _prim(Op.SUM_REDUCE, x, arg=axis), [r(3, 5)])
    fd_check(lambda x: _prim(Op.MAX_REDUCE, x, arg=axis), [r(3, 5)])


def test_max_reduce_ties_split_as_torch():
    x = np.array([[1.0, 3.0, 3.0, -1.0], [2.0, 2.0, 2.0, 0.5]])
    g, feed, _ = _loss_graph(lambda a: _prim(Op.MAX_REDUCE, a, arg=1), [x])
    got = g.run(feed)["g0"]
    t = torch.tensor(x, requires_grad=True)
    (t.amax(1) * torch.from_numpy(feed["ct"])).sum().backward()
    np.testing.assert_allclose(got, t.grad.numpy())


def test_gather_vjp_scatter_adds_duplicates():
    idx = np.array([[0, 3], [3, 1], [9, -1]], np.int32)  # duplicates and out-of-range rows
    got = fd_check(lambda d, i: _prim(Op.GATHER, d, i), [r(4, 5), idx])
    assert np.all(got["g0"][2] == 0)  # row 2 is never read


def test_scatter_vjp_dest_and_src():
    idx = np.array([2, 0, 7], np.int32)  # 7 is out of range: skipped
    fd_check(lambda d, i, s: _prim(Op.SCATTER, d, i, s), [r(5, 3), idx, r(3, 3)])


def test_cast_and_iota_vjp():
    fd_check(lambda x: x.cast(dt.f32).exp().cast(dt.f64), [r(3, 4)], eps=1e-3, tol=1e-4)
    shape = (3, 4)
    io = lambda g: Tensor(g.add_op(Op.IOTA, [], arg=idx_vars(shape)[1], shape=shape))  # noqa: E731
    fd_check(lambda x: x * io(x.graph).cast(dt.f64), [r(*shape)])


def _windows(x: Tensor) -> Tensor:
    """Overlapping windows of 3 rows along dim 1 (the view a convolution reads)."""
    i0, i1, i2, i3 = idx_vars((3, 3, 3, 2))
    index = sym.add(sym.add(sym.mul(i0, 20), sym.mul(sym.add(i1, i2), 4)), sym.add(i3, 1))
    return Tensor(x.node, View((3, 3, 3, 2), index, 1))


VIEWS = [
    ("permute", lambda x: x.permute(2, 0, 1).sin()),
    ("expand", lambda x: x[:, :1].expand(3, 5, 4) * x),
    ("slice_step", lambda x: x[1:, ::2, 1:3].exp()),
    ("flip", lambda x: x.flip([1, 2]) * x),
    ("pad", lambda x: F.pad(x, (2, 1, 0, 3)).sin()),
    ("reshape_of_permute", lambda x: x.permute(1, 0, 2).reshape(5, 12).exp()),
    ("merge_split", lambda x: x.reshape(15, 4).permute(1, 0).reshape(2, 30).sin()),
    ("diagonal", lambda x: x.reshape(12, 5)[:5].diagonal().exp()),
    ("windows", lambda x: _windows(x).sin()),
    ("repeat", lambda x: x.repeat(2, 1, 3).sin()),
]


@pytest.mark.parametrize("name,fn", VIEWS, ids=[v[0] for v in VIEWS])
def test_view_adjoints(name, fn):
    fd_check(fn, [r(3, 5, 4)])


def test_non_affine_view_falls_back_to_a_sum():
    # a view whose index is not affine in the index variables (i*i): the one-hot adjoint
    def build(x):
        n, _ = x.edge
        i = idx_vars((3,))[0]
        return Tensor(n, View((3,), sym.mul(i, i), 1)).exp()

    fd_check(build, [r(5)])


def test_symbolic_dims_kept():
    n = sym.dim("n", 1, 64)
    fn = lambda x, w: (x @ w).softmax(-1) * x[:, :3].flip(0)  # noqa: E731
    for size in (3, 8):
        fd_check(fn, [r(size, 4), r(4, 3)], shapes=[(n, 4), None], n=size)


def test_composed_ops_against_torch():
    a, b = optest.rand(7, 50), optest.rand(50, 3)
    assert optest.check_grad(
        "mlp", lambda x, w: (x @ w).tanh().log_softmax(-1),
        lambda x, w: (x @ w).tanh().log_softmax(-1), [a, b],
    )  # fmt: skip
    x = optest.rand(2, 3, 9, 8)
    w = optest.rand(4, 3, 3, 3)
    assert optest.check_grad(
        "conv2d", lambda x, w: F.conv2d(x, w, stride=2, padding=1),
        lambda x, w: torch.nn.functional.conv2d(x, w, stride=2, padding=1), [x, w],
    )  # fmt: skip


def test_gradient_graph_compiles():
    x, w = optest.rand(9, 13), optest.rand(13, 5)
    t = RNG.integers(0, 5, 9).astype(np.int32)
    ok = optest.check_grad(
        "cross_entropy",
        lambda x, w, t: F.embedding(t, w.T).sum() + (x @ w).log_softmax(-1).amax(-1),
        lambda x, w, t: (
            torch.nn.functional.embedding(t.long(), w.T).sum() + (x @ w).log_softmax(-1).amax(-1)
        ),
        [x, w, t],
        compiled=True,
    )
    assert ok


def test_add_gradients_pass_outputs_named_gradients():
    g = lm.Graph("pass")
    x, w = g.input("x", (4, 3)), g.input("w", (3, 2))
    g.input("unused", (2,))
    g.output("loss", (x @ w).exp().sum())
    autograd.add_gradients(g, "loss", ["w", "unused"])
    feed = {"x": optest.rand(4, 3), "w": optest.rand(3, 2), "unused": optest.rand(2)}
    out = g.run(feed)
    tw = torch.tensor(feed["w"], requires_grad=True)
    (torch.from_numpy(feed["x"]) @ tw).exp().sum().backward()
    np.testing.assert_allclose(out["grad.w"], tw.grad.numpy(), rtol=1e-5)
    assert np.all(out["grad.unused"] == 0)


def test_grad_errors_name_the_problem():
    g = lm.Graph("err")
    x = g.input("x", (3, 4))
    i = g.input("i", (3,), dt.i32)
    with pytest.raises(ValueError, match="scalar"):
        grad(x.exp(), [x])
    with pytest.raises(ValueError, match="view"):
        grad(x.sum(), [x.T])
    with pytest.raises(TypeError, match="float"):
        grad(x.sum(), [i])
    with pytest.raises(TypeError, match="float"):
        autograd.gradients(g, i.edge, [x.node])
    with pytest.raises(ValueError, match="no output"):
        autograd.add_gradients(g, "nope", ["x"])
    other = lm.Graph("other").input("y", (2,))
    with pytest.raises(ValueError, match="another graph"):
        grad(x.sum(), [other])


@pytest.mark.slow
def test_op_suite_in_gradient_mode():
    """Every check_op of the op suite also checks its gradient against torch.autograd."""
    here = os.path.dirname(__file__)
    files = [os.path.join(here, f) for f in sorted(os.listdir(here))
             if f.startswith(("test_ops_", "test_nn_")) or f == "test_linalg.py"]  # fmt: skip
    env = {**os.environ, "LUMINAL_TEST_GRAD": "1"}
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                        *files], env=env, capture_output=True, text=True)  # fmt: skip
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]


def test_select_gradient_is_a_view_not_a_one_hot():
    """where / masked_fill gather from their two candidates by position: the gradient is
    two masked view adjoints (no node of higher rank than the operands)."""
    n = sym.dim("n", 1, 512)
    a, b, c = optest.rand(7, 5), optest.rand(7, 5), optest.rand(7, 5) > 0
    for fn, ref in ((lambda a, b, c: F.where(c, a, b), lambda a, b, c: torch.where(c, a, b)),
                    (lambda a, b, c: a.masked_fill(c, -1.5) * b,
                     lambda a, b, c: a.masked_fill(c, -1.5) * b)):  # fmt: skip
        assert optest.check_grad("where", fn, ref, [a, b, c], shapes=[(n, 5)] * 3)
        g = lm.Graph("sel")
        xs = [g.input("a", (n, 5)), g.input("b", (n, 5)), g.input("c", (n, 5), dt.bool_)]
        grad(fn(*xs).sum(), xs[:2])
        assert max(len(node.shape) for node in g.nodes) <= 2
