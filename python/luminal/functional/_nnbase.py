"""Helpers shared by the linear-algebra, convolution and attention ops (private).

Masks add the most negative finite value of the dtype rather than -inf: ``0 * -inf`` is NaN,
so a finite bias can be built by multiplying a 0/1 mask, and a fully masked row averages
instead of producing NaN. Windows (im2col) are views built by index substitution.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..graph import dtypes as dt
from ..graph import symbolic as sym
from ..graph.dtypes import DType
from ..graph.symbolic import sint
from ..graph.view import idx_vars
from ..tensor import Tensor
from ._base import finfo, remap

# dtypes whose statistics (norms, softmax) are computed in f32, as PyTorch's kernels do
_LOW = (dt.f16, dt.bf16, dt.f8e4m3, dt.f8e5m2, dt.e8m0, dt.fp4e2m1)


def fmax(d: DType) -> float:
    """The largest finite value of float dtype ``d``: what "masked out" subtracts."""
    return float(finfo(d if d.is_float else dt.f32).max)


def acc(x: Tensor) -> Tensor:
    """The tensor in a dtype fit for statistics: low-precision floats and ints go to f32."""
    return x.cast(dt.f32) if (x.dtype in _LOW or not x.dtype.is_float) else x


def bool_to_bias(mask: Tensor, d: DType) -> Tensor:
    """True (attend) -> 0, False -> half the most negative finite value of ``d``: softmax
    scales scores by log2(e) ~ 1.44 before it exponentiates, and the whole most negative value
    would overflow to -inf there (a fully masked row's max then -inf, its weights NaN)."""
    return mask.cast(d).add(-1.0).mul(fmax(d) * 0.5)


def remap_axis(
    t: Tensor, axis: int, sizes: Sequence[sint], fn: Callable[[list[sint]], tuple[sint, sint]]
) -> Tensor:
    """Replace dim ``axis`` by dims of ``sizes``; ``fn(new index vars) -> (old index, valid)``
    says which element each new position reads (valid 0 reads 0). A view: nothing is copied,
    which is how conv/pool windows (im2col) stay free."""
    axis = t._axis(axis)
    k = len(sizes)
    shape = tuple(t.shape[:axis]) + tuple(sizes) + tuple(t.shape[axis + 1 :])
    nv = idx_vars(shape)
    old_i, ok = fn(nv[axis : axis + k])
    return remap(t, shape, nv[:axis] + [old_i] + nv[axis + k :], ok)


def windows(t: Tensor, axis: int, out: sint, k: int, stride: int, dilation: int) -> Tensor:
    """View dim ``axis`` as (out, k): element [o, i] reads ``o * stride + i * dilation``."""
    return remap_axis(
        t, axis, (out, k), lambda v: (sym.add(sym.mul(v[0], stride), sym.mul(v[1], dilation)), 1)
    )


def tuple_arg(v: int | Sequence[int], n: int, name: str, what: str) -> tuple[int, ...]:
    """``v`` per spatial dim: an int or one-element sequence repeats, as in PyTorch (ATen
    passes ``padding="valid"`` as ``[0]``)."""
    out = (v,) * n if isinstance(v, int) else tuple(v)
    if len(out) == 1:
        out *= n
    if len(out) != n or not all(isinstance(e, int) for e in out):
        raise ValueError(f"{name}: {what} must be an int or {n} ints, got {v!r}")
    return out
