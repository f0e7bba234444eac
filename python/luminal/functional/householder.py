"""Householder QR named as in PyTorch: geqrf, householder_product, ormqr, qr, for matrices of
a static size, unrolled column by column.

The reflectors are LAPACK's (``dlarfg``): for a column with head alpha and tail x, beta =
-sign(alpha) ||(alpha, x)||, tau = (beta - alpha) / beta, v = (1, x / (alpha - beta)); a tail
of zeros gives tau = 0. Computed in f64 and rounded to the input's dtype, so R's signs and Q
agree with ``torch.linalg.qr``.
"""

from __future__ import annotations

from ..graph import dtypes as dt
from ..tensor import Tensor
from ._base import float_dtype, need_tensor
from .elementwise import eq, lt, where
from .linalg import matmul

__all__ = ["geqrf", "householder_product", "ormqr", "qr"]

MAX_QR = 16


def _static(name: str, a: Tensor) -> tuple[int, int]:
    m, n = (a.shape[-2], a.shape[-1]) if a.ndim >= 2 else (None, None)
    if not isinstance(m, int) or not isinstance(n, int) or max(m, n) > MAX_QR:
        raise ValueError(f"{name}: needs (..., m, n) matrices of static m, n <= {MAX_QR}, "
                         f"got {a.shape}")  # fmt: skip
    return m, n


def _reflector(a: Tensor, j: int, m: int) -> Tensor:
    """v_j (..., m, 1): 0 above row j, 1 at j, the stored tail below."""
    rows = a.graph.arange(m, dtype=dt.i64).reshape((m, 1))
    col = a.slice(-1, j, 1)
    return where(lt(rows, j).expand(col.shape), 0.0,
                 where(eq(rows, j).expand(col.shape), 1.0, col))  # fmt: skip


def geqrf(A: Tensor) -> tuple[Tensor, Tensor]:  # noqa: N803
    """(a, tau) as ``torch.geqrf``: R on and above the diagonal, the reflectors' tails below."""
    x = need_tensor("geqrf", A)
    m, n = _static("geqrf", x)
    out = float_dtype(x)
    a = x.cast(dt.f64)
    g = a.graph
    rows = g.arange(m, dtype=dt.i64).reshape((m, 1))
    cols = g.arange(n, dtype=dt.i64).reshape((1, n))
    taus = []
    for j in range(min(m, n)):
        col = a.slice(-1, j, 1)  # (..., m, 1)
        below = lt(j, rows).expand(col.shape)
        tail = where(below, col, 0.0)
        alpha = a.slice(-2, j, 1).slice(-1, j, 1)  # (..., 1, 1)
        xnorm2 = tail.mul(tail).sum_reduce(-2, keepdim=True)
        flat = eq(xnorm2, 0.0)
        norm = alpha.mul(alpha).add(xnorm2).sqrt()
        beta = where(lt(alpha, 0.0), norm, norm.mul(-1.0))
        safe_beta = where(flat, 1.0, beta)
        tau = where(flat, 0.0, beta.add(alpha.mul(-1.0)).mul(safe_beta.reciprocal()))
        scale = where(flat, 1.0, alpha.add(beta.mul(-1.0))).reciprocal()
        v = where(below, col.mul(scale), where(eq(rows, j).expand(col.shape), 1.0, 0.0))
        # the trailing columns: A <- (I - tau v v^T) A, right of column j
        right = lt(j, cols).expand(a.shape)
        w = matmul(v.mT, a)  # (..., 1, n)
        upd = a.add(v.mul(tau).mul(w).mul(-1.0))
        a = where(right, upd, a)
        # column j: beta on the diagonal, v's tail below
        at_j = eq(cols, j).expand(a.shape)
        newcol = where(below, v, where(eq(rows, j).expand(col.shape), where(flat, alpha, beta),
                                       col))  # fmt: skip
        a = where(at_j, newcol.expand(a.shape), a)
        taus.append(tau.reshape(tuple(a.shape[:-2]) + (1,)))
    from .movement import cat

    tau_t = cat(taus, -1) if taus else g.zeros(*a.shape[:-2], 0, dtype=dt.f64)
    return a.cast(out), tau_t.cast(out)


def _q_full(a: Tensor, tau: Tensor, m: int) -> Tensor:
    """H_1 ... H_k (..., m, m), k = tau's length."""
    k = tau.shape[-1]
    assert isinstance(k, int)
    eye = a.graph.eye(m, dtype=dt.f64)
    q = eye.expand((*a.shape[:-2], m, m))
    for j in range(k):
        v = _reflector(a, j, m)
        t = tau.slice(-1, j, 1).unsqueeze(-1)  # (..., 1, 1)
        q = q.add(matmul(q, v).mul(t).mul(v.mT).mul(-1.0))
    return q


def householder_product(A: Tensor, tau: Tensor) -> Tensor:  # noqa: N803
    """The first n columns of H_1 ... H_k (``torch.linalg.householder_product``)."""
    x = need_tensor("householder_product", A)
    t = need_tensor("householder_product", tau, "tau")
    m, n = _static("householder_product", x)
    k = t.shape[-1]
    if n > m or not isinstance(k, int) or k > n:
        raise ValueError(f"householder_product: needs m >= n >= k, got A {x.shape}, tau {t.shape}")
    out = float_dtype(x)
    q = _q_full(x.cast(dt.f64), t.cast(dt.f64), m)
    return q.slice(-1, 0, n).cast(out)


def ormqr(A: Tensor, tau: Tensor, C: Tensor, left: bool = True, transpose: bool = False  # noqa: N803
          ) -> Tensor:  # fmt: skip
    """Q C, Q^T C, C Q or C Q^T for Q = H_1 ... H_k of geqrf's output (``torch.ormqr``)."""
    x = need_tensor("ormqr", A)
    t = need_tensor("ormqr", tau, "tau")
    c = need_tensor("ormqr", C, "C")
    m, _ = _static("ormqr", x)
    out = float_dtype(c)
    q = _q_full(x.cast(dt.f64), t.cast(dt.f64), m)
    if transpose:
        q = q.mT
    c64 = c.cast(dt.f64)
    return (matmul(q, c64) if left else matmul(c64, q)).cast(out)


def qr(A: Tensor, mode: str = "reduced") -> tuple[Tensor, Tensor]:  # noqa: N803
    """(Q, R) as ``torch.linalg.qr``; mode 'r' gives an empty Q."""
    x = need_tensor("qr", A)
    m, n = _static("qr", x)
    if mode not in ("reduced", "complete", "r"):
        raise ValueError(f"qr: mode must be 'reduced', 'complete' or 'r', got {mode!r}")
    k = min(m, n)
    a, tau = geqrf(x.cast(dt.f64))
    rows_r = m if mode == "complete" else k
    r = a.triu().slice(-2, 0, rows_r)
    out = float_dtype(x)
    if mode == "r":
        return x.graph.zeros(0, dtype=out), r.cast(out)
    q = _q_full(a, tau, m)
    if mode == "reduced":
        q = q.slice(-1, 0, k)
    return q.cast(out), r.cast(out)
