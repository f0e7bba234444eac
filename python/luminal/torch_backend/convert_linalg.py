"""Converters of linear algebra: matrix products (``mm``, ``addmm`` and kin, the grouped
products of mixtures of experts, bilinear forms), distances, and the factorizations and solves
of small static matrices that luminal unrolls (triangular solves, Cholesky, LU, determinants,
inverses, QR, eigenvalues and singular values). Same contract as ``convert.py``: arguments
arrive as luminal values, ``Unsupported`` sends a node to eager.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from .. import functional as F
from ..graph import dtypes as dt
from ..tensor import Tensor, broadcast_shapes
from .convert import Converter, Ctx, constant, empty_output, named_op, op, output_used, static_shape
from .symbols import Unsupported

aten = torch.ops.aten


# ----------------------------------------------------------------------------- products
@op(aten.mm.default, aten.bmm.default, aten.matmul.default)
def _mm(cx: Ctx, a: Tensor, b: Tensor) -> Tensor:
    return F.matmul(a, b)


# beta * input + alpha * a product of the other two operands; only the product differs
_SCALED_PRODUCTS: dict[Any, Callable[..., Tensor]] = {
    aten.addmm.default: F.addmm,
    aten.baddbmm.default: F.baddbmm,
    aten.addmv.default: F.addmv,
    aten.addbmm.default: F.addbmm,
    aten.addr.default: F.addr,
}


def _scaled_product(fn: Callable[..., Tensor]) -> Converter:
    def convert(cx: Ctx, bias: Tensor, a: Tensor, b: Tensor, *, beta: Any = 1, alpha: Any = 1
                ) -> Tensor:  # fmt: skip
        return fn(bias, a, b, beta=beta, alpha=alpha)

    return convert


for _target, _fn in _SCALED_PRODUCTS.items():
    op(_target)(_scaled_product(_fn))


@op(aten._cdist_forward.default)
def _cdist(cx: Ctx, x1: Tensor, x2: Tensor, p: float, compute_mode: Any = None) -> Tensor:
    diff = F.sub(x1.unsqueeze(-2), x2.unsqueeze(-3))  # (..., P, R, M)
    return F.norm(diff, p, -1)


# ----------------------------------------------------------------------------- bilinear, distances
@op(aten._trilinear.default)
def _trilinear(cx: Ctx, i1: Tensor, i2: Tensor, i3: Tensor, expand1: Sequence[int],
               expand2: Sequence[int], expand3: Sequence[int], sumdim: Sequence[int],
               unroll_dim: int = 1) -> Tensor:  # fmt: skip
    """Each operand gets size-1 dims at its ``expand`` positions; the product is summed over
    ``sumdim`` (``F.bilinear`` is x1 (n, 1, i, 1) * W (1, o, i, j) * x2 (n, 1, 1, j))."""
    terms = []
    for x, ex in ((i1, expand1), (i2, expand2), (i3, expand3)):
        for d in sorted(ex):
            x = x.unsqueeze(d)
        terms.append(x)
    dtype = dt.promote(dt.promote(i1.dtype, i2.dtype), i3.dtype)
    prod = F.mul(F.mul(terms[0].cast(dtype), terms[1].cast(dtype)), terms[2].cast(dtype))
    return prod.sum_reduce(sorted(sumdim)) if sumdim else prod


@op(aten._pdist_forward.default)
def _pdist(cx: Ctx, x: Tensor, p: float = 2.0) -> Tensor:
    """||x_i - x_j||_p for i < j, row by row (torch.pdist's order)."""
    n, _ = static_shape(x, "pdist")
    i, j = np.triu_indices(n, 1)
    if len(i) == 0:
        return F.full(cx.g, (0,), 0, dtype=x.dtype)
    a = F.index_select(x, 0, constant(cx, i.astype(np.int64)))
    b = F.index_select(x, 0, constant(cx, j.astype(np.int64)))
    return F.vector_norm(F.sub(a, b), p, -1)


# ----------------------------------------------------------------------------- grouped products
def _grouped_rows(cx: Ctx, a: Any, b: Any, offs: Any, what: str) -> Tensor:
    """Rows of ``a`` (S, K) grouped by ``offs`` (the groups' cumulative ends), each times its
    group's matrix of ``b`` (E, K, N): row s belongs to the first group whose end is past s.
    Rows past the last end are 0 (transformers' fallback leaves them so; PyTorch's kernel
    leaves them unwritten). Each row reads its group's matrix: the work of the grouped
    product, not of a product by every group."""
    if not all(isinstance(t, Tensor) for t in (a, b, offs)):
        raise Unsupported(f"{what} without offsets")
    if a.ndim != 2 or b.ndim != 3 or offs.ndim != 1:
        raise Unsupported(f"{what} of {a.ndim}-d by {b.ndim}-d operands (rows grouped by "
                          "offsets, (S, K) x (E, K, N), converts)")  # fmt: skip
    e = b.shape[0]
    if not isinstance(e, int):
        raise Unsupported(f"{what} over a symbolic number of groups")
    rows = F.arange(cx.g, a.shape[0], dtype=dt.i64)
    ended = F.le(offs.cast(dt.i64).unsqueeze(0), rows.unsqueeze(1))  # (S, E)
    group = ended.cast(dt.i64).sum_reduce(-1)
    w = F.index_select(b.cast(a.dtype), 0, F.clamp(group, 0, e - 1))  # (S, K, N)
    out = F.mul(a.unsqueeze(-1), w).sum_reduce(1)
    return F.where(F.lt(group, e).unsqueeze(-1), out, 0.0)


@op(aten._grouped_mm.default)
def _grouped_mm(cx: Ctx, a: Any, b: Any, offs: Any = None, bias: Any = None,
                out_dtype: Any = None) -> Tensor:  # fmt: skip
    if bias is not None:
        raise Unsupported("_grouped_mm with a bias")
    return _grouped_rows(cx, a, b, offs, "_grouped_mm")


@named_op("transformers.grouped_mm_fallback.default")
def _grouped_mm_fallback(cx: Ctx, a: Any, b: Any, offs: Any = None) -> Tensor:
    return _grouped_rows(cx, a, b, offs, "grouped_mm_fallback")


# ----------------------------------------------------------------------------- small linear algebra
def _unrolled(x: Tensor, what: str) -> None:
    n = x.shape[-1] if x.ndim >= 2 else None
    if not isinstance(n, int) or n > F.MAX_UNROLLED or n != x.shape[-2]:
        raise Unsupported(f"{what} of {x.shape} (static square, n <= {F.MAX_UNROLLED})")


@op(aten.linalg_solve_triangular.default)
def _solve_triangular(cx: Ctx, a: Tensor, b: Tensor, *, upper: bool, left: bool = True,
                      unitriangular: bool = False) -> Tensor:  # fmt: skip
    _unrolled(a, "solve_triangular")
    return F.solve_triangular(a, b, upper=upper, left=left, unitriangular=unitriangular)


@op(aten.triangular_solve.default)
def _triangular_solve(cx: Ctx, b: Tensor, a: Tensor, upper: bool = True, transpose: bool = False,
                      unitriangular: bool = False) -> tuple:  # fmt: skip
    _unrolled(a, "triangular_solve")
    m = a.mT if transpose else a
    x = F.solve_triangular(m, b, upper=upper != transpose, unitriangular=unitriangular)
    return x, a


@op(aten.linalg_cholesky_ex.default)
def _cholesky_ex(cx: Ctx, a: Tensor, *, upper: bool = False, check_errors: bool = False) -> tuple:
    if check_errors:
        raise Unsupported("cholesky_ex(check_errors=True) raises on bad input: eager does")
    _unrolled(a, "cholesky")
    return tuple(F.cholesky_ex(a, upper))


@op(aten.cholesky.default)
def _cholesky(cx: Ctx, a: Tensor, upper: bool = False) -> Tensor:
    _unrolled(a, "cholesky")
    return F.cholesky(a, upper)


def _lu(a: Tensor, what: str, square: bool = True) -> tuple[Tensor, Tensor, Tensor]:
    if square:
        _unrolled(a, what)
    elif a.ndim < 2 or not all(isinstance(v, int) and v <= F.MAX_UNROLLED for v in a.shape[-2:]):
        raise Unsupported(f"{what} of {a.shape} (static, at most {F.MAX_UNROLLED})")
    if not a.dtype.is_float:
        raise Unsupported(f"{what} of a {a.dtype.name} matrix")
    return F.lu_factor_ex(a)


def _parity_sign(piv: Tensor) -> Tensor:
    """(-1)^(number of row exchanges), in f32 (..., )."""
    n = piv.shape[-1]
    ks = F.arange(piv.graph, 1, n + 1, dtype=dt.i32)
    swaps = F.ne(piv, ks).cast(dt.f32).sum_reduce(-1)
    return F.add(F.mul(F.fmod(swaps, 2.0), -2.0), 1.0)


@op(aten.linalg_lu_factor_ex.default)
def _lu_factor_ex(cx: Ctx, a: Tensor, *, pivot: bool = True, check_errors: bool = False) -> tuple:
    if not pivot or check_errors:
        raise Unsupported("lu_factor without pivoting or with check_errors")
    return _lu(a, "lu_factor", square=False)


@op(aten.linalg_lu.default)
def _linalg_lu(cx: Ctx, a: Tensor, *, pivot: bool = True) -> tuple:
    if not pivot:
        raise Unsupported("lu without pivoting")
    lu, piv, _ = _lu(a, "lu", square=False)
    low, up = F.triangular._unpack(lu)
    return F.permutation_matrix(piv, _static(a.shape[-2])).cast(a.dtype), low, up


def _static(v: Any) -> int:
    if not isinstance(v, int):
        raise Unsupported("a symbolic matrix size")
    return v


@op(aten.lu_unpack.default)
def _lu_unpack(cx: Ctx, lu: Tensor, piv: Tensor, unpack_data: bool = True,
               unpack_pivots: bool = True) -> tuple:  # fmt: skip
    if lu.ndim < 2 or not all(isinstance(v, int) and v <= F.MAX_UNROLLED for v in lu.shape[-2:]):
        raise Unsupported(f"lu_unpack of {lu.shape}")
    low, up = F.triangular._unpack(lu)
    p = F.permutation_matrix(piv, _static(lu.shape[-2])).cast(lu.dtype)
    if not unpack_data:
        low, up = empty_output(cx, 1), empty_output(cx, 2)
    if not unpack_pivots:
        p = empty_output(cx, 0)
    return p, low, up


@op(aten._linalg_det.default)
def _det(cx: Ctx, a: Tensor) -> tuple:
    lu, piv, _ = _lu(a, "det")
    diag = F.diagonal(lu, 0, -2, -1)
    det = F.mul(F.prod(diag, -1), _parity_sign(piv).cast(a.dtype))
    return det, lu, piv


@op(aten._linalg_slogdet.default)
def _slogdet(cx: Ctx, a: Tensor) -> tuple:
    lu, piv, _ = _lu(a, "slogdet")
    diag = F.diagonal(lu, 0, -2, -1)
    sign = F.mul(F.prod(F.sign(diag), -1), _parity_sign(piv).cast(a.dtype))
    logabs = F.sum(F.log(F.abs(diag)), -1)
    return sign, logabs, lu, piv


@op(aten.linalg_inv_ex.default)
def _inv_ex(cx: Ctx, a: Tensor, *, check_errors: bool = False) -> tuple:
    if check_errors:
        raise Unsupported("inv_ex(check_errors=True) raises on bad input: eager does")
    lu, piv, info = _lu(a, "inv")
    n = a.shape[-1]
    eye = cx.g.eye(n, dtype=a.dtype).expand(a.shape)
    return F.lu_solve(lu, piv, eye), info


@op(aten._linalg_solve_ex.default)
def _solve_ex(cx: Ctx, a: Tensor, b: Tensor, *, left: bool = True, check_errors: bool = False
              ) -> tuple:  # fmt: skip
    if not left or check_errors:
        raise Unsupported("solve_ex with left=False or check_errors")
    lu, piv, info = _lu(a, "solve")
    vec = b.ndim == a.ndim - 1 or b.ndim == 1
    bm = b.unsqueeze(-1) if vec else b
    if bm.ndim != a.ndim:
        raise Unsupported("solve with B of another rank than A")
    x = F.lu_solve(lu, piv, bm)
    return (x.squeeze(-1) if vec else x), lu, piv, info


# ----------------------------------------------------------------------------- decompositions
def _batched_pair(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    lead = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return a.expand((*lead, *a.shape[-2:])), b.expand((*lead, *b.shape[-2:]))


def _chol_solve(b: Tensor, factor: Tensor, upper: bool) -> Tensor:
    """X with (L L^T) X = B, L lower (or U^T U with U upper)."""
    low = factor.mT if upper else factor
    low, b = _batched_pair(low, b)
    d = dt.promote(low.dtype, b.dtype)
    low, b = low.cast(d), b.cast(d)
    y = F.solve_triangular(low, b, upper=False)
    return F.solve_triangular(low.mT, y, upper=True)


@op(aten.cholesky_solve.default)
def _cholesky_solve(cx: Ctx, b: Tensor, factor: Tensor, upper: bool = False) -> Tensor:
    if factor.ndim >= 2 and factor.shape[-1] == 0:
        return F.full(cx.g, cx.shape(), 0, dtype=cx.dtype)
    _unrolled(factor, "cholesky_solve")
    if b.ndim < 2:
        raise Unsupported("cholesky_solve of a vector")
    return _chol_solve(b, factor, upper)


@op(aten.cholesky_inverse.default)
def _cholesky_inverse(cx: Ctx, factor: Tensor, upper: bool = False) -> Tensor:
    if factor.ndim >= 2 and factor.shape[-1] == 0:
        return F.full(cx.g, cx.shape(), 0, dtype=cx.dtype)
    _unrolled(factor, "cholesky_inverse")
    n = factor.shape[-1]
    eye = cx.g.eye(n, dtype=factor.dtype).expand(factor.shape)
    return _chol_solve(eye, factor, upper)


@op(aten.linalg_lu_solve.default)
def _lu_solve(cx: Ctx, lu: Tensor, piv: Tensor, b: Tensor, *, left: bool = True,
              adjoint: bool = False) -> Tensor:  # fmt: skip
    """A X = B (or A^T X = B, X A = B, X A^T = B) with A = P L U from lu_factor."""
    _unrolled(lu, "lu_solve")
    if b.ndim < 2:
        raise Unsupported("lu_solve of a vector")
    if not left:  # X A = B  <=>  A^T X^T = B^T (real matrices: adjoint is the transpose)
        return _lu_solve(cx, lu, piv, b.mT, left=True, adjoint=not adjoint).mT
    lead = broadcast_shapes(broadcast_shapes(lu.shape[:-2], b.shape[:-2]), piv.shape[:-1])
    n = lu.shape[-1]
    lu = lu.expand((*lead, n, n))
    piv = piv.expand((*lead, n))
    b = b.expand((*lead, *b.shape[-2:])).cast(lu.dtype)
    if not adjoint:
        return F.lu_solve(lu, piv, b)
    # A^T X = B: U^T L^T P^T X = B
    low, up = F.triangular._unpack(lu)
    y = F.solve_triangular(up.mT, b, upper=False)
    z = F.solve_triangular(low.mT, y, upper=True, unitriangular=True)
    return F.matmul(F.permutation_matrix(piv, int(n)).cast(lu.dtype), z)  # type: ignore[arg-type]


@op(aten._linalg_eigh.default)
def _eigh(cx: Ctx, a: Tensor, UPLO: str = "L", compute_v: bool = True) -> tuple:  # noqa: N803
    if compute_v and output_used(cx, 1):
        raise Unsupported("eigenvectors (their signs are LAPACK's choice)")
    if a.numel() == 0:
        return empty_output(cx, 0), empty_output(cx, 1)
    return F.eigvalsh(a, UPLO), empty_output(cx, 1)


@op(aten._linalg_svd.default)
def _svd(cx: Ctx, a: Tensor, full_matrices: bool = True, compute_uv: bool = True,
         driver: Any = None) -> tuple:  # fmt: skip
    if compute_uv and (output_used(cx, 0) or output_used(cx, 2)):
        raise Unsupported("singular vectors (their signs are LAPACK's choice)")
    if a.numel() == 0:
        return empty_output(cx, 0), empty_output(cx, 1), empty_output(cx, 2)
    return empty_output(cx, 0), F.svdvals(a), empty_output(cx, 2)


@op(aten.linalg_pinv.atol_rtol_tensor, aten.linalg_pinv.atol_rtol_float)
def _pinv(cx: Ctx, a: Tensor, *, atol: Any = None, rtol: Any = None, hermitian: bool = False
          ) -> Tensor:  # fmt: skip
    return F.pinv(a, atol, rtol, hermitian)


@op(aten.geqrf.default)
def _geqrf(cx: Ctx, a: Tensor) -> tuple:
    return F.geqrf(a)


@op(aten.linalg_householder_product.default)
def _householder_product(cx: Ctx, a: Tensor, tau: Tensor) -> Tensor:
    return F.householder_product(a, tau)


@op(aten.ormqr.default)
def _ormqr(cx: Ctx, a: Tensor, tau: Tensor, c: Tensor, left: bool = True,
           transpose: bool = False) -> Tensor:  # fmt: skip
    return F.ormqr(a, tau, c, left, transpose)


@op(aten.linalg_qr.default)
def _qr(cx: Ctx, a: Tensor, mode: str = "reduced") -> tuple:
    if a.numel() == 0:
        return empty_output(cx, 0), empty_output(cx, 1)
    return F.qr(a, mode)
