"""Reductions, scans and softmax named as in PyTorch.

Sums and maxima are the SUM_REDUCE / MAX_REDUCE primitives; minima are maxima of a
sign-flipped (floats) or bit-inverted (integers: no overflow at INT_MIN) input. ``argmax`` takes
the first index on ties with one more MAX_REDUCE over ``hit * (n - i)``. ``prod`` is a pairwise
tree of multiplies over halves of the axis (exact signs, zeros and infinities; log depth) for
static sizes and ``exp2(sum(log2|x|))`` with a sign parity for symbolic ones. ``cumsum`` is a
Hillis–Steele scan: log2(n) adds of the tensor and a shifted (padded, sliced) view of it.
Counts of symbolic dims (``mean`` over ``seq``) are a symbolic constant ``seq`` and a RECIP.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any, NamedTuple

from ..graph import dtypes as dt
from ..graph import symbolic as sym
from ..graph.symbolic import sint
from ..graph.view import idx_vars
from ..tensor import Tensor
from ._base import INF, const, finfo, index_dtype, int_limits, iota, land, lnot, need_tensor
from ._base import prod as _numel
from .elementwise import (
    _eq,
    _in_f32,
    abs,
    bitwise_not,
    clamp,
    fmod,
    isnan,
    lor,
    maximum,
    minimum,
    ne,
    neg,
    pow,
    round,
    where,
)  # fmt: skip
from .transcendental import _exp, _log, sqrt

__all__ = [
    "ValuesIndices",
    "all", "amax", "amin", "any", "argmax", "argmin", "count_nonzero", "cummax", "cummin",
    "cumprod", "cumsum",
    "log_softmax", "logsumexp", "max", "mean", "min", "norm", "prod", "softmax", "std",
    "std_mean", "sum", "var", "var_mean", "vector_norm",
]  # fmt: skip

_LOW = (dt.f16, dt.bf16, dt.f8e4m3, dt.f8e5m2, dt.e8m0, dt.fp4e2m1)


class ValuesIndices(NamedTuple):
    """What ``max(x, dim)`` / ``min(x, dim)`` return, like ``torch.return_types.max``."""

    values: Tensor
    indices: Tensor


def _dims(name: str, x: Tensor, dim: Any) -> list[int]:
    if dim is None or (isinstance(dim, (tuple, list)) and len(dim) == 0):
        return list(range(x.ndim))
    ds = [dim] if isinstance(dim, int) else list(dim)
    axes = [x._axis(d) for d in ds]
    if len(set(axes)) != len(axes):
        raise ValueError(f"{name}: dim {tuple(ds)} repeats a dim of shape {x.shape}")
    return sorted(axes)


def _count(x: Tensor, axes: Sequence[int]) -> sint:
    return _numel([x.shape[a] for a in axes])


def _scale(s: Tensor, n: sint) -> Tensor:
    """s / n for a (possibly symbolic) count n; n == 0 gives inf/nan like PyTorch."""
    if isinstance(n, int) and n:
        return s.mul(1.0 / n)
    return s.mul(s._const(n).reciprocal())


def _acc_dtype(x: Tensor, dtype: Any) -> dt.DType:
    if dtype is not None:
        return dt.to_dtype(dtype)
    return x.dtype if x.dtype.is_float else dt.i64


def sum(input: Tensor, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:  # noqa: A001,A002
    x = need_tensor("sum", input)
    axes = _dims("sum", x, dim)
    return x.cast(_acc_dtype(x, dtype)).sum_reduce(axes, keepdim)


def _need_float(name: str, x: Tensor) -> None:
    if not x.dtype.is_float:
        raise TypeError(f"{name}: needs a floating-point input, got {x.dtype.name}{x.shape} "
                        "(cast with .float() or pass dtype=)")  # fmt: skip


def mean(input: Tensor, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:  # noqa: A002
    x = need_tensor("mean", input)
    if dtype is not None:
        x = x.cast(dtype)
    _need_float("mean", x)
    axes = _dims("mean", x, dim)
    return _in_f32(lambda t: _scale(t.sum_reduce(axes, keepdim), _count(t, axes)))(x)


def _var(x: Tensor, axes: list[int], correction: float, keepdim: bool) -> Tensor:
    n = _count(x, axes)
    m = _scale(x.sum_reduce(axes, True), n)
    d = x.add(neg(m.expand(x.shape)))
    ss = d.mul(d).sum_reduce(axes, keepdim)
    if isinstance(n, int):
        div = builtins.max(n - correction, 0)
        return ss.mul(1.0 / div) if div else ss.mul(ss._const(0.0).reciprocal())
    return _scale(ss, sym.maximum(sym.add(n, -int(correction)), 0))


def var(input: Tensor, dim: Any = None, unbiased: bool | None = None, keepdim: bool = False,  # noqa: A002
        *, correction: float | None = None) -> Tensor:  # fmt: skip
    """Variance with Bessel's ``correction`` (default 1; ``unbiased=False`` means 0)."""
    x = need_tensor("var", input)
    _need_float("var", x)
    if correction is None:
        correction = 0 if unbiased is False else 1
    axes = _dims("var", x, dim)
    return _in_f32(_var)(x, axes, correction, keepdim)


def std(input: Tensor, dim: Any = None, unbiased: bool | None = None, keepdim: bool = False,  # noqa: A002
        *, correction: float | None = None) -> Tensor:  # fmt: skip
    return sqrt(var(input, dim, unbiased, keepdim, correction=correction))


def var_mean(input: Tensor, dim: Any = None, unbiased: bool | None = None, keepdim: bool = False,  # noqa: A002
             *, correction: float | None = None) -> tuple[Tensor, Tensor]:  # fmt: skip
    return var(input, dim, unbiased, keepdim, correction=correction), mean(input, dim, keepdim)


def std_mean(input: Tensor, dim: Any = None, unbiased: bool | None = None, keepdim: bool = False,  # noqa: A002
             *, correction: float | None = None) -> tuple[Tensor, Tensor]:  # fmt: skip
    return std(input, dim, unbiased, keepdim, correction=correction), mean(input, dim, keepdim)


# ----------------------------------------------------------------------------- max / min
def amax(input: Tensor, dim: Any = (), keepdim: bool = False) -> Tensor:  # noqa: A002
    x = need_tensor("amax", input)
    return x.max_reduce(_dims("amax", x, dim), keepdim)


def _flip_order(x: Tensor) -> Tensor:
    """An order-reversing bijection: -x for floats, ~x for ints, not x for bools."""
    if x.dtype is dt.bool_:
        return lnot(x)
    return neg(x) if x.dtype.is_float else bitwise_not(x)


def amin(input: Tensor, dim: Any = (), keepdim: bool = False) -> Tensor:  # noqa: A002
    x = need_tensor("amin", input)
    return _flip_order(_flip_order(x).max_reduce(_dims("amin", x, dim), keepdim))


def _argmax(x: Tensor, d: int, keepdim: bool) -> Tensor:
    """First index of the maximum along ``d`` (NaN counts as the maximum, like PyTorch)."""
    n = x.shape[d]
    m = x.max_reduce(d, keepdim=True).expand(x.shape)
    hit = _eq(x, m)
    if x.dtype.is_float:
        hit = lor(hit, isnan(x))
    idt = index_dtype(sym.add(n, 1))
    rev = iota(x.graph, x.shape, sym.add(n, sym.mul(idx_vars(x.shape)[d], -1)), idt)  # n - i
    best = rev.mul(hit.cast(idt)).max_reduce(d, keepdim)
    return const(x.graph, n, idt, best.shape).add(neg(best)).cast(dt.i64)


def argmax(input: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:  # noqa: A002
    x = need_tensor("argmax", input)
    if dim is None:
        return _argmax(x.reshape(-1) if x.ndim != 1 else x, 0, False)
    return _argmax(x, x._axis(dim), keepdim)


def argmin(input: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:  # noqa: A002
    return argmax(_flip_order(need_tensor("argmin", input)), dim, keepdim)


def max(input: Tensor, dim: Any = None, keepdim: bool = False) -> Any:  # noqa: A001,A002
    """``max(x)``: the maximum; ``max(x, dim)``: (values, indices); ``max(x, other)``: maximum."""
    x = need_tensor("max", input)
    if isinstance(dim, Tensor):
        return maximum(x, dim)
    if dim is None:
        return amax(x)
    return ValuesIndices(amax(x, dim, keepdim), argmax(x, dim, keepdim))


def min(input: Tensor, dim: Any = None, keepdim: bool = False) -> Any:  # noqa: A001,A002
    x = need_tensor("min", input)
    if isinstance(dim, Tensor):
        return minimum(x, dim)
    if dim is None:
        return amin(x)
    return ValuesIndices(amin(x, dim, keepdim), argmin(x, dim, keepdim))


def any(input: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:  # noqa: A001,A002
    x = need_tensor("any", input)
    xb = x if x.dtype is dt.bool_ else ne(x, 0)
    return xb.max_reduce(_dims("any", x, dim), keepdim)


def all(input: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:  # noqa: A001,A002
    x = need_tensor("all", input)
    xb = x if x.dtype is dt.bool_ else ne(x, 0)
    return lnot(lnot(xb).max_reduce(_dims("all", x, dim), keepdim))


def count_nonzero(input: Tensor, dim: Any = None) -> Tensor:  # noqa: A002
    x = need_tensor("count_nonzero", input)
    nz = x if x.dtype is dt.bool_ else ne(x, 0)
    return nz.cast(dt.i64).sum_reduce(_dims("count_nonzero", x, dim))


# ----------------------------------------------------------------------------- products
def _prod_axis(x: Tensor, d: int) -> Tensor:
    """Product along ``d`` (removed): a tree of multiplies for static sizes."""
    n = x.shape[d]
    keep = [s for k, s in enumerate(x.shape) if k != d]
    if not isinstance(n, int):
        return _prod_explog(x, d)
    if n == 0:
        return const(x.graph, 1, x.dtype, keep)
    rest: list[Tensor] = []
    while n > 1:
        if n % 2:
            rest.append(x.slice(d, n - 1, 1))
            n -= 1
        h = n // 2
        x = x.slice(d, 0, h).mul(x.slice(d, h, h))
        n = h
    for r in rest:
        x = x.mul(r)
    return x.reshape(keep)


def _prod_explog(x: Tensor, d: int) -> Tensor:
    """|prod| = exp2(sum log2|x|) (a zero gives -inf -> 0), sign from the parity of negatives."""
    xf = x.cast(dt.f64 if not x.dtype.is_float else dt.f32 if x.dtype in _LOW else x.dtype)
    mag = abs(xf).log2().sum_reduce(d).exp2()
    negs = xf.lt(0.0).cast(xf.dtype).sum_reduce(d)
    sign = fmod(negs, 2.0).mul(-2.0).add(1.0)
    out = mag.mul(sign)
    return round(out).cast(x.dtype) if not x.dtype.is_float else out.cast(x.dtype)


def prod(
    input: Tensor, dim: int | None = None, keepdim: bool = False, *, dtype: Any = None
) -> Tensor:  # noqa: A001,A002
    x = need_tensor("prod", input)
    x = x.cast(_acc_dtype(x, dtype))
    if dim is None:
        return _prod_axis(x.reshape(-1), 0) if x.ndim else x
    d = x._axis(dim)
    out = _prod_axis(x, d)
    return out.unsqueeze(d) if keepdim else out


# ----------------------------------------------------------------------------- scans
def _scan(x: Tensor, d: int, multiply: bool) -> Tensor:
    """Hillis–Steele inclusive scan: after the step with shift k every element holds the
    combination of the 2k elements ending at it. log2(n) steps; n may be symbolic (its
    declared maximum bounds the number of steps)."""
    n = x.shape[d]
    hi = sym.upper_bound(n)
    k = 1
    while k < hi:
        shifted = x.pad_dim(d, k, 0).slice(d, 0, n)  # x[i - k], 0 where i < k
        if multiply:
            first = iota(x.graph, x.shape, sym.lt(idx_vars(x.shape)[d], k), dt.i32)
            shifted = shifted.add(first.cast(x.dtype))  # 1 where i < k
            x = x.mul(shifted)
        else:
            x = x.add(shifted)
        k *= 2
    return x


def cumsum(input: Tensor, dim: int, *, dtype: Any = None) -> Tensor:  # noqa: A002
    x = need_tensor("cumsum", input)
    x = x.cast(_acc_dtype(x, dtype))
    return _scan(x, x._axis(dim), False) if x.ndim else x


def cumprod(input: Tensor, dim: int, *, dtype: Any = None) -> Tensor:  # noqa: A002
    x = need_tensor("cumprod", input)
    x = x.cast(_acc_dtype(x, dtype))
    return _scan(x, x._axis(dim), True) if x.ndim else x


def _cum_extreme(name: str, x: Tensor, dim: int, larger: bool) -> ValuesIndices:
    """Running max (min) and the index where it was reached, by a Hillis-Steele scan of
    (value, index) pairs. An earlier segment wins only if strictly better, so ties take the
    later index; NaN counts as the extreme (it propagates, as in PyTorch)."""
    x = need_tensor(name, x)
    if x.ndim == 0:
        return ValuesIndices(x, const(x.graph, 0, dt.i64))
    d = x._axis(dim)
    n = x.shape[d]
    v = x
    i = iota(x.graph, x.shape, idx_vars(x.shape)[d], dt.i64)
    worst = -INF if larger else INF
    if not x.dtype.is_float:
        lo, hi = int_limits(x.dtype)
        worst = lo if larger else hi
    k, top = 1, sym.upper_bound(n)
    while k < top:
        sv = v.pad_dim(d, k, 0).slice(d, 0, n)
        first = iota(x.graph, x.shape, sym.lt(idx_vars(x.shape)[d], k), dt.i32).cast(dt.bool_)
        sv = where(first, const(x.graph, worst, x.dtype, x.shape), sv)
        si = i.pad_dim(d, k, 0).slice(d, 0, n)
        better = sv.lt(v) if not larger else v.lt(sv)
        if x.dtype.is_float:  # NaN: the earlier one wins only over a non-NaN
            better = lor(better, land(isnan(sv), lnot(isnan(v))))
        v, i = where(better, sv, v), where(better, si, i)
        k *= 2
    return ValuesIndices(v, i)


def cummax(input: Tensor, dim: int) -> ValuesIndices:  # noqa: A002
    return _cum_extreme("cummax", input, dim, True)


def cummin(input: Tensor, dim: int) -> ValuesIndices:  # noqa: A002
    return _cum_extreme("cummin", input, dim, False)


# ----------------------------------------------------------------------------- softmax family
def _stable_max(x: Tensor, axes: list[int]) -> Tensor:
    """The max along ``axes`` (kept), clamped to finite so rows of -inf give exp(-inf) = 0."""
    big = float(finfo(x.dtype).max)
    return clamp(x.max_reduce(axes, keepdim=True), -big, big)


def logsumexp(input: Tensor, dim: Any, keepdim: bool = False) -> Tensor:  # noqa: A002
    x = need_tensor("logsumexp", input)
    axes = _dims("logsumexp", x, dim)

    def f(t: Tensor) -> Tensor:
        m = _stable_max(t, axes)
        s = _exp(t.add(neg(m.expand(t.shape)))).sum_reduce(axes, True)
        out = _log(s).add(m)
        return (
            out if keepdim else out.reshape([sz for k, sz in enumerate(t.shape) if k not in axes])
        )

    return _in_f32(f)(x)


def _softmax_dim(name: str, x: Tensor, dim: int | None) -> int:
    if dim is None:
        raise ValueError(f"{name}: give dim explicitly (input shape {x.shape})")
    return x._axis(dim)


def softmax(input: Tensor, dim: int | None = None, dtype: Any = None) -> Tensor:  # noqa: A002
    """exp(x - max) / sum; a row of -inf gives NaN, as in PyTorch."""
    x = need_tensor("softmax", input)
    if dtype is not None:
        x = x.cast(dtype)
    d = _softmax_dim("softmax", x, dim)

    def f(t: Tensor) -> Tensor:
        e = _exp(t.add(neg(t.max_reduce(d, keepdim=True).expand(t.shape))))
        return e.mul(e.sum_reduce(d, keepdim=True).reciprocal().expand(t.shape))

    return _in_f32(f)(x)


def log_softmax(input: Tensor, dim: int | None = None, dtype: Any = None) -> Tensor:  # noqa: A002
    x = need_tensor("log_softmax", input)
    if dtype is not None:
        x = x.cast(dtype)
    d = _softmax_dim("log_softmax", x, dim)

    def f(t: Tensor) -> Tensor:
        z = t.add(neg(t.max_reduce(d, keepdim=True).expand(t.shape)))
        return z.add(neg(_log(_exp(z).sum_reduce(d, keepdim=True)).expand(t.shape)))

    return _in_f32(f)(x)


# ----------------------------------------------------------------------------- norms
def norm(input: Tensor, p: Any = "fro", dim: Any = None, keepdim: bool = False,  # noqa: A002
         dtype: Any = None) -> Tensor:  # fmt: skip
    """Vector norms over ``dim`` (all dims by default): p = 'fro'/2, 1, inf, -inf, 0 or any
    other number."""
    x = need_tensor("norm", input)
    if dtype is not None:
        x = x.cast(dtype)
    if not x.dtype.is_float:
        x = x._floating()
    axes = _dims("norm", x, dim)
    if p in ("fro", 2, 2.0):
        return sqrt(x.mul(x).sum_reduce(axes, keepdim))
    if p == "nuc" or isinstance(p, str):
        raise ValueError(f"norm: p={p!r} is not supported (matrix norms need an SVD)")
    a = abs(x)
    if p == 1:
        return a.sum_reduce(axes, keepdim)
    if p == INF:
        return a.max_reduce(axes, keepdim)
    if p == -INF:
        return amin(a, axes, keepdim)
    if p == 0:
        return ne(x, 0.0).cast(x.dtype).sum_reduce(axes, keepdim)
    return pow(pow(a, float(p)).sum_reduce(axes, keepdim), 1.0 / float(p))


def vector_norm(x: Tensor, ord: Any = 2, dim: Any = None, keepdim: bool = False,  # noqa: A002
                *, dtype: Any = None) -> Tensor:  # fmt: skip
    return norm(x, ord, dim, keepdim, dtype)
