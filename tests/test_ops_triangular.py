"""Unrolled small linear algebra (functional/triangular.py) against PyTorch: triangular solves
(both sides, both triangles, unit diagonal, batches), Cholesky with its info output."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import numpy as np
import pytest
import torch

import luminal as lm
import luminal.functional as F
import optest
from optest import check_op, rand


def test_solve_triangular_variants():
    a = rand(3, 7, 7) + 5 * np.eye(7, dtype=np.float32)
    b = rand(3, 7, 2)
    bt = rand(3, 2, 7)
    cases = [(False, True, False), (True, True, True), (True, False, False)]

    def fn(x, y, yt):
        return tuple(F.solve_triangular(x, y if left else yt, upper=u, left=left,
                                        unitriangular=unit) for u, left, unit in cases)  # fmt: skip

    def ref(x, y, yt):
        return tuple(torch.linalg.solve_triangular(x, y if left else yt, upper=u, left=left,
                                                   unitriangular=unit)
                     for u, left, unit in cases)  # fmt: skip

    check_op("solve_triangular", fn, ref, [a, b, bt], atol=1e-5, rtol=1e-4)


def test_cholesky_ex():
    m = rand(4, 6, 6)
    spd = m @ m.transpose(0, 2, 1) + 0.5 * np.eye(6, dtype=np.float32)
    spd[2, 3, 3] = -50.0  # not positive definite from the 4th minor: info 4, L NaN there

    def fn(x):
        low, info = F.cholesky_ex(x)
        return low.slice(0, 0, 2), info, F.cholesky(x.slice(0, 0, 2), upper=True)

    def ref(x):
        low, info = torch.linalg.cholesky_ex(x)
        return low[:2], info, torch.linalg.cholesky(x[:2]).mT

    check_op("cholesky", fn, ref, [spd], atol=1e-5, rtol=1e-4)


def test_unrolled_size_limit_is_an_error():
    g = lm.Graph()
    with pytest.raises(ValueError, match="exceeds"):
        F.cholesky(g.input("a", (F.MAX_UNROLLED + 1, F.MAX_UNROLLED + 1)))


def test_lu_factor_solve_and_permutation():
    a = rand(3, 6, 6)
    b = rand(3, 6, 2)

    def fn(x, y):
        lu, piv, info = F.lu_factor_ex(x)
        return lu, piv, info, F.lu_solve(lu, piv, y), F.permutation_matrix(piv, 6)

    def ref(x, y):
        lu, piv, info = torch.linalg.lu_factor_ex(x)
        return lu, piv, info, torch.linalg.solve(x, y), torch.linalg.lu(x)[0]

    check_op("lu_factor", fn, ref, [a, b], atol=1e-4, rtol=1e-4)
    wide = rand(2, 4, 7)  # rectangular: min(m, n) pivots
    check_op("lu_factor_wide", lambda x: F.lu_factor_ex(x)[:2],
             lambda x: torch.linalg.lu_factor_ex(x)[:2], [wide], atol=1e-5)  # fmt: skip


def test_lu_factor_of_singular_matrices_names_the_zero_pivot():
    """A zero pivot is not divided by (LAPACK's getrf): the factor stays finite and info is
    the first zero pivot, so inv / solve of a singular matrix can raise as torch does. Values
    only, on every backend (the factorization's gradient is undefined at a singular matrix,
    so this is no check_op and has no gradient-mode check)."""
    a = rand(3, 5, 5)
    a[0] = 0.0  # every pivot zero: info 1
    a[1, :, 2] = 0.0  # third column zero: stays exactly zero through elimination, info 3
    a[2, :, 0] = 0.0  # first column zero: info 1, the rest factors on
    g = lm.Graph("lu_singular")
    for k, o in enumerate(F.lu_factor_ex(g.input("x", a.shape))):
        g.output(f"out{k}", o)
    want = [w.numpy() for w in torch.linalg.lu_factor_ex(torch.from_numpy(a))]
    for name, run in optest.BACKENDS.items():
        got = run(g, {"x": a}, {})
        for k, w in enumerate(want):
            optest.compare(f"lu_singular[{name}] out{k}", got[f"out{k}"], w, 1e-4, 1e-4, True)
