"""Complex values as real pairs, and the FFTs as products with constant DFT matrices.

Luminal has no complex dtype. A complex tensor of shape ``S`` is held as a real tensor of shape
``S + (2,)``, real part first: the memory layout of ``torch.view_as_real``, so a plan's output
array is the complex tensor's memory (the partition returns ``torch.view_as_complex`` of it).
complex64 pairs are f32, complex128 f64, complex32 f16.

A node that reads or makes a complex value converts only through ``COMPLEX`` (``convert_call``
checks): an ordinary converter would take the pair axis for a data axis. The table holds the
ops torch's FFTs and complex casts lower to: ``_fft_r2c`` / ``_fft_c2c`` / ``_fft_c2r``,
``_to_copy`` to a complex dtype, ``_conj``, ``clone``, ``slice``, ``constant_pad_nd``,
``complex``, ``polar`` and ``view_as_real``. Anything else on a complex value stays in eager.

A transform along an axis of static length ``n`` is a product with cos / sin matrices of
``2*pi*(j*k mod n)/n``, the angles in float64, the matrices and products in the precision of
the complex value: float32 for complex64 (and complex32), so the products are the target's
f32 GEMMs; float64 for complex128. An f32 product is within 3e-7 (n 128) to 5e-7 (n 4096)
of the largest magnitude of the float64 transform, where pocketfft's float32 FFT is within
1-2e-7 (numpy, random normal rows).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .. import functional as F
from ..graph import dtypes as dt
from ..graph import symbolic as sym
from ..graph.view import idx_vars
from ..tensor import Tensor, broadcast_shapes
from .convert import COMPLEX, PARTS, TABLE, Ctx, complex_op
from .symbols import Unsupported

aten = torch.ops.aten

# PyTorch's fft_norm_mode: 0 none, 1 by 1/sqrt(n), 2 by 1/n
_NORM_NONE, _NORM_ROOT_N, _NORM_N = 0, 1, 2
# The longest transform done as a matrix product: its cos and sin matrices are n x n
# constants (64 MiB each in f32 at 4096); longer ones stay in eager PyTorch's FFT.
MAX_DFT = 4096


def _arg_val(cx: Ctx, k: int) -> Any:
    a = cx.node.args[k]
    return a.meta.get("val") if isinstance(a, torch.fx.Node) else a


def _is_complex_arg(cx: Ctx, k: int) -> bool:
    v = _arg_val(cx, k)
    return isinstance(v, torch.Tensor) and v.is_complex()


def _parts(x: Tensor) -> tuple[Tensor, Tensor]:
    return F.select(x, -1, 0), F.select(x, -1, 1)


def _pair(re: Tensor, im: Tensor) -> Tensor:
    return F.stack([re, im], -1)


def _static(n: Any, what: str) -> int:
    if not isinstance(n, int):
        raise Unsupported(f"{what} along a symbolic size")
    return n


def _length(n: Any) -> int:
    n = _static(n, "an FFT")
    if n > MAX_DFT:
        raise Unsupported(f"an FFT of length {n} (longer than {MAX_DFT}: the DFT matrices)")
    return n


def _axis(d: int, ndim: int) -> int:
    """Axis ``d`` of a complex value of rank ``ndim`` (its pairs have one more)."""
    if not -ndim <= d < max(ndim, 1):
        raise Unsupported(f"dim {d} out of range for rank {ndim}")
    return d % ndim if ndim else 0


# ----------------------------------------------------------------------------- DFT
def _work(val: Any) -> dt.DType:
    """The dtype a transform's products run in: float64 for a complex128 (or float64) value,
    float32 otherwise."""
    return dt.f64 if val.dtype in (torch.complex128, torch.float64) else dt.f32


def _trig(rows: int, cols: int, n: int, weights: np.ndarray | None = None
          ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """cos and sin of 2*pi*j*k/n for j < rows, k < cols (the product reduced mod n first,
    so large indices lose no precision); ``weights`` scale row j."""
    j = np.arange(rows, dtype=np.int64)[:, None]
    k = np.arange(cols, dtype=np.int64)[None, :]
    theta = 2.0 * np.pi * ((j * k) % n).astype(np.float64) / n
    c, s = np.cos(theta), np.sin(theta)
    if weights is not None:
        c, s = c * weights[:, None], s * weights[:, None]
    return c, s


def _trig_of(cx: Ctx, n: Any, cols: Any, work: dt.DType) -> tuple[Tensor, Tensor]:
    """``_trig`` for a symbolic length: cos and sin of 2*pi*((j*k) mod n)/n computed in the
    graph (n^2 of each per call, for the length called with), angles in float64."""
    shape = (n, cols)
    j, k = idx_vars(shape)
    turns = F._base.iota(cx.g, shape, sym.mod(sym.mul(j, k), n), dt.i64).cast(dt.f64)
    theta = turns * (2.0 * np.pi) / _size(cx, n)
    return F.cos(theta).cast(work), F.sin(theta).cast(work)


def _size(cx: Ctx, n: Any) -> Tensor:
    """A size as a 0-d float64 value."""
    return F._base.iota(cx.g, (), n, dt.i64).cast(dt.f64)


def _along(x: Tensor, axis: int, m: np.ndarray | Tensor, cx: Ctx) -> Tensor:
    """``x`` times the matrix ``m`` (a constant, or computed) along ``axis``, in x's dtype."""
    moved = F.movedim(x, axis, -1)
    if not isinstance(m, Tensor):
        m = cx.g.tensor(np.ascontiguousarray(m, dtype=x.dtype.np_type))
    out = moved @ m
    return F.movedim(out, -1, axis)


def _dft(cx: Ctx, re: Tensor, im: Tensor | None, axis: int, n_out: Any, inverse: bool
         ) -> tuple[Tensor, Tensor]:  # fmt: skip
    """The unnormalized DFT along ``axis`` (length n) of re + i*im, first ``n_out`` bins.
    Forward: sum x[j] e^{-2 pi i jk/n}; inverse: e^{+2 pi i jk/n}."""
    n = re.shape[axis]
    if isinstance(n, int):
        c, s = _trig(_length(n), n_out, n)
    else:
        c, s = _trig_of(cx, n, n_out, re.dtype)  # type: ignore[assignment]
    sign = 1.0 if inverse else -1.0
    rc, rs = _along(re, axis, c, cx), _along(re, axis, s, cx)
    if im is None:
        return rc, rs * sign
    ic, is_ = _along(im, axis, c, cx), _along(im, axis, s, cx)
    # (a + ib)(cos + i*sign*sin) = a cos - sign b sin + i (b cos + sign a sin)
    return rc - is_ * sign, ic + rs * sign


def _scale(re: Tensor, im: Tensor | None, normalization: int, n: Any, cx: Ctx | None = None
           ) -> tuple[Tensor, Tensor | None]:  # fmt: skip
    if normalization == _NORM_NONE:
        return re, im
    if not isinstance(n, int) and cx is not None:
        if normalization not in (_NORM_ROOT_N, _NORM_N):
            raise Unsupported(f"FFT normalization {normalization}")
        size = _size(cx, n)
        f_t = F.rsqrt(size) if normalization == _NORM_ROOT_N else F.reciprocal(size)
        return re * f_t, None if im is None else im * f_t
    if normalization == _NORM_ROOT_N:
        f = 1.0 / float(np.sqrt(n))
    elif normalization == _NORM_N:
        f = 1.0 / n
    else:
        raise Unsupported(f"FFT normalization {normalization}")
    return re * f, None if im is None else im * f


def _out(cx: Ctx, re: Tensor, im: Tensor) -> Tensor:
    parts = PARTS[cx.val.dtype]
    return _pair(re.cast(parts), im.cast(parts))


@complex_op(aten._fft_r2c.default)
def _fft_r2c(cx: Ctx, x: Tensor, dim: Sequence[int], normalization: int, onesided: bool) -> Tensor:
    """A real input's forward DFT over ``dim``; the last of them keeps n//2+1 bins when
    ``onesided``."""
    dims = [_axis(d, x.ndim) for d in dim]
    if not dims:
        raise Unsupported("an FFT over no dims")
    re = x.cast(_work(cx.val))
    last = dims[-1]
    n_last = re.shape[last]  # a symbolic length too (a DFT matrix computed per call)
    total: Any = n_last
    half = sym.add(sym.floordiv(n_last, 2), 1)
    re, im = _dft(cx, re, None, last, half if onesided else n_last, False)
    for d in dims[:-1]:
        n = re.shape[d]
        total = sym.mul(total, n)
        re, im = _dft(cx, re, im, d, n, False)
    re, im_s = _scale(re, im, normalization, total, cx)
    assert im_s is not None
    return _out(cx, re, im_s)


@complex_op(aten._fft_c2c.default)
def _fft_c2c(cx: Ctx, x: Tensor, dim: Sequence[int], normalization: int, forward: bool) -> Tensor:
    ndim = x.ndim - 1
    dims = [_axis(d, ndim) for d in dim]
    re, im = _parts(x.cast(_work(cx.val)))
    total: Any = 1
    for d in dims:
        n = re.shape[d]  # a symbolic length too
        total = sym.mul(total, n)
        re, im = _dft(cx, re, im, d, n, not forward)
    re, im_s = _scale(re, im, normalization, total, cx)
    assert im_s is not None
    return _out(cx, re, im_s)


@complex_op(aten._fft_c2r.default)
def _fft_c2r(cx: Ctx, x: Tensor, dim: Sequence[int], normalization: int,
             last_dim_size: Any) -> Tensor:  # fmt: skip
    """The inverse DFT of a Hermitian half spectrum: inverse c2c over all of ``dim`` but the
    last, then a real result of ``last_dim_size`` along the last from its n//2+1 bins (the
    imaginary parts of bin 0 and, for even n, bin n/2 ignored, as pocketfft does)."""
    ndim = x.ndim - 1
    dims = [_axis(d, ndim) for d in dim]
    if not dims:
        raise Unsupported("an FFT over no dims")
    n = _length(last_dim_size)
    re, im = _parts(x.cast(_work(cx.val)))
    total = n
    for d in dims[:-1]:
        m = _static(re.shape[d], "an FFT")
        total *= m
        re, im = _dft(cx, re, im, d, m, True)
    last = dims[-1]
    bins = _static(re.shape[last], "an inverse real FFT")
    if bins != n // 2 + 1:
        raise Unsupported(f"an inverse real FFT of {bins} bins to {n} points")
    # x[j] = sum_k w_k (a_k cos - b_k sin), w_k = 2 for bins that stand for their mirror too
    w = np.full(bins, 2.0)
    w[0] = 1.0
    if n % 2 == 0:
        w[-1] = 1.0
    c, s = _trig(bins, n, n, w)
    out = _along(re, last, c, cx) - _along(im, last, s, cx)
    out, _ = _scale(out, None, normalization, total)
    return out.cast(cx.dtype)


__all__ = ["COMPLEX"]


# ----------------------------------------------------------------------------- casts, views
@complex_op(aten._to_copy.default)
def _to_copy(cx: Ctx, x: Tensor, *, dtype: Any = None, layout: Any = None, device: Any = None,
             pin_memory: Any = None, non_blocking: bool = False, memory_format: Any = None
             ) -> Tensor:  # fmt: skip
    if layout not in (None, torch.strided) or (device is not None and device.type != "cpu"):
        raise Unsupported("a copy to another layout or device")
    out = cx.val
    if not out.is_complex():
        raise Unsupported("a complex value cast to a real dtype (drops the imaginary part)")
    parts = PARTS.get(out.dtype)
    if parts is None:
        raise Unsupported(f"dtype {out.dtype}")
    if _is_complex_arg(cx, 0):
        return x.cast(parts)
    re = x.cast(parts)
    return _pair(re, F.zeros_like(re))


@complex_op(aten._conj.default, aten._conj_physical.default, aten.conj_physical.default)
def _conj(cx: Ctx, x: Tensor) -> Tensor:
    """The conjugate's values (a lazy conj view in torch: the partition returns them
    resolved)."""
    re, im = _parts(x)
    return _pair(re, -im)


@complex_op(aten.clone.default, aten.resolve_conj.default, aten.view_as_real.default)
def _same(cx: Ctx, x: Tensor, *, memory_format: Any = None) -> Tensor:
    return x


@complex_op(aten.view.default, aten._unsafe_view.default, aten.reshape.default,
            aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.unsqueeze.default,
            aten.flatten.using_ints, aten.unflatten.int)  # fmt: skip
def _reshape(cx: Ctx, x: Tensor, *args: Any, **kw: Any) -> Tensor:
    return x.reshape((*cx.shape(), 2))  # the fake value's resolved shape, pairs last


@complex_op(aten.expand.default)
def _expand(cx: Ctx, x: Tensor, *args: Any, **kw: Any) -> Tensor:
    return x.expand((*cx.shape(), 2))


@complex_op(aten.transpose.int)
def _transpose(cx: Ctx, x: Tensor, a: int, b: int) -> Tensor:
    ndim = x.ndim - 1
    return x.transpose(_axis(a, ndim), _axis(b, ndim))


@complex_op(aten.permute.default)
def _permute(cx: Ctx, x: Tensor, dims: Sequence[int]) -> Tensor:
    ndim = x.ndim - 1
    return x.permute([*(_axis(d, ndim) for d in dims), ndim])


@complex_op(aten.slice.Tensor)
def _slice(cx: Ctx, x: Tensor, dim: int = 0, start: Any = None, end: Any = None, step: int = 1
           ) -> Tensor:  # fmt: skip
    return TABLE[aten.slice.Tensor](cx, x, _axis(dim, x.ndim - 1), start, end, step)


@complex_op(aten.constant_pad_nd.default)
def _pad(cx: Ctx, x: Tensor, pad: Sequence[Any], value: Any = 0) -> Tensor:
    if value != 0:
        raise Unsupported("complex padding with a value other than 0")
    return F.pad(x, [0, 0, *pad], "constant", 0.0)


@complex_op(aten.complex.default)
def _complex(cx: Ctx, real: Tensor, imag: Tensor) -> Tensor:
    shape = broadcast_shapes(real.shape, imag.shape)
    parts = PARTS[cx.val.dtype]
    return _pair(real.cast(parts).expand(shape), imag.cast(parts).expand(shape))


@complex_op(aten.polar.default)
def _polar(cx: Ctx, abs: Tensor, angle: Tensor) -> Tensor:  # noqa: A002 - torch's name
    shape = broadcast_shapes(abs.shape, angle.shape)
    parts = PARTS[cx.val.dtype]
    r, a = abs.cast(parts).expand(shape), angle.cast(parts).expand(shape)
    return _pair(r * F.cos(a), r * F.sin(a))
