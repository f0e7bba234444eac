"""Small dense factorizations and solves, unrolled over a static matrix size:
``solve_triangular`` (forward / back substitution) and ``cholesky`` / ``cholesky_ex``.

Each row (column) of the result is one step built from the earlier ones, so the graph grows as
n^2 in the matrix size; the size must be static and at most ``MAX_UNROLLED``. No pivoting is
needed for either (triangular solves divide by the diagonal; Cholesky of a positive-definite
matrix is stable as it stands).
"""

from __future__ import annotations

from ..graph import dtypes as dt
from ..tensor import Tensor
from ._base import need_tensor
from .elementwise import isnan, logical_or, lt, where
from .movement import cat

__all__ = ["MAX_UNROLLED", "cholesky", "cholesky_ex", "solve_triangular"]

MAX_UNROLLED = 32


def _square(name: str, a: Tensor) -> int:
    if a.ndim < 2 or not isinstance(a.shape[-1], int) or a.shape[-1] != a.shape[-2]:
        raise ValueError(f"{name}: needs (..., n, n) matrices of a static n, got {a.shape}")
    n = a.shape[-1]
    if n > MAX_UNROLLED:
        raise ValueError(f"{name}: n = {n} exceeds {MAX_UNROLLED} (the solve is unrolled)")
    return n


def _elem(a: Tensor, i: int, j: int) -> Tensor:
    return a.slice(-2, i, 1).slice(-1, j, 1)  # (..., 1, 1)


def solve_triangular(A: Tensor, B: Tensor, *, upper: bool, left: bool = True,  # noqa: N803
                     unitriangular: bool = False) -> Tensor:  # fmt: skip
    """X with A X = B (``left``) or X A = B, A triangular (the other triangle is ignored)."""
    a = need_tensor("solve_triangular", A)
    b = need_tensor("solve_triangular", B, "B")
    if not left:  # X A = B  <=>  A^T X^T = B^T
        return solve_triangular(a.mT, b.mT, upper=not upper, unitriangular=unitriangular).mT
    n = _square("solve_triangular", a)
    if b.ndim < 2 or b.shape[-2] != n:
        raise ValueError(f"solve_triangular: B {b.shape} needs {n} rows for A {a.shape}")
    d = dt.promote(a.dtype, b.dtype)
    a, b = a.cast(d), b.cast(d)
    if n == 0:
        return b
    rows: dict[int, Tensor] = {}
    order = range(n - 1, -1, -1) if upper else range(n)
    for i in order:
        r = b.slice(-2, i, 1)  # (..., 1, k)
        for j in rows:
            r = r.add(_elem(a, i, j).mul(rows[j]).mul(-1.0))
        rows[i] = r if unitriangular else r.mul(_elem(a, i, i).reciprocal())
    return cat([rows[i] for i in range(n)], -2)


def _cholesky_lower(a: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """(L, info): columns left to right; info is the first (1-based) column whose pivot is not
    positive, 0 if none."""
    cols: list[Tensor] = []
    bad = a.slice(-1, 0, 1).slice(-2, 0, 1).mul(0.0).cast(dt.i32)  # (..., 1, 1) zeros
    rows = a.graph.arange(n, dtype=dt.i32).reshape((n, 1))
    for j in range(n):
        c = a.slice(-1, j, 1)  # column j, (..., n, 1)
        for lk in cols:
            c = c.add(lk.mul(_elem(lk, j, 0).mul(-1.0)))
        piv = c.slice(-2, j, 1)  # (..., 1, 1)
        fails = logical_or(lt(piv, 0.0), logical_or(piv.eq(0.0), isnan(piv)))
        bad = where(fails.logical_and(bad.eq(0)), j + 1, bad)
        col = c.mul(piv.sqrt().reciprocal())
        cols.append(where(lt(rows, j).expand(col.shape), 0.0, col))
    return cat(cols, -1), bad.reshape(bad.shape[:-2])


def cholesky_ex(A: Tensor, upper: bool = False) -> tuple[Tensor, Tensor]:  # noqa: N803
    """(L, info) as ``torch.linalg.cholesky_ex``: L lower (or its transpose if ``upper``)
    with A = L L^T; info > 0 names the first leading minor that is not positive definite
    (L then holds NaN from there)."""
    a = need_tensor("cholesky", A)
    n = _square("cholesky", a)
    if not a.dtype.is_float:
        raise TypeError(f"cholesky: needs a float matrix, got {a.dtype.name}")
    if n == 0:
        return a, a.graph.zeros(*a.shape[:-2], dtype=dt.i32)
    low, info = _cholesky_lower(a, n)
    return (low.mT if upper else low), info


def cholesky(A: Tensor, upper: bool = False) -> Tensor:  # noqa: N803
    return cholesky_ex(A, upper)[0]
