"""Symmetric eigenvalues and what builds on them, named as in PyTorch (``torch.linalg``):
eigvalsh, svdvals, pinv, for small matrices of a static size.

Cyclic Jacobi rotations in f64, unrolled: each round rotates n/2 disjoint (p, q) pairs at once
(the round-robin order, so every pair meets once per sweep) as A <- J^T A J, a fixed number of
sweeps that the tests show reach f64 rounding for n <= 16 (Jacobi converges quadratically).
Singular values are the square roots of the eigenvalues of A^T A (or A A^T), whose absolute
error is f64 rounding of sigma_max^2: far below f32's for the inputs PyTorch's f32 ops take.
Eigenvectors are not offered: their signs are LAPACK's choice, not a property of the matrix;
pinv uses them only in sign-free products.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..graph import dtypes as dt
from ..tensor import Tensor
from ._base import float_dtype, need_tensor
from .elementwise import abs, eq, lt, where
from .linalg import matmul
from .ordering import sort

__all__ = ["eigvalsh", "pinv", "svdvals"]

MAX_EIGEN = 16  # unrolled rounds grow as n * sweeps


def _rounds(n: int) -> list[list[tuple[int, int]]]:
    """Disjoint (p, q) pairs per round; over n - 1 (n even) rounds every pair appears once."""
    m = n + n % 2
    players = list(range(m))
    out = []
    for _ in range(m - 1):
        pairs = [(min(players[i], players[m - 1 - i]), max(players[i], players[m - 1 - i]))
                 for i in range(m // 2)]  # fmt: skip
        out.append([(p, q) for p, q in pairs if q < n])
        players = [players[0], players[-1], *players[1:-1]]
    return out


def _sweeps(n: int) -> int:
    return 6 if n <= 5 else 8 if n <= 8 else 10


def _jacobi(a: Tensor, vectors: bool) -> tuple[Tensor, Tensor | None]:
    """(diagonal after the sweeps (..., n), the accumulated rotations V or None) for a
    symmetric f64 (..., n, n): A = V diag(w) V^T."""
    n = a.shape[-1]
    assert isinstance(n, int)
    g = a.graph
    lead = tuple(a.shape[:-2])
    eye = g.eye(n, dtype=dt.f64)
    v = eye.expand((*lead, n, n)) if vectors else None
    for _ in range(_sweeps(n)):
        for pairs in _rounds(n):
            k = len(pairs)
            flat = a.reshape((*lead, n * n))

            def pick(ix: list[int], flat: Tensor = flat, k: int = k) -> Tensor:
                idx = g.tensor(np.asarray(ix, np.int64))
                return flat.gather(-1, idx.expand((*lead, k)))

            app = pick([p * n + p for p, _ in pairs])
            aqq = pick([q * n + q for _, q in pairs])
            apq = pick([p * n + q for p, q in pairs])
            # tan of the smaller angle that zeroes a_pq: 2 a_pq sgn(d) / (|d| + sqrt(d^2 +
            # 4 a_pq^2)), d = a_qq - a_pp; no division by a_pq, so gradients stay finite
            d = aqq.add(app.mul(-1.0))
            r2 = d.mul(d).add(apq.mul(apq).mul(4.0))
            zero = eq(r2, 0.0)
            den = abs(d).add(where(zero, 1.0, r2).sqrt())
            sg = where(lt(d, 0.0), -2.0, 2.0)
            t = where(zero, 0.0, apq.mul(sg).mul(where(zero, 1.0, den).reciprocal()))
            c = t.mul(t).add(1.0).sqrt().reciprocal()
            s = t.mul(c)
            mdiag = np.zeros((k, n, n))
            moff = np.zeros((k, n, n))
            for j, (p, q) in enumerate(pairs):
                mdiag[j, p, p] = mdiag[j, q, q] = 1.0
                moff[j, p, q], moff[j, q, p] = 1.0, -1.0
            cm = c.add(-1.0).unsqueeze(-1).unsqueeze(-1).mul(g.tensor(mdiag))
            sm = s.unsqueeze(-1).unsqueeze(-1).mul(g.tensor(moff))
            rot = eye.add(cm.add(sm).sum_reduce(-3))  # (..., n, n)
            a = matmul(matmul(rot.mT, a), rot)
            if v is not None:
                v = matmul(v, rot)
    diag = a.reshape((*lead, n * n)).gather(
        -1, g.tensor(np.arange(n, dtype=np.int64) * (n + 1)).expand((*lead, n))
    )
    return diag, v


def _static_square(name: str, a: Tensor) -> int:
    n = a.shape[-1] if a.ndim >= 2 else None
    if not isinstance(n, int) or n != a.shape[-2] or n > MAX_EIGEN:
        raise ValueError(f"{name}: needs (..., n, n) matrices of a static n <= {MAX_EIGEN}, "
                         f"got {a.shape}")  # fmt: skip
    return n


def _symmetric(a: Tensor, upper: bool) -> Tensor:
    """The symmetric matrix of the triangle torch reads (``UPLO``)."""
    tri = a.triu() if upper else a.tril()
    strict = a.triu(1) if upper else a.tril(-1)
    return tri.add(strict.mT)


def eigvalsh(A: Tensor, UPLO: str = "L") -> Tensor:  # noqa: N803
    """Eigenvalues of a symmetric matrix, ascending, read from its lower (or upper) triangle."""
    a = need_tensor("eigvalsh", A)
    n = _static_square("eigvalsh", a)
    if UPLO not in ("L", "U"):
        raise ValueError(f"eigvalsh: UPLO must be 'L' or 'U', got {UPLO!r}")
    out = float_dtype(a)
    if n == 0:
        return a.graph.zeros(*a.shape[:-1], dtype=out)
    w, _ = _jacobi(_symmetric(a.cast(dt.f64), UPLO == "U"), False)
    return sort(w, -1)[0].cast(out)


def svdvals(A: Tensor) -> Tensor:  # noqa: N803
    """Singular values, descending: square roots of the eigenvalues of A^T A (or A A^T)."""
    a = need_tensor("svdvals", A)
    if a.ndim < 2:
        raise ValueError(f"svdvals: needs (..., m, n) matrices, got {a.shape}")
    m, n = a.shape[-2], a.shape[-1]
    if not isinstance(m, int) or not isinstance(n, int) or min(m, n) > MAX_EIGEN:
        raise ValueError(f"svdvals: needs static min(m, n) <= {MAX_EIGEN}, got {a.shape}")
    out = float_dtype(a)
    if min(m, n) == 0:
        return a.graph.zeros(*a.shape[:-2], 0, dtype=out)
    x = a.cast(dt.f64)
    gram = matmul(x.mT, x) if n <= m else matmul(x, x.mT)
    w, _ = _jacobi(gram, False)
    w = sort(w, -1, descending=True)[0]
    return where(lt(w, 0.0), 0.0, w).sqrt().cast(out)


def pinv(A: Tensor, atol: Any = None, rtol: Any = None, hermitian: bool = False) -> Tensor:  # noqa: N803
    """The Moore-Penrose pseudo-inverse as ``torch.linalg.pinv``: singular values (eigenvalues'
    magnitudes when ``hermitian``) at most max(atol, rtol * largest) count as zero; rtol
    defaults to eps * max(m, n) when neither is given (0 when only atol is)."""
    a = need_tensor("pinv", A)
    if a.ndim < 2:
        raise ValueError(f"pinv: needs (..., m, n) matrices, got {a.shape}")
    m, n = a.shape[-2], a.shape[-1]
    if not isinstance(m, int) or not isinstance(n, int) or min(m, n) > MAX_EIGEN:
        raise ValueError(f"pinv: needs static min(m, n) <= {MAX_EIGEN}, got {a.shape}")
    out = float_dtype(a)
    if min(m, n) == 0:
        return a.graph.zeros(*a.shape[:-2], n, m, dtype=out)
    eps = float(np.finfo(np.float64 if out is dt.f64 else np.float32).eps)
    if rtol is None:
        rtol = eps * max(m, n) if atol is None or _is_zero(atol) else 0.0
    atol = 0.0 if atol is None else atol
    x = a.cast(dt.f64)
    if hermitian:
        w, v = _jacobi(_symmetric(x, False), True)
        assert v is not None
        mag = abs(w)
        tol = _tol(atol, rtol, mag.max_reduce(-1, keepdim=True))
        inv = where(lt(tol, mag), where(eq(w, 0.0), 1.0, w).reciprocal(), 0.0)
        res = matmul(v.mul(inv.unsqueeze(-2)), v.mT)
        return res.cast(out)
    tall = n <= m
    gram = matmul(x.mT, x) if tall else matmul(x, x.mT)
    w, v = _jacobi(gram, True)
    assert v is not None
    sv = where(lt(w, 0.0), 0.0, w).sqrt()
    tol = _tol(atol, rtol, sv.max_reduce(-1, keepdim=True))
    inv2 = where(lt(tol, sv), where(eq(w, 0.0), 1.0, w).reciprocal(), 0.0)
    core = matmul(v.mul(inv2.unsqueeze(-2)), v.mT)  # (A^T A)^+ (or (A A^T)^+)
    res = matmul(core, x.mT) if tall else matmul(x.mT, core)
    return res.cast(out)


def _is_zero(v: Any) -> bool:
    return not isinstance(v, Tensor) and float(v) == 0.0


def _tol(atol: Any, rtol: Any, top: Tensor) -> Tensor:
    """max(atol, rtol * top), atol / rtol numbers or tensors broadcasting over the batch."""
    a = atol.cast(dt.f64).unsqueeze(-1) if isinstance(atol, Tensor) else atol
    r = rtol.cast(dt.f64).unsqueeze(-1) if isinstance(rtol, Tensor) else rtol
    rel = top.mul(r)
    if isinstance(a, Tensor):
        return where(lt(rel, a), a, rel)
    return where(lt(rel, float(a)), float(a), rel)
