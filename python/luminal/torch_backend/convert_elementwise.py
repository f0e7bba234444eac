"""Converters of elementwise ops: arithmetic and comparisons (a scalar operand lifted to a 0-d
constant, as PyTorch promotes it), math and activation functions, clamps and selects, special
functions (Bessel, gamma, zeta, Chebyshev polynomials) and floating-point bits (``ldexp``,
``frexp``, ``nextafter``). Same contract as ``convert.py``: arguments arrive as luminal values,
``Unsupported`` sends a node to eager.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from .. import functional as F
from ..graph import dtypes as dt
from ..graph import symbolic as sym
from ..tensor import Tensor
from .convert import Converter, Ctx, need_tensor, op
from .symbols import Unsupported

aten = torch.ops.aten


# ----------------------------------------------------------------------------- elementwise
def _binary(fn: Callable[..., Tensor]) -> Converter:
    def conv(cx: Ctx, a: Any, b: Any, **kw: Any) -> Tensor:
        if not isinstance(a, Tensor) and not isinstance(b, Tensor):
            # two sizes (a SymInt divided by a window, kept as an ATen call): a 0-d size first
            if not isinstance(a, (int, sym.Expr)) or isinstance(a, bool):
                raise Unsupported(f"an operand must be a tensor, got {type(a).__name__}")
            a = F.full(cx.g, (), a, dtype=dt.i64)
        if not isinstance(a, Tensor):  # aten.pow.Scalar, rsub: a scalar first argument
            a = need_tensor(b, "an operand")._lift(a)  # a 0-d constant, PyTorch's scalar promotion
        return fn(a, b, **kw)

    return conv


for _targets, _fn in (
    ((aten.add.Tensor, aten.add.Scalar), F.add),
    ((aten.sub.Tensor, aten.sub.Scalar), F.sub),
    ((aten.mul.Tensor, aten.mul.Scalar), F.mul),
    ((aten.div.Tensor, aten.div.Scalar, aten.true_divide.Tensor), F.div),
    ((aten.div.Tensor_mode, aten.div.Scalar_mode), F.div),
    ((aten.floor_divide.default,), F.floor_divide),
    ((aten.remainder.Tensor, aten.remainder.Scalar), F.remainder),
    ((aten.fmod.Tensor, aten.fmod.Scalar), F.fmod),
    ((aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor, aten.pow.Scalar), F.pow),
    ((aten.maximum.default,), F.maximum),
    ((aten.minimum.default,), F.minimum),
    ((aten.eq.Tensor, aten.eq.Scalar), F.eq),
    ((aten.ne.Tensor, aten.ne.Scalar), F.ne),
    ((aten.lt.Tensor, aten.lt.Scalar), F.lt),
    ((aten.le.Tensor, aten.le.Scalar), F.le),
    ((aten.gt.Tensor, aten.gt.Scalar), F.gt),
    ((aten.ge.Tensor, aten.ge.Scalar), F.ge),
    ((aten.logical_and.default,), F.logical_and),
    ((aten.logical_or.default,), F.logical_or),
    ((aten.logical_xor.default,), F.logical_xor),
    ((aten.bitwise_and.Tensor, aten.bitwise_and.Scalar), F.bitwise_and),
    ((aten.bitwise_or.Tensor, aten.bitwise_or.Scalar), F.bitwise_or),
    ((aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar), F.bitwise_xor),
):
    op(*_targets)(_binary(_fn))


@op(aten.rsub.Scalar, aten.rsub.Tensor)
def _rsub(cx: Ctx, a: Tensor, b: Any, alpha: Any = 1) -> Tensor:
    return F.sub(b, a, alpha=alpha) if isinstance(b, Tensor) else F.add(F.mul(a, -alpha), b)


def _unary(fn: Callable[[Tensor], Tensor]) -> Converter:
    return lambda cx, x: fn(need_tensor(x, "input"))


for _tgt, _u in (
    (aten.neg.default, F.neg), (aten.abs.default, F.abs), (aten.exp.default, F.exp),
    (aten.exp2.default, F.exp2), (aten.log.default, F.log), (aten.log2.default, F.log2),
    (aten.log10.default, F.log10), (aten.log1p.default, F.log1p),
    (aten.expm1.default, F.expm1), (aten.sqrt.default, F.sqrt), (aten.rsqrt.default, F.rsqrt),
    (aten.reciprocal.default, F.reciprocal), (aten.sin.default, F.sin),
    (aten.cos.default, F.cos), (aten.tan.default, F.tan), (aten.tanh.default, F.tanh),
    (aten.sinh.default, F.sinh), (aten.cosh.default, F.cosh),
    (aten.sigmoid.default, F.sigmoid), (aten.erf.default, F.erf), (aten.relu.default, F.relu),
    (aten.silu.default, F.silu), (aten.floor.default, F.floor), (aten.ceil.default, F.ceil),
    (aten.round.default, F.round), (aten.trunc.default, F.trunc), (aten.sign.default, F.sign),
    (aten.isnan.default, F.isnan), (aten.isinf.default, F.isinf),
    (aten.logical_not.default, F.logical_not), (aten.bitwise_not.default, F.bitwise_not),
    (aten.mish.default, F.mish), (aten.hardswish.default, F.hardswish),
    (aten.hardsigmoid.default, F.hardsigmoid), (aten.acos.default, F.acos),
    (aten.asin.default, F.asin), (aten.atan.default, F.atan), (aten.acosh.default, F.acosh),
    (aten.asinh.default, F.asinh), (aten.atanh.default, F.atanh), (aten.erfc.default, F.erfc),
    (aten.lgamma.default, F.lgamma), (aten.signbit.default, F.signbit),
    (aten.frac.default, F.frac),
):  # fmt: skip
    op(_tgt)(_unary(_u))


for _tgt, _b in (
    (aten.atan2.default, F.atan2), (aten.hypot.default, F.hypot),
    (aten.copysign.Tensor, F.copysign), (aten.copysign.Scalar, F.copysign),
    (aten.fmax.default, F.fmax), (aten.fmin.default, F.fmin),
):  # fmt: skip
    op(_tgt)(_binary(_b))


@op(aten.round.decimals)
def _round_decimals(cx: Ctx, x: Tensor, *, decimals: int = 0) -> Tensor:
    return F.round(x, decimals=decimals)


@op(aten.gelu.default)
def _gelu(cx: Ctx, x: Tensor, approximate: str = "none") -> Tensor:
    return F.gelu(x, approximate=approximate)


@op(aten.hardtanh.default)
def _hardtanh(cx: Ctx, x: Tensor, min_val: float = -1.0, max_val: float = 1.0) -> Tensor:
    return F.clamp(x, min_val, max_val)


@op(aten.leaky_relu.default)
def _leaky_relu(cx: Ctx, x: Tensor, negative_slope: float = 0.01) -> Tensor:
    return F.leaky_relu(x, negative_slope)


@op(aten.elu.default)
def _elu(cx: Ctx, x: Tensor, alpha: float = 1.0, scale: float = 1.0, input_scale: float = 1.0
         ) -> Tensor:  # fmt: skip
    pos = F.mul(F.relu(x), scale)
    neg = F.mul(F.expm1(F.mul(F.clamp(x, max=0.0), input_scale)), alpha * scale)
    return F.add(pos, neg)


@op(aten.softplus.default)
def _softplus(cx: Ctx, x: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    return F.softplus(x, beta, threshold)


@op(aten.clamp.default, aten.clamp.Tensor)
def _clamp(cx: Ctx, x: Tensor, min: Any = None, max: Any = None) -> Tensor:  # noqa: A002
    return F.clamp(x, min, max)


@op(aten.clamp_min.default)
def _clamp_min(cx: Ctx, x: Tensor, v: Any) -> Tensor:
    return F.clamp(x, min=v)


@op(aten.clamp_max.default)
def _clamp_max(cx: Ctx, x: Tensor, v: Any) -> Tensor:
    return F.clamp(x, max=v)


@op(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def _where(cx: Ctx, cond: Tensor, a: Any, b: Any) -> Tensor:
    return F.where(cond, a, b)


@op(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(cx: Ctx, x: Tensor, mask: Tensor, value: Any) -> Tensor:
    return F.masked_fill(x, mask, value)


@op(aten.lerp.Scalar, aten.lerp.Tensor)
def _lerp(cx: Ctx, x: Tensor, end: Any, weight: Any) -> Tensor:
    return F.lerp(x, end, weight)


@op(aten.ldexp.Tensor)
def _ldexp(cx: Ctx, x: Any, other: Any) -> Tensor:
    """x * 2**other, in x's floating dtype (exp2 of an integer exponent is exact)."""
    x = need_tensor(x, "input")
    out = cx.dtype
    e = other.cast(out) if isinstance(other, Tensor) else x._lift(float(other)).cast(out)
    return F.mul(x.cast(out), F.exp2(e))


@op(aten.angle.default)
def _angle(cx: Ctx, x: Tensor) -> Tensor:
    xf = x.cast(cx.dtype)
    return F.where(F.isnan(xf), math.nan, F.where(F.lt(xf, 0.0), math.pi, 0.0)).cast(cx.dtype)


# ----------------------------------------------------------------------------- special functions
for _tgt, _u in (
    (aten.digamma.default, F.digamma), (aten.i0.default, F.i0),
    (aten.special_modified_bessel_i0.default, F.i0),
    (aten.special_modified_bessel_i1.default, F.i1),
    (aten.special_i0e.default, F.i0e), (aten.special_i1.default, F.i1),
    (aten.special_i1e.default, F.i1e), (aten.special_erfcx.default, F.erfcx),
    (aten.special_log_ndtr.default, F.log_ndtr), (aten.erfinv.default, F.erfinv),
    (aten.special_ndtri.default, F.ndtri),
    (aten.special_spherical_bessel_j0.default, F.spherical_bessel_j0),
    (aten.special_bessel_j0.default, F.bessel_j0), (aten.special_bessel_j1.default, F.bessel_j1),
    (aten.special_bessel_y0.default, F.bessel_y0), (aten.special_bessel_y1.default, F.bessel_y1),
    (aten.special_modified_bessel_k0.default, F.modified_bessel_k0),
    (aten.special_modified_bessel_k1.default, F.modified_bessel_k1),
    (aten.special_scaled_modified_bessel_k0.default, F.scaled_modified_bessel_k0),
    (aten.special_scaled_modified_bessel_k1.default, F.scaled_modified_bessel_k1),
    (aten.special_airy_ai.default, F.airy_ai),
):  # fmt: skip
    op(_tgt)(_unary(_u))


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


def _cheb_converter(fn: Any) -> Any:
    def conv(cx: Ctx, x: Any, n: Any) -> Tensor:
        if not isinstance(x, Tensor):
            x = need_tensor(n, "x or n")._lift(x)
        return fn(x, n)

    return conv


for _kind in ("t", "u", "v", "w"):
    for _pre in ("", "shifted_"):
        _name = f"{_pre}chebyshev_polynomial_{_kind}"
        _packet = getattr(aten, f"special_{_name}")
        op(*(getattr(_packet, ov) for ov in ("default", "x_scalar", "n_scalar")
             if hasattr(_packet, ov)))(_cheb_converter(getattr(F, _name)))  # fmt: skip


# ----------------------------------------------------------------------------- float bits
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
