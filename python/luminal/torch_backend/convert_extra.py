"""More converters of ``convert.TABLE``: sorting and order statistics, scatter / index
reductions, special functions, pooling and the remaining copies and views. Same contract as
``convert.py``: arguments arrive as luminal values, ``Unsupported`` sends a node to eager.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from .. import functional as F
from ..graph import dtypes as dt
from ..graph import symbolic as sym
from ..graph.view import contiguous_strides, idx_vars
from ..tensor import Tensor, broadcast_shapes
from . import convert as _convert
from .convert import Ctx, named_op, op
from .symbols import Unsupported

aten = torch.ops.aten


def _static_axis(x: Tensor, dim: int, what: str, symbolic: bool = False) -> None:
    if isinstance(x.numel(), int) and x.numel() == 0:
        raise Unsupported(f"{what} of an empty tensor")  # nothing to compute: eager is free
    n = x.shape[x._axis(dim)] if x.ndim else 1
    if not isinstance(n, int) and not symbolic or isinstance(n, int) and n > F.MAX_SORT:
        raise Unsupported(f"{what} along an axis of {n} (static and at most {F.MAX_SORT})")


def _output_used(cx: Ctx, k: int) -> bool:
    users = cx.node.users if cx.node is not None else {}
    return any(not (u.target is operator.getitem and u.args[1] != k) for u in users)


# ----------------------------------------------------------------------------- ordering
# luminal's sort is stable. An unstable sort (PyTorch's default) leaves the order of equal
# elements unspecified, so the stable order is one it may give; PyTorch's CPU kernel keeps
# ties in order up to 16 elements and not beyond, so indices of ties can differ from eager's
# there (a mixture of experts' routing sorts expert ids full of ties: its output does not
# depend on their order).


@op(aten.sort.default)
def _sort(cx: Ctx, x: Tensor, dim: int = -1, descending: bool = False) -> tuple:
    _static_axis(x, dim, "sort", symbolic=True)
    return tuple(F.sort(x, dim, descending))


@op(aten.sort.stable)
def _sort_stable(cx: Ctx, x: Tensor, *, stable: Any = None, dim: int = -1,
                 descending: bool = False) -> tuple:  # fmt: skip
    _static_axis(x, dim, "sort", symbolic=True)
    return tuple(F.sort(x, dim, descending))


@op(aten.argsort.default)
def _argsort(cx: Ctx, x: Tensor, dim: int = -1, descending: bool = False) -> Tensor:
    _static_axis(x, dim, "argsort", symbolic=True)
    return F.argsort(x, dim, descending)


@op(aten.argsort.stable)
def _argsort_stable(cx: Ctx, x: Tensor, *, stable: bool, dim: int = -1, descending: bool = False
                    ) -> Tensor:  # fmt: skip
    _static_axis(x, dim, "argsort", symbolic=True)
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
    (aten.special_modified_bessel_i0.default, F.i0),
    (aten.special_modified_bessel_i1.default, F.i1),
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


# ----------------------------------------------------------------------------- normalizations
def _mean_rstd(x: Tensor, dims: list[int], eps: float) -> tuple[Tensor, Tensor]:
    """The saved statistics of a normalization (kept dims, f32 for low precision)."""
    xf = x.cast(dt.f32) if x.dtype in (dt.f16, dt.bf16) else x
    mean = F.mean(xf, dims, keepdim=True)
    cen = F.sub(xf, mean)
    return mean, F.rsqrt(F.add(F.mean(F.mul(cen, cen), dims, keepdim=True), eps))


@op(aten.native_layer_norm.default)
def _layer_norm(cx: Ctx, x: Tensor, shape: Sequence[Any], w: Any, b: Any, eps: float) -> tuple:
    # mean / rstd (outputs 1 and 2): computed only where a graph output reads them
    mean, rstd = _mean_rstd(x, list(range(x.ndim - len(shape), x.ndim)), eps)
    return F.layer_norm(x, list(shape), w, b, eps), mean, rstd


@op(aten._native_batch_norm_legit_no_training.default)
def _batch_norm(cx: Ctx, x: Tensor, w: Any, b: Any, rm: Tensor, rv: Tensor, momentum: float,
                eps: float) -> tuple:  # fmt: skip
    out = F.batch_norm(x, rm, rv, w, b, False, momentum, eps)
    # the saved statistics are empty in inference (read back as such); else backward's only
    extra = [F.full(cx.g, cx.shape(k), 0, dtype=dt.to_dtype(cx.val[k].dtype))
             if cx.val[k].numel() == 0 else None for k in (1, 2)]  # fmt: skip
    return out, *extra


@op(aten.native_group_norm.default)
def _group_norm(cx: Ctx, x: Tensor, w: Any, b: Any, n: Any, c: Any, hw: Any, groups: int,
                eps: float) -> tuple:  # fmt: skip
    if x.numel() == 0 or not isinstance(x.shape[1], int):
        return F.group_norm(x, groups, w, b, eps), None, None
    g = x.reshape([x.shape[0], groups, -1])
    mean, rstd = _mean_rstd(g, [2], eps)
    return F.group_norm(x, groups, w, b, eps), mean.squeeze(2), rstd.squeeze(2)


def _bn_batch(x: Tensor, w: Any, b: Any, eps: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Training-mode batch norm: (out, mean, 1/sqrt(var + eps), unbiased var) per channel."""
    dims = [0, *range(2, x.ndim)]
    xf = x.cast(dt.f32) if x.dtype in (dt.f16, dt.bf16) else x
    mean = F.mean(xf, dims, keepdim=True)
    cen = F.sub(xf, mean)
    var = F.mean(F.mul(cen, cen), dims, keepdim=True)
    rstd = F.rsqrt(F.add(var, eps))
    out = F.mul(cen, rstd)
    bshape = [1, x.shape[1]] + [1] * (x.ndim - 2)
    if w is not None:
        out = F.mul(out, w.reshape(bshape))
    if b is not None:
        out = F.add(out, b.reshape(bshape))
    n = F._base.prod([x.shape[k] for k in dims])
    if not isinstance(n, int):
        raise Unsupported("batch statistics over symbolic sizes")
    unbiased = F.mul(var, n / (n - 1)) if n > 1 else F.mul(var, math.nan)
    flat = [x.shape[1]]
    return out.cast(x.dtype), mean.reshape(flat), rstd.reshape(flat), unbiased.reshape(flat)


def _running(r: Any, new: Tensor, momentum: float) -> Any:
    if r is None:
        return None
    return F.add(F.mul(r, 1.0 - momentum), F.mul(new.cast(r.dtype), momentum))


def _empty_like_val(cx: Ctx, k: int) -> Tensor:
    return F.full(cx.g, cx.shape(k), 0, dtype=dt.to_dtype(cx.val[k].dtype))


@op(aten._native_batch_norm_legit_functional.default)
def _bn_functional(cx: Ctx, x: Tensor, w: Any, b: Any, rm: Any, rv: Any, training: bool,
                   momentum: float, eps: float) -> tuple:  # fmt: skip
    if not training:
        out = F.batch_norm(x, rm, rv, w, b, False, momentum, eps)
        return out, _empty_like_val(cx, 1), _empty_like_val(cx, 2), rm, rv
    out, mean, rstd, var = _bn_batch(x, w, b, eps)
    return out, mean, rstd, _running(rm, mean, momentum), _running(rv, var, momentum)


@op(aten._native_batch_norm_legit.no_stats)
def _bn_no_stats(cx: Ctx, x: Tensor, w: Any, b: Any, training: bool, momentum: float,
                 eps: float) -> tuple:  # fmt: skip
    out, mean, rstd, _ = _bn_batch(x, w, b, eps)
    return out, mean, rstd


@op(aten._batch_norm_with_update_functional.default)
def _bn_update_functional(cx: Ctx, x: Tensor, w: Any, b: Any, rm: Tensor, rv: Tensor,
                          momentum: float, eps: float) -> tuple:  # fmt: skip
    out, mean, rstd, var = _bn_batch(x, w, b, eps)
    return (out, mean, rstd, _empty_like_val(cx, 3), _running(rm, mean, momentum),
            _running(rv, var, momentum))  # fmt: skip


# ----------------------------------------------------------------------------- copies, creation
@op(aten.empty_permuted.default, aten.new_empty_strided.default)
def _empty(cx: Ctx, *args: Any, **kw: Any) -> Tensor:
    return F.full(cx.g, cx.shape(), 0, dtype=cx.dtype)  # any value is right for empty memory


@op(aten.narrow_copy.default)
def _narrow_copy(cx: Ctx, x: Tensor, dim: int, start: Any, length: Any) -> Tensor:
    return _convert.TABLE[aten.narrow.default](cx, x, dim, start, length)


@op(aten.view_copy.default, aten._reshape_copy.default)
def _view_copy(cx: Ctx, x: Tensor, *args: Any, **kw: Any) -> Tensor:
    return x.reshape(cx.shape())


@op(aten.permute_copy.default)
def _permute_copy(cx: Ctx, x: Tensor, dims: Any) -> Tensor:
    return x.permute(list(dims))


@op(aten.unbind_copy.int)
def _unbind_copy(cx: Ctx, x: Tensor, dim: int = 0) -> tuple:
    return F.unbind(x, dim)


@op(aten.angle.default)
def _angle(cx: Ctx, x: Tensor) -> Tensor:
    xf = x.cast(cx.dtype)
    return F.where(F.isnan(xf), math.nan, F.where(F.lt(xf, 0.0), math.pi, 0.0)).cast(cx.dtype)


def _norm_start(start: Any, n: Any) -> int:
    if start is None:
        return 0
    if not isinstance(start, int) or not isinstance(n, int):
        raise Unsupported("a scatter into a slice at a symbolic position")
    return min(max(start + n if start < 0 else start, 0), n)


def _slice_scatter_unit(cx: Ctx, x: Tensor, src: Tensor, d: int, start: Any, end: Any) -> Tensor:
    """Unit steps: ``src`` padded into place and selected by a range test, with bounds that
    may be symbolic."""
    n = x.shape[d]
    lo = 0 if start is None else start
    hi = n if end is None else end
    if not all(isinstance(e, (int, sym.Expr)) for e in (lo, hi)):
        raise Unsupported("slice_scatter with non-integer bounds")
    lo = cx.dims.position(lo, n, "slice_scatter")
    hi = sym.minimum(cx.dims.position(hi, n, "slice_scatter"), n)
    placed = src.cast(x.dtype).pad_dim(d, lo, sym.add(n, sym.mul(hi, -1)))
    pos = F.arange(cx.g, n, dtype=dt.i32).reshape([n if k == d else 1 for k in range(x.ndim)])
    bounds: tuple[Any, Any] = (lo, hi)  # dims: Tensor comparisons take expressions too
    inside = F.logical_and(F.ge(pos, bounds[0]), F.lt(pos, bounds[1]))
    return F.where(inside.expand(x.shape), placed, x)


@op(aten.slice_scatter.default)
def _slice_scatter(cx: Ctx, x: Tensor, src: Tensor, dim: int = 0, start: Any = None,
                   end: Any = None, step: int = 1) -> Tensor:  # fmt: skip
    """``x`` with ``x[start:end:step]`` along ``dim`` replaced by ``src``."""
    d = x._axis(dim)
    if step == 1:
        return _slice_scatter_unit(cx, x, src, d, start, end)
    n, m = x.shape[d], src.shape[d]
    s0 = _norm_start(start, n)
    if not isinstance(m, int):
        raise Unsupported("a strided scatter of a symbolic-length slice")
    if m == 0:
        return x
    i = idx_vars((n,))[0]
    off = sym.add(i, -s0)
    j = sym.minimum(sym.maximum(sym.floordiv(off, step), 0), m - 1)
    ge0 = sym.add(1, sym.mul(sym.lt(off, 0), -1))
    inside = sym.mul(sym.mul(ge0, sym.lt(off, m * step)), sym.eq(sym.mod(off, step), 0))
    taken = F.index_select(src.cast(x.dtype), d, F._base.iota(cx.g, (n,), j, dt.i64))
    mask = F._base.iota(cx.g, (n,), inside, dt.i32).cast(dt.bool_)
    mask = mask.reshape([n if k == d else 1 for k in range(x.ndim)]).expand(x.shape)
    return F.where(mask, taken, x)


@op(aten.diagonal_scatter.default)
def _diagonal_scatter(cx: Ctx, x: Tensor, src: Tensor, offset: int = 0, dim1: int = 0,
                      dim2: int = 1) -> Tensor:  # fmt: skip
    d1, d2 = x._axis(dim1), x._axis(dim2)
    a, b = x.shape[d1], x.shape[d2]
    length = src.shape[-1]
    if not all(isinstance(v, int) for v in (a, b, length)):
        raise Unsupported("diagonal_scatter over symbolic sizes")
    if length == 0:
        return x
    rest = [k for k in range(x.ndim) if k not in (d1, d2)]
    t = x.permute(rest + [d1, d2])
    ia, ib = idx_vars((a, b))
    n_along = a if offset >= 0 else b  # the source index is the row (column) index
    k = sym.minimum(idx_vars((n_along,))[0], length - 1)
    pick = F.index_select(src.cast(x.dtype), -1, F._base.iota(cx.g, (n_along,), k, dt.i64))
    srcx = pick.unsqueeze(-1) if offset >= 0 else pick.unsqueeze(-2)
    srcx = srcx.expand(t.shape)
    on = F._base.iota(cx.g, (a, b), sym.eq(sym.add(ib, sym.mul(ia, -1)), offset), dt.i32)
    mask = on.cast(dt.bool_).expand(t.shape)
    out = F.where(mask, srcx, t)
    inv = [0] * x.ndim
    for pos, k2 in enumerate(rest + [d1, d2]):
        inv[k2] = pos
    return out.permute(inv)


# ----------------------------------------------------------------------------- index reductions
@op(aten.scatter_reduce.two)
def _scatter_reduce(cx: Ctx, x: Tensor, dim: int, index: Tensor, src: Tensor, reduce: str, *,
                    include_self: bool = True) -> Tensor:  # fmt: skip
    if reduce == "mean" and not x.dtype.is_float:
        raise Unsupported("an integer scatter_reduce mean (PyTorch floors it)")
    return F.scatter_reduce(x, dim, index, src, reduce, include_self=include_self)


@op(aten.index_reduce.default)
def _index_reduce(cx: Ctx, x: Tensor, dim: int, index: Tensor, src: Tensor, reduce: str, *,
                  include_self: bool = True) -> Tensor:  # fmt: skip
    if reduce == "mean" and not x.dtype.is_float:
        raise Unsupported("an integer index_reduce mean (PyTorch floors it)")
    return F.index_reduce(x, dim, index, src, reduce, include_self=include_self)


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


# ----------------------------------------------------------------------------- pooling, windows
@op(aten.adaptive_max_pool2d.default, aten.adaptive_max_pool3d.default)
def _adaptive_max(cx: Ctx, x: Tensor, output_size: Any) -> tuple:
    nd = len(output_size)
    name = f"adaptive_max_pool{nd}d"
    if _output_used(cx, 1):
        spatial = x.shape[x.ndim - nd :]
        if not all(isinstance(v, int) for v in spatial):
            raise Unsupported(f"{name} indices over symbolic sizes")
        return tuple(F.adaptive_max_pool_indices(name, x, list(output_size), nd))
    return F.conv._adaptive(name, x, list(output_size), nd, True), None


@op(aten._adaptive_avg_pool3d.default)
def _adaptive_avg3d(cx: Ctx, x: Tensor, output_size: Any) -> Tensor:
    return F.conv._adaptive("adaptive_avg_pool3d", x, list(output_size), 3, False)


@op(aten.avg_pool3d.default)
def _avg_pool3d(cx: Ctx, x: Tensor, kernel: Any, stride: Any = (), padding: Any = 0,
                ceil_mode: bool = False, count_include_pad: bool = True,
                divisor_override: Any = None) -> Tensor:  # fmt: skip
    return F.conv._pool("avg_pool3d", x, list(kernel), list(stride) or None, padding, 1,
                        ceil_mode, 3, False, count_include_pad, divisor_override)  # fmt: skip


@op(aten.unfold.default)
def _unfold(cx: Ctx, x: Tensor, dim: int, size: int, step: int) -> Tensor:
    """Windows of ``size`` every ``step`` along ``dim``, the window axis appended last."""
    if x.ndim == 0:
        return x.reshape((1,))
    d = x._axis(dim)
    n = x.shape[d]
    if not isinstance(n, int):
        raise Unsupported("unfold along a symbolic axis")
    w = (n - size) // step + 1
    if w <= 0 or size == 0:
        return F.full(cx.g, cx.shape(), 0, dtype=cx.dtype)
    wi, ki = idx_vars((w, size))
    pos = F._base.iota(cx.g, (w, size), sym.add(sym.mul(wi, step), ki), dt.i64)
    taken = F.index_select(x, d, pos.reshape((w * size,)))  # (..., w*size, ...) at d
    shape = list(x.shape)
    shape[d : d + 1] = [w, size]
    out = taken.reshape(shape)
    order = [k for k in range(len(shape)) if k != d + 1] + [d + 1]
    return out.permute(order)


def _owns_storage(v: Any) -> bool:
    return isinstance(v, torch.Tensor) and v.storage_offset() == 0 and v.is_contiguous()


def _storage_base(cx: Ctx, x: Tensor) -> Tensor:
    """The value whose contiguous layout is the storage ``x`` views: ``x`` itself, or the
    source of the views (a transpose, then a reshape: Longformer's chunks) that led to it."""
    node = cx.node.args[0] if cx.node is not None else None
    if node is None or not isinstance(node.meta.get("val"), torch.Tensor):
        raise Unsupported("as_strided of a value without a known layout")
    storage = StorageWeakRef(node.meta["val"].untyped_storage())
    while not _owns_storage(node.meta.get("val")):
        up = [a for a in node.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor)
              and StorageWeakRef(a.meta["val"].untyped_storage()) == storage]  # fmt: skip
        if len(up) != 1:
            raise Unsupported("as_strided of a tensor that is not its own contiguous storage, "
                              "nor a view of one")  # fmt: skip
        node = up[0]
    base = cx.values.get(node) if node is not cx.node.args[0] else x
    if not isinstance(base, Tensor):
        raise Unsupported("as_strided of a view whose source luminal does not hold")
    return base


@op(aten.as_strided.default, aten.as_strided_copy.default)
def _as_strided(cx: Ctx, x: Tensor, size: Any, stride: Any, storage_offset: Any = None) -> Tensor:
    x = _storage_base(cx, x)  # as_strided addresses the storage, not the view it is called on
    off = storage_offset or 0
    last: Any = off  # the furthest element read: within the storage, or PyTorch reads others'
    for n, st in zip(size, stride, strict=True):
        last = sym.add(last, sym.mul(sym.add(n, -1), st))
    if any(isinstance(n, int) and n == 0 for n in size):
        last = -1
    if not sym.prove_lt(last, x.numel()):
        raise Unsupported(f"as_strided reading up to element {last} of {x.numel()}")
    if (
        tuple(size) == tuple(x.shape)
        and off == 0
        and all(
            n == 1 or F._base.same(st, want)
            for n, st, want in zip(size, stride, contiguous_strides(x.shape), strict=True)
        )
    ):
        return x  # x's own layout restated (AOTAutograd restrides a keepdim reduction so)
    flat = x.reshape((-1,)) if x.ndim != 1 else x
    shape = tuple(size)
    expr: Any = off
    for v, st in zip(idx_vars(shape), stride, strict=True):
        expr = sym.add(expr, sym.mul(v, st))
    if not shape:
        return flat.slice(0, off, 1).reshape(())
    idx = F._base.iota(cx.g, shape, expr, dt.i64)
    return F._base.gather_flat(flat, idx)


# ----------------------------------------------------------------------------- searching, bits
def _count_before(seq: Tensor, vals: Tensor, right: bool, out_int32: bool) -> Tensor:
    """#{s in seq (last axis) with s < v} (s <= v if ``right``) for each v in ``vals``."""
    if seq.ndim == 1:
        s = seq.reshape([1] * vals.ndim + [seq.shape[0]])
    else:
        s = seq.unsqueeze(-2)
    v = vals.unsqueeze(-1)
    d = dt.promote(s.dtype, v.dtype)
    s, v = s.cast(d), v.cast(d)
    out_dt = dt.i32 if out_int32 else dt.i64
    shape = broadcast_shapes(s.shape, v.shape)[:-1] if seq.ndim > 1 else vals.shape
    if vals.numel() == 0 or seq.shape[-1] == 0:
        return F.full(seq.graph, shape, 0, dtype=out_dt)
    hit = F.le(s, v) if right else F.lt(s, v)
    if d.is_float:  # PyTorch's binary search puts NaN after every boundary
        hit = F.logical_or(hit, F.isnan(v).expand(hit.shape))
    return hit.cast(out_dt).sum_reduce(-1)


def _side(right: bool, side: Any) -> bool:
    return side == "right" if side is not None else right


@op(aten.bucketize.Tensor, aten.bucketize.Scalar)
def _bucketize(cx: Ctx, x: Any, boundaries: Tensor, *, out_int32: bool = False,
               right: bool = False) -> Tensor:  # fmt: skip
    if not isinstance(x, Tensor):
        x = boundaries._lift(x)
    return _count_before(boundaries, x, right, out_int32)


@op(aten.searchsorted.Tensor, aten.searchsorted.Scalar)
def _searchsorted(cx: Ctx, seq: Tensor, x: Any, *, out_int32: bool = False, right: bool = False,
                  side: Any = None, sorter: Any = None) -> Tensor:  # fmt: skip
    if sorter is not None:
        seq = F.gather(seq, -1, sorter)
    if not isinstance(x, Tensor):
        return _count_before(seq, seq._lift(x).reshape((1,)), _side(right, side),
                             out_int32).reshape(cx.shape())  # fmt: skip
    return _count_before(seq, x, _side(right, side), out_int32)


@op(aten.masked_scatter.default)
def _masked_scatter(cx: Ctx, x: Tensor, mask: Tensor, source: Tensor) -> Tensor:
    """The k-th set position (row-major) takes source's k-th element: k from a cumsum."""
    m = mask.expand(x.shape).reshape((-1,))
    n = source.numel()
    if x.numel() == 0 or n == 0:
        return x
    k = F.cumsum(m.cast(dt.i64), 0).add(-1)
    k = F.clamp(k, 0, n - 1 if isinstance(n, int) else cx.g.constant(sym.add(n, -1), dt.i64))
    taken = F.index_select(source.reshape((-1,)).cast(x.dtype), 0, k)
    return F.where(m, taken, x.reshape((-1,))).reshape(x.shape)


@op(aten.put.default)
def _put(cx: Ctx, x: Tensor, index: Tensor, source: Tensor, accumulate: bool = False) -> Tensor:
    flat = x.reshape((-1,))
    n = flat.shape[0]
    idx = index.reshape((-1,)).cast(dt.i64)
    size = n if isinstance(n, int) else cx.g.constant(n, dt.i64)
    idx = F.where(F.lt(idx, 0), F.add(idx, size), idx)
    src = source.reshape((-1,)).cast(x.dtype)
    if idx.shape[0] == 0:
        return x
    out = F.scatter_add(flat, 0, idx, src) if accumulate else F.scatter(flat, 0, idx, src)
    return out.reshape(x.shape)


@op(aten.frexp.Tensor)
def _frexp(cx: Ctx, x: Tensor) -> tuple:
    """x = m 2^e with 0.5 <= |m| < 1 (0, inf and NaN: m = x, e = 0); in f64, where log2 of
    an f32 or f64 value and the power-of-two scalings are exact up to the fix-up."""
    xf = x.cast(dt.f64)
    a = F.abs(xf)
    special = F.logical_or(F.eq(a, 0.0), F.logical_or(F.isinf(a), F.isnan(a)))
    safe = F.where(special, 1.0, a)
    e = F.add(F.floor(safe.log2()), 1.0)
    m = F.mul(safe, F.exp2(F.neg(e)))
    up = F.ge(m, 1.0)
    e, m = F.where(up, F.add(e, 1.0), e), F.where(up, F.mul(m, 0.5), m)
    down = F.lt(m, 0.5)
    e, m = F.where(down, F.add(e, -1.0), e), F.where(down, F.mul(m, 2.0), m)
    m = F.where(special, xf, F.copysign(m, xf))
    e = F.where(special, 0.0, e)
    return m.cast(x.dtype), e.cast(dt.i32)


@op(aten.nextafter.default)
def _nextafter(cx: Ctx, x: Tensor, y: Tensor) -> Tensor:
    """The next representable value after x toward y: x plus or minus one ulp of x's
    binade (half of it stepping down from a power of two); in f64, exact for f32 and f64."""
    d = dt.promote(x.dtype, y.dtype)
    if d not in (dt.f32, dt.f64):
        raise Unsupported(f"nextafter in {d.name}")
    mant, emin = (24, -126) if d is dt.f32 else (53, -1022)
    xf, yf = x.cast(dt.f64), y.cast(dt.f64)
    a = F.abs(xf)
    safe = F.where(F.logical_or(F.eq(a, 0.0), F.isinf(a)), 1.0, a)
    e = F.maximum(F.floor(safe.log2()), float(emin))  # the binade, denormals in the lowest
    p = F.exp2(e)
    e = F.where(F.lt(a, p), F.add(e, -1.0), F.where(F.ge(a, F.mul(p, 2.0)), F.add(e, 1.0), e))
    e = F.maximum(e, float(emin))
    ulp = F.exp2(F.add(e, float(1 - mant)))
    up = F.lt(xf, yf)
    # stepping toward zero from an exact power of two moves by half an ulp (unless denormal)
    shrink = F.logical_and(F.eq(a, F.exp2(e)), F.gt(e, float(emin)))
    shrink = F.logical_and(shrink, F.where(F.lt(xf, 0.0), up, F.logical_not(up)))
    step = F.where(shrink, F.mul(ulp, 0.5), ulp)
    out = F.where(up, F.add(xf, step), F.sub(xf, step))
    tiny = 2.0 ** (emin - mant + 1)
    out = F.where(F.eq(a, 0.0), F.where(up, tiny, -tiny), out)
    big = float(torch.finfo(torch.float32 if d is dt.f32 else torch.float64).max)
    out = F.where(F.isinf(xf), F.where(F.lt(xf, 0.0), -big, big), out)  # toward finite y
    out = F.where(F.eq(xf, yf), yf, out)
    out = F.where(F.logical_or(F.isnan(xf), F.isnan(yf)), math.nan, out)
    return out.cast(d)


def _cheb_converter(fn: Any) -> Any:
    def conv(cx: Ctx, x: Any, n: Any) -> Tensor:
        if not isinstance(x, Tensor):
            x = _need_tensor_of(n)._lift(x)
        return fn(x, n)

    return conv


def _need_tensor_of(v: Any) -> Tensor:
    if not isinstance(v, Tensor):
        raise Unsupported("both arguments are scalars")
    return v


for _kind in ("t", "u", "v", "w"):
    for _pre in ("", "shifted_"):
        _name = f"{_pre}chebyshev_polynomial_{_kind}"
        _packet = getattr(aten, f"special_{_name}")
        op(*(getattr(_packet, ov) for ov in ("default", "x_scalar", "n_scalar")
             if hasattr(_packet, ov)))(_cheb_converter(getattr(F, _name)))  # fmt: skip


def max_pool_indices(cx: Ctx, x: Tensor, kernel: Any, stride: Any, padding: Any, dilation: Any,
                     nd: int) -> tuple[Tensor, Tensor]:  # fmt: skip
    """(values, indices) of a max pool, the output sizes as torch computed them: each window
    gathered (positions in the padding masked to -inf), the index the first maximum's flat
    position over the input's spatial dims in the window's row-major order."""

    def per_dim(v: Any) -> list[int]:
        v = list(v) if isinstance(v, (list, tuple)) else [v]
        return v * nd if len(v) == 1 else v

    ks, pd, dl = per_dim(kernel), per_dim(padding), per_dim(dilation)
    st = per_dim(stride) if stride else ks
    spatial = [v for v in x.shape[x.ndim - nd :] if isinstance(v, int)]
    outs = [v for v in cx.shape(0)[-nd:] if isinstance(v, int)]
    if len(spatial) != nd or len(outs) != nd or not x.dtype.is_float:
        raise Unsupported("max pool indices over symbolic sizes or a non-float input")
    shape: list[int] = []
    for o, k in zip(outs, ks, strict=True):
        shape += [o, k]
    iv = idx_vars(tuple(shape))
    flat: Any = 0
    valid: Any = 1
    stride_flat = 1
    for d in range(nd - 1, -1, -1):
        o_v, k_v = iv[2 * d], iv[2 * d + 1]
        pos = sym.add(sym.add(sym.mul(o_v, st[d]), -pd[d]), sym.mul(k_v, dl[d]))
        inside = sym.mul(sym.add(1, sym.mul(sym.lt(pos, 0), -1)), sym.lt(pos, spatial[d]))
        valid = sym.mul(valid, inside)
        pos = sym.minimum(sym.maximum(pos, 0), spatial[d] - 1)
        flat = sym.add(flat, sym.mul(pos, stride_flat))
        stride_flat *= spatial[d]
    g = cx.g
    idx = F._base.iota(g, tuple(shape), flat, dt.i64)
    ok = F._base.iota(g, tuple(shape), valid, dt.i32).cast(dt.bool_)
    lead = list(x.shape[: x.ndim - nd])
    xs = x.reshape([*lead, stride_flat])
    win = xs.index_select(-1, idx.reshape((F._base.prod(shape),))).reshape([*lead, *shape])
    okx = ok.expand(win.shape)
    win = F.where(okx, win, -math.inf)
    kaxes = [len(lead) + 2 * k + 1 for k in range(nd)]
    vals = win.max_reduce(kaxes, keepdim=True)
    hit = F.logical_and(F.logical_or(F.eq(win, vals.expand(win.shape)), F.isnan(win)), okx)
    big = F._base.iota(g, win.shape, stride_flat, dt.i64)
    ind = F.where(hit, idx.expand(win.shape), big).amin(kaxes)
    return vals.reshape(ind.shape), ind


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
        low, up = _empty_like_val(cx, 1), _empty_like_val(cx, 2)
    if not unpack_pivots:
        p = _empty_like_val(cx, 0)
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


_convert.MAX_POOL_INDICES = max_pool_indices
