"""Small dense factorizations and solves, unrolled over a static matrix size:
``solve_triangular`` (forward / back substitution), ``cholesky`` / ``cholesky_ex``, and LU with
partial pivoting (``lu_factor_ex``, ``lu_solve``, ``permutation_matrix``).

Each row (column) of the result is one step built from the earlier ones, so the graph grows as
n^2 in the matrix size; the size must be static and at most ``MAX_UNROLLED``. No pivoting is
needed for the first two (triangular solves divide by the diagonal; Cholesky of a
positive-definite matrix is stable as it stands); LU picks each pivot with an ARGMAX and
exchanges rows with a GATHER, as LAPACK's getrf chooses them.
"""

from __future__ import annotations

from ..graph import dtypes as dt
from ..tensor import Tensor
from ._base import need_tensor
from .elementwise import abs, isnan, logical_or, lt, where
from .index import gather
from .movement import cat
from .reduce import argmax

__all__ = ["MAX_UNROLLED", "cholesky", "cholesky_ex", "lu_factor_ex", "lu_solve",
           "permutation_matrix", "solve_triangular"]  # fmt: skip

MAX_UNROLLED = 16  # graphs grow as n^2 (n^3 work): compile time stays in seconds


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
    positive, 0 if none.

    Once a matrix's pivot fails, its later columns are computed from a pivot of 1 and zeros and
    only the output shows NaN: the gradient then stays finite (zero where the output is unused)
    instead of carrying sqrt's NaN slope into every matrix of the batch."""
    cols: list[Tensor] = []  # finite columns the later steps read
    outs: list[Tensor] = []
    rows = a.graph.arange(n, dtype=dt.i32).reshape((n, 1))
    good: Tensor | None = None  # (..., 1, 1): every pivot so far positive
    for j in range(n):
        c = a.slice(-1, j, 1)  # column j, (..., n, 1)
        for lk in cols:
            c = c.add(lk.mul(_elem(lk, j, 0).mul(-1.0)))
        piv = c.slice(-2, j, 1)  # (..., 1, 1)
        ok = piv.gt(0.0)
        good = ok if good is None else good.logical_and(ok)
        col = c.mul(where(good, piv, 1.0).sqrt().reciprocal())
        col = where(lt(rows, j).expand(col.shape), 0.0, col)
        cols.append(where(good.expand(col.shape), col, 0.0))
        outs.append(where(good.expand(col.shape), col, float("nan")))
    low = cat(outs, -1)
    return low, _first_bad(low, True)  # a failed pivot leaves NaN on L's diagonal


def cholesky_ex(A: Tensor, upper: bool = False) -> tuple[Tensor, Tensor]:  # noqa: N803
    """(L, info) as ``torch.linalg.cholesky_ex``: L lower (or its transpose if ``upper``)
    with A = L L^T; info > 0 names the first leading minor that is not positive definite
    (L then holds NaN from there). A is taken as symmetric: both triangles are read, as
    (A + A^T) / 2."""
    a = need_tensor("cholesky", A)
    n = _square("cholesky", a)
    if not a.dtype.is_float:
        raise TypeError(f"cholesky: needs a float matrix, got {a.dtype.name}")
    if n == 0:
        return a, a.graph.zeros(*a.shape[:-2], dtype=dt.i32)
    # The symmetric part equals A on the symmetric matrices Cholesky is defined for, and its
    # gradient is torch's symmetrized one (reading one triangle would leave the other at 0).
    low, info = _cholesky_lower(a.add(a.mT).mul(0.5), n)
    return (low.mT if upper else low), info


def cholesky(A: Tensor, upper: bool = False) -> Tensor:  # noqa: N803
    return cholesky_ex(A, upper)[0]


def _swap_rows(m: Tensor, k: int, p: Tensor) -> Tensor:
    """m with rows k and p (a (..., 1, 1) index per matrix) exchanged."""
    n = m.shape[-2]
    i = m.graph.arange(n, dtype=dt.i64).reshape((n, 1))
    pe = p.expand((*p.shape[:-2], n, 1))
    src = where(i.eq(k).expand(pe.shape), pe, where(i.eq(pe), k, i.expand(pe.shape)))
    return gather(m, -2, src.expand((*pe.shape[:-1], m.shape[-1])))


def lu_factor_ex(A: Tensor) -> tuple[Tensor, Tensor, Tensor]:  # noqa: N803
    """(LU, pivots, info) as ``torch.linalg.lu_factor_ex``: partial pivoting on the first
    largest |entry| of each column (LAPACK's choice), pivots 1-based int32, info the first
    zero pivot (1-based) or 0."""
    a = need_tensor("lu_factor", A)
    m, n = (a.shape[-2], a.shape[-1]) if a.ndim >= 2 else (None, None)
    if not isinstance(m, int) or not isinstance(n, int) or max(m, n) > MAX_UNROLLED:
        raise ValueError(f"lu_factor: needs (..., m, n) matrices of static m, n <= "
                         f"{MAX_UNROLLED}, got {a.shape}")  # fmt: skip
    if not a.dtype.is_float:
        raise TypeError(f"lu_factor: needs a float matrix, got {a.dtype.name}")
    g = a.graph
    lead = a.shape[:-2]
    if min(m, n) == 0:
        return a, g.zeros(*lead, 0, dtype=dt.i32), g.zeros(*lead, dtype=dt.i32)
    rows = g.arange(m, dtype=dt.i64).reshape((m, 1))
    cols = g.arange(n, dtype=dt.i64).reshape((1, n))
    pivots: list[Tensor] = []
    for k in range(min(m, n)):
        col = abs(a.slice(-1, k, 1))  # (..., n, 1)
        col = where(lt(rows, k).expand(col.shape), -1.0, col)
        p = argmax(col, -2, keepdim=True)  # (..., 1, 1)
        a = _swap_rows(a, k, p)
        pivots.append(p.add(1).cast(dt.i32))
        piv = _elem(a, k, k)
        below = where(rows.gt(k), 1.0, 0.0)
        # a zero pivot (its column is zero from k down) is not divided by, as LAPACK's getrf:
        # the column stays 0 and info names it; the double where keeps the gradient finite
        zero = piv.eq(0.0)
        inv = where(zero, 0.0, where(zero, 1.0, piv).reciprocal())
        lcol = a.slice(-1, k, 1).mul(inv).mul(below)  # (..., n, 1) below k
        urow = a.slice(-2, k, 1).mul(where(cols.gt(k), 1.0, 0.0))  # (..., 1, n) right of k
        a = a.add(lcol.mul(urow).mul(-1.0))
        a = where(rows.gt(k).logical_and(cols.eq(k)).expand(a.shape), lcol.expand(a.shape), a)
    piv_t = cat(pivots, -1).reshape((*lead, min(m, n)))
    return a, piv_t, _first_bad(a.slice(-1, 0, min(m, n)).slice(-2, 0, min(m, n)), False)


def _first_bad(f: Tensor, nan_too: bool) -> Tensor:
    """1 + the index of the first zero (or NaN) on the diagonal of the finished factor, 0 if
    none. Read from the factor, not carried through the steps: a value chained through every
    step would be one expression of exponential size once fused."""
    from .elementwise import eq
    from .movement import diagonal

    d = diagonal(f, 0, -2, -1)
    bad = eq(d, 0.0)
    if nan_too:
        bad = logical_or(bad, isnan(d))
    n = d.shape[-1]
    assert isinstance(n, int), "unrolled factorizations have static sizes"
    rev = f.graph.arange(n, 0, -1, dtype=dt.i32)  # n - k: the first bad index scores highest
    best = where(bad, rev.expand(bad.shape), 0).max_reduce(-1)
    return where(best.eq(0), 0, best.mul(-1).add(n + 1)).cast(dt.i32)


def _unpack(lu: Tensor) -> tuple[Tensor, Tensor]:
    """(L, U) of a packed (..., m, n) factorization: L (m, k) unit lower, U (k, n), k = min."""
    m, n = lu.shape[-2], lu.shape[-1]
    assert isinstance(m, int) and isinstance(n, int)
    k = min(m, n)
    g = lu.graph
    r = g.arange(m, dtype=dt.i64).reshape((m, 1))
    c = g.arange(n, dtype=dt.i64).reshape((1, n))
    low = where(r.gt(c).expand(lu.shape), lu, where(r.eq(c).expand(lu.shape), 1.0, 0.0))
    up = where(lt(r, c).logical_or(r.eq(c)).expand(lu.shape), lu, 0.0)
    return low.slice(-1, 0, k), up.slice(-2, 0, k)


def _apply_pivots(b: Tensor, pivots: Tensor) -> Tensor:
    """P^T b: the row exchanges of the factorization applied to b in order."""
    count = pivots.shape[-1]
    if not isinstance(count, int):
        raise ValueError(f"lu: pivots of a static length needed, got {pivots.shape}")
    for k in range(count):
        p = pivots.slice(-1, k, 1).add(-1).cast(dt.i64).unsqueeze(-1)  # (..., 1, 1)
        b = _swap_rows(b, k, p)
    return b


def lu_solve(LU: Tensor, pivots: Tensor, B: Tensor) -> Tensor:  # noqa: N803
    """X with A X = B from ``lu_factor_ex``'s factors."""
    low, up = _unpack(LU)
    y = solve_triangular(low, _apply_pivots(B, pivots), upper=False, unitriangular=True)
    return solve_triangular(up, y, upper=True)


def permutation_matrix(pivots: Tensor, n: int) -> Tensor:
    """P with A = P L U for the factorization's pivots."""
    eye = pivots.graph.eye(n, dtype=dt.f32)
    eye = eye.expand((*pivots.shape[:-1], n, n))
    return _apply_pivots(eye, pivots).mT
