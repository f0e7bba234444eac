"""Symmetric eigenvalues, singular values and the pseudo-inverse (functional/eigen.py), and
Householder QR (functional/householder.py) against PyTorch at odd sizes: batched, tall and
wide, rank-deficient, with tolerances."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import numpy as np
import pytest
import torch

import luminal.functional as F
from optest import RNG, check_op


def _low(a: torch.Tensor) -> torch.Tensor:
    """The symmetric matrix of a's lower triangle: eigvalsh's values, and the gradient of a
    function that reads that triangle only (torch's own eigvalsh gradient is symmetric)."""
    return a.tril() + a.tril(-1).mT


def _sym(*shape: int) -> np.ndarray:
    a = RNG.standard_normal(shape).astype(np.float32)
    return a + np.swapaxes(a, -1, -2)


@pytest.mark.slow
def test_eigvalsh_and_svdvals():
    a = _sym(5, 3, 3)
    a[0, 0, 2] += 2.0  # not symmetric: each UPLO reads its own triangle
    wide = RNG.standard_normal((2, 3, 7)).astype(np.float32)

    def fn(a, w):
        return F.eigvalsh(a), F.eigvalsh(a, "U"), F.svdvals(w)

    def ref(a, w):
        la = torch.linalg
        return la.eigvalsh(_low(a)), la.eigvalsh(_low(a.mT), "U"), la.svdvals(w)

    check_op("eigvalsh_svdvals", fn, ref, [a, wide], atol=2e-5, rtol=2e-5)


@pytest.mark.slow
def test_pinv():
    tall = RNG.standard_normal((2, 5, 3)).astype(np.float32)
    low_rank = (RNG.standard_normal((3, 1)) @ RNG.standard_normal((1, 4))).astype(np.float32)
    sym = _sym(3, 3)

    def fn(t, r, s):
        return F.pinv(t), F.pinv(r), F.pinv(t.mT, atol=1e-3), F.pinv(s, hermitian=True)

    def ref(t, r, s):
        la = torch.linalg
        return la.pinv(t), la.pinv(r), la.pinv(t.mT, atol=1e-3), la.pinv(_low(s), hermitian=True)

    check_op("pinv", fn, ref, [tall, low_rank, sym], atol=2e-4, rtol=2e-4)


@pytest.mark.slow
def test_householder_qr():
    tall = RNG.standard_normal((2, 5, 3)).astype(np.float32)
    wide = RNG.standard_normal((3, 4)).astype(np.float32)
    c = RNG.standard_normal((2, 5, 2)).astype(np.float32)

    def fn(t, w, c):
        a, tau = F.geqrf(t)
        q, r = F.qr(t)
        qc, rc = F.qr(w, "complete")
        return (a, tau, F.householder_product(a, tau), F.ormqr(a, tau, c, True, True), q, r,
                qc, rc)  # fmt: skip

    def ref(t, w, c):
        a, tau = torch.geqrf(t)
        q, r = torch.linalg.qr(t)
        qc, rc = torch.linalg.qr(w, "complete")
        return (a, tau, torch.linalg.householder_product(a, tau),
                torch.ormqr(a, tau, c, True, True), q, r, qc, rc)  # fmt: skip

    check_op("householder_qr", fn, ref, [tall, wide, c], atol=2e-5, rtol=2e-5)
