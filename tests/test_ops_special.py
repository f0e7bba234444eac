"""Special functions (functional/special.py), cummax/cummin and the add* matmul family against
PyTorch: odd sizes, a symbolic length, values near the hard points (poles, ±1, zeros, ±inf,
NaN, signed zeros)."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import numpy as np
import pytest
import torch

import luminal as lm
import luminal.functional as F
from luminal.graph import dtypes as dt
from optest import check_op, rand

# name, luminal fn, torch fn, input range, atol, rtol
UNARY = [
    ("atan", F.atan, torch.atan, (-30, 30), 1e-6, 1e-6),
    ("asin", F.asin, torch.asin, (-1, 1), 1e-6, 1e-6),
    ("acos", F.acos, torch.acos, (-1, 1), 1e-6, 1e-6),
    ("atanh", F.atanh, torch.atanh, (-0.999, 0.999), 1e-6, 1e-6),
    ("asinh", F.asinh, torch.asinh, (-60, 60), 1e-6, 1e-6),
    ("acosh", F.acosh, torch.acosh, (1, 60), 1e-6, 1e-6),
    ("lgamma", F.lgamma, torch.lgamma, (-9.5, 30), 1e-5, 1e-5),
    ("tan", F.tan, torch.tan, (-12, 12), 1e-5, 1e-5),
]
EDGES = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 1e30, -1e30, 1.5707964,
                  -3.0, 2.0], np.float32)  # fmt: skip


@pytest.mark.parametrize("name,fn,ref,rng,atol,rtol", UNARY, ids=[u[0] for u in UNARY])
def test_unary_special(name, fn, ref, rng, atol, rtol):
    n = lm.dim("n", 1, 8192)
    a = rand(783, low=rng[0], high=rng[1])
    check_op(name, fn, ref, [a], shapes=[(n,)], more=[[np.concatenate([EDGES, a[:38]])]],
             atol=atol, rtol=rtol)  # fmt: skip


BINARY = [
    ("atan2", F.atan2, torch.atan2),
    ("hypot", F.hypot, torch.hypot),
    ("copysign", F.copysign, torch.copysign),
    ("fmax", F.fmax, torch.fmax),
    ("fmin", F.fmin, torch.fmin),
]


@pytest.mark.parametrize("name,fn,ref", BINARY, ids=[b[0] for b in BINARY])
def test_binary_special(name, fn, ref):
    a, b = rand(50, 3, low=-5, high=5), rand(3, low=-5, high=5)  # broadcast
    check_op(name, fn, ref, [a, b])
    e = np.tile(EDGES, 12)
    check_op(name, fn, ref, [e, np.repeat(EDGES, 12)], atol=1e-6, rtol=1e-6)


def test_signbit_keeps_negative_zero():
    check_op("signbit", F.signbit, torch.signbit, [np.concatenate([EDGES[:-6], rand(37)])])


@pytest.mark.parametrize("which", ["cummax", "cummin"])
def test_cummax_cummin_ties_and_nan(which):
    x = rand(7, 45, low=-3, high=3)
    x[2, 5:9] = 1.0  # ties: the later index wins
    x[4, 11] = np.nan  # NaN propagates from there on
    fn = getattr(F, which)
    ref = getattr(torch, which)
    check_op(which, lambda t: tuple(fn(t, 1)), lambda t: tuple(ref(t, 1)), [x])
    ints = rand(5, 33, dtype=np.int32, low=0, high=4)
    check_op(which, lambda t: tuple(fn(t, 0)), lambda t: tuple(ref(t, 0)), [ints])


def test_addmv_addbmm_addr():
    m, v, w = rand(7, 5), rand(5), rand(7)
    b1, b2 = rand(3, 7, 4), rand(3, 4, 5)
    check_op("addmv", lambda i, a, x: F.addmv(i, a, x, beta=0.5, alpha=2.0),
             lambda i, a, x: torch.addmv(i, a, x, beta=0.5, alpha=2.0), [w, m, v])  # fmt: skip
    check_op("addbmm", lambda i, a, b: F.addbmm(i, a, b), torch.addbmm, [rand(7, 5), b1, b2])
    check_op("addr", lambda i, a, b: F.addr(i, a, b, alpha=3.0),
             lambda i, a, b: torch.addr(i, a, b, alpha=3.0), [m, w, v])  # fmt: skip


def test_special_errors_name_the_op():
    g = lm.Graph("e")
    x = g.input("x", (3,), dt.f32)
    with pytest.raises(TypeError, match="atan2"):
        F.atan2(1.0, 2.0)
    with pytest.raises(ValueError, match="hypot"):
        F.hypot(x, g.input("y", (4,), dt.f32))
