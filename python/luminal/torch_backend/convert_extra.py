"""More converters of ``convert.TABLE``: sorting and order statistics, scatter / index
reductions, special functions, pooling and the remaining copies and views. Same contract as
``convert.py``: arguments arrive as luminal values, ``Unsupported`` sends a node to eager.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from .. import functional as F
from ..tensor import Tensor
from .convert import Ctx, op
from .symbols import Unsupported

aten = torch.ops.aten


def _static_axis(x: Tensor, dim: int, what: str) -> None:
    if x.numel() == 0:
        raise Unsupported(f"{what} of an empty tensor")  # nothing to compute: eager is free
    n = x.shape[x._axis(dim)] if x.ndim else 1
    if not isinstance(n, int) or n > F.MAX_SORT:
        raise Unsupported(f"{what} along an axis of {n} (static and at most {F.MAX_SORT})")


# ----------------------------------------------------------------------------- ordering
def _output_used(cx: Ctx, k: int) -> bool:
    users = cx.node.users if cx.node is not None else {}
    return any(not (u.target is operator.getitem and u.args[1] != k) for u in users)


def _unstable_ok(cx: Ctx, x: Tensor, dim: int) -> None:
    """luminal's sort is stable. PyTorch's unstable CPU sort keeps ties in order up to 16
    elements, not beyond: there the indices of equal values would differ from eager's."""
    n = x.shape[x._axis(dim)] if x.ndim else 1
    if isinstance(n, int) and n > 16 and _output_used(cx, 1):
        raise Unsupported(f"indices of an unstable sort of {n} elements (PyTorch's own order "
                          "of ties); stable=True converts")  # fmt: skip


@op(aten.sort.default)
def _sort(cx: Ctx, x: Tensor, dim: int = -1, descending: bool = False) -> tuple:
    _static_axis(x, dim, "sort")
    _unstable_ok(cx, x, dim)
    return tuple(F.sort(x, dim, descending))


@op(aten.sort.stable)
def _sort_stable(cx: Ctx, x: Tensor, *, stable: Any = None, dim: int = -1,
                 descending: bool = False) -> tuple:  # fmt: skip
    _static_axis(x, dim, "sort")
    if not stable:
        _unstable_ok(cx, x, dim)
    return tuple(F.sort(x, dim, descending))


@op(aten.argsort.default)
def _argsort(cx: Ctx, x: Tensor, dim: int = -1, descending: bool = False) -> Tensor:
    _static_axis(x, dim, "argsort")
    n = x.shape[x._axis(dim)] if x.ndim else 1
    if isinstance(n, int) and n > 16:
        raise Unsupported(f"an unstable argsort of {n} elements (PyTorch's own order of ties)")
    return F.argsort(x, dim, descending)


@op(aten.argsort.stable)
def _argsort_stable(cx: Ctx, x: Tensor, *, stable: bool, dim: int = -1, descending: bool = False
                    ) -> Tensor:  # fmt: skip
    _static_axis(x, dim, "argsort")
    if not stable:
        return _argsort(cx, x, dim, descending)
    return F.argsort(x, dim, descending)


@op(aten.topk.default)
def _topk(cx: Ctx, x: Tensor, k: Any, dim: int = -1, largest: bool = True, sorted: bool = True  # noqa: A002
          ) -> tuple:  # fmt: skip
    if not isinstance(k, int):
        raise Unsupported("topk with a symbolic k")
    _static_axis(x, dim, "topk")
    return tuple(F.topk(x, k, dim, largest, sorted))


@op(aten.kthvalue.default)
def _kthvalue(cx: Ctx, x: Tensor, k: Any, dim: int = -1, keepdim: bool = False) -> tuple:
    if not isinstance(k, int):
        raise Unsupported("kthvalue with a symbolic k")
    _static_axis(x, dim, "kthvalue")
    return tuple(F.kthvalue(x, k, dim, keepdim))


def _whole(x: Tensor, what: str) -> None:
    n = x.numel()
    if not isinstance(n, int) or n > F.MAX_SORT:
        raise Unsupported(f"{what} of {n} elements (static and at most {F.MAX_SORT})")


@op(aten.median.default)
def _median_all(cx: Ctx, x: Tensor) -> Tensor:
    _whole(x, "median")
    return F.median(x)


@op(aten.nanmedian.default)
def _nanmedian_all(cx: Ctx, x: Tensor) -> Tensor:
    _whole(x, "nanmedian")
    return F.nanmedian(x)


@op(aten.median.dim)
def _median_dim(cx: Ctx, x: Tensor, dim: int, keepdim: bool = False) -> tuple:
    _static_axis(x, dim, "median")
    return tuple(F.median(x, dim, keepdim))


@op(aten.nanmedian.dim)
def _nanmedian_dim(cx: Ctx, x: Tensor, dim: int, keepdim: bool = False) -> tuple:
    _static_axis(x, dim, "nanmedian")
    return tuple(F.nanmedian(x, dim, keepdim))


@op(aten.logcumsumexp.default)
def _logcumsumexp(cx: Ctx, x: Tensor, dim: int) -> Tensor:
    return F.logcumsumexp(x, dim)


# ----------------------------------------------------------------------------- special functions
for _tgt, _fn in (
    (aten.digamma.default, F.digamma), (aten.i0.default, F.i0),
    (aten.special_i0e.default, F.i0e), (aten.special_i1.default, F.i1),
    (aten.special_i1e.default, F.i1e), (aten.special_erfcx.default, F.erfcx),
    (aten.special_log_ndtr.default, F.log_ndtr), (aten.erfinv.default, F.erfinv),
    (aten.special_ndtri.default, F.ndtri),
    (aten.special_spherical_bessel_j0.default, F.spherical_bessel_j0),
):  # fmt: skip
    op(_tgt)(lambda cx, x, _fn=_fn: _fn(x))


@op(aten.polygamma.default)
def _polygamma(cx: Ctx, n: Any, x: Tensor) -> Tensor:
    if not isinstance(n, int):
        raise Unsupported("polygamma with a symbolic order")
    return F.polygamma(n, x)


@op(aten.special_zeta.default, aten.special_zeta.self_scalar, aten.special_zeta.other_scalar)
def _zeta(cx: Ctx, s: Any, q: Any) -> Tensor:
    if not isinstance(s, Tensor):
        s = q._lift(s)
    return F.zeta(s, q)
