"""ATen FX graph -> luminal graph: one converter per core ATen overload.

The table is keyed by OpOverload objects (``torch.ops.aten.add.Tensor``), never by printed
names. A converter gets the node's arguments with FX nodes replaced by luminal values (Tensor,
or a sint for symbolic ints) and returns a luminal value; the result is cast to the dtype that
torch's fake tensor reports, and its shape is checked against it. A converter raises
``Unsupported`` for argument combinations it does not handle; the node then runs in eager.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .. import functional as F
from ..graph import dtypes as dt
from ..graph import symbolic as sym
from ..tensor import Graph, Tensor
from .symbols import Dims, Unsupported

aten = torch.ops.aten
prims = torch.ops.prims

Converter = Callable[..., Any]
# max pooling's indices (convert_extra.py sets it: it registers the rarer converters)
MAX_POOL_INDICES: Callable[..., Any] | None = None
TABLE: dict[Any, Converter] = {}
# converters of other libraries' custom ops, by the op's name ("namespace.op.overload"): the
# library registers its op when it is imported, which may be after luminal
NAMED: dict[str, Converter] = {}
# converters of nodes that read or make complex values (held as real pairs: convert_complex.py)
COMPLEX: dict[Any, Converter] = {}
# the real dtype of each complex dtype's parts
PARTS = {torch.complex64: dt.f32, torch.complex128: dt.f64, torch.complex32: dt.f16}


def _registrar(table: dict[Any, Converter], targets: tuple[Any, ...]
               ) -> Callable[[Converter], Converter]:  # fmt: skip
    def register(fn: Converter) -> Converter:
        for t in targets:
            table[t] = fn
        return fn

    return register


def op(*targets: Any) -> Callable[[Converter], Converter]:
    return _registrar(TABLE, targets)


def named_op(*names: str) -> Callable[[Converter], Converter]:
    return _registrar(NAMED, names)


def complex_op(*targets: Any) -> Callable[[Converter], Converter]:
    return _registrar(COMPLEX, targets)


def _is_complex(v: Any) -> bool:
    if isinstance(v, (tuple, list)):
        return any(map(_is_complex, v))
    return isinstance(v, torch.Tensor) and v.is_complex()


def touches_complex(node: Any) -> bool:
    """Whether FX ``node`` reads or makes a complex tensor."""
    return node is not None and (
        _is_complex(node.meta.get("val"))
        or any(_is_complex(a.meta.get("val")) for a in node.all_input_nodes)
    )


class Ctx:
    """What a converter may read besides its arguments: the graph, dims, the node's fake value."""

    def __init__(self, graph: Graph, dims: Dims) -> None:
        self.g = graph
        self.dims = dims
        self.val: Any = None  # node.meta["val"] of the node being converted
        self.node: Any = None  # that FX node (a converter may look at its users)
        self.values: dict[Any, Any] = {}  # FX node -> its converted value, so far
        # id of the tensor a written graph input is read as -> that 1-D input (see partition)
        self.flat_inputs: dict[int, Tensor] = {}
        # id of a SCATTER node into such an input -> (that input's node, the layout read back)
        self.flat_writes: dict[int, tuple[Any, Any]] = {}

    def shape(self, k: int | None = None) -> tuple[Any, ...]:
        v = self.val if k is None else self.val[k]
        return self.dims.shape(v)

    @property
    def dtype(self) -> dt.DType:
        return dt.to_dtype(self.val.dtype)


def supported_targets() -> list[str]:
    """Names of the converted overloads (for docs and debugging)."""
    return sorted(str(t) for t in TABLE)


def _ld(d: Any) -> dt.DType | None:
    return None if d is None else dt.to_dtype(d)


def _need(x: Any, what: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise Unsupported(f"{what} must be a tensor, got {type(x).__name__}")
    return x


# ----------------------------------------------------------------------------- elementwise
def _binary(fn: Callable[..., Tensor]) -> Converter:
    def conv(cx: Ctx, a: Any, b: Any, **kw: Any) -> Tensor:
        if not isinstance(a, Tensor) and not isinstance(b, Tensor):
            # two sizes (a SymInt divided by a window, kept as an ATen call): a 0-d size first
            if not isinstance(a, (int, sym.Expr)) or isinstance(a, bool):
                raise Unsupported(f"an operand must be a tensor, got {type(a).__name__}")
            a = F.full(cx.g, (), a, dtype=dt.i64)
        if not isinstance(a, Tensor):  # aten.pow.Scalar, rsub: a scalar first argument
            a = _need(b, "an operand")._lift(a)  # a 0-d constant, PyTorch's scalar promotion
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
    return lambda cx, x: fn(_need(x, "input"))


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


# ----------------------------------------------------------------------------- dtype / copies
@op(aten._to_copy.default)
def _to_copy(cx: Ctx, x: Tensor, **kw: Any) -> Tensor:
    dev = kw.get("device")
    if dev is not None and torch.device(dev).type != "cpu":
        raise Unsupported(f"copy to device {dev}")
    return x.cast(cx.dtype)


@op(prims.convert_element_type.default)
def _convert(cx: Ctx, x: Tensor, dtype: Any) -> Tensor:
    return x.cast(dt.to_dtype(dtype))


@op(aten.clone.default, aten.alias.default, aten.lift_fresh_copy.default, aten.detach.default,
    aten.contiguous.default)  # fmt: skip
def _identity(cx: Ctx, x: Tensor, *args: Any, **kw: Any) -> Tensor:
    return x


@op(aten.dropout.default)
def _dropout(cx: Ctx, x: Tensor, p: float, train: bool) -> Tensor:
    if train and p > 0:
        raise Unsupported("dropout in training mode")
    return x


@op(aten.copy.default)
def _copy(cx: Ctx, dst: Tensor, src: Any, non_blocking: bool = False) -> Tensor:
    return (
        src.cast(dst.dtype).expand(dst.shape) if isinstance(src, Tensor) else F.full_like(dst, src)
    )


# ----------------------------------------------------------------------------- reductions
def _dims_arg(dim: Any) -> Any:
    return None if dim is None or (isinstance(dim, (list, tuple)) and not dim) else dim


@op(aten.sum.dim_IntList, aten.sum.default)
def _sum(cx: Ctx, x: Tensor, dim: Any = None, keepdim: bool = False, *, dtype: Any = None
         ) -> Tensor:  # fmt: skip
    if x.ndim == 0:
        return x if dtype is None else x.cast(_ld(dtype))
    return F.sum(x, _dims_arg(dim), keepdim, dtype=_ld(dtype))


@op(aten.mean.dim, aten.mean.default)
def _mean(cx: Ctx, x: Tensor, dim: Any = None, keepdim: bool = False, *, dtype: Any = None
          ) -> Tensor:  # fmt: skip
    return F.mean(x, _dims_arg(dim), keepdim, dtype=_ld(dtype))


@op(aten.prod.dim_int, aten.prod.default)
def _prod(cx: Ctx, x: Tensor, dim: Any = None, keepdim: bool = False, *, dtype: Any = None
          ) -> Tensor:  # fmt: skip
    return F.prod(x, dim, keepdim, dtype=_ld(dtype))


@op(aten.var.correction, aten.var.dim)
def _var(cx: Ctx, x: Tensor, dim: Any = None, *args: Any, correction: Any = None,
         keepdim: bool = False) -> Tensor:  # fmt: skip
    if args:  # var.dim(self, dim, unbiased, keepdim)
        return F.var(x, _dims_arg(dim), args[0], *args[1:])
    return F.var(x, _dims_arg(dim), keepdim=keepdim, correction=correction)


@op(aten.var_mean.correction)
def _var_mean(cx: Ctx, x: Tensor, dim: Any = None, *, correction: Any = None,
              keepdim: bool = False) -> tuple:  # fmt: skip
    return tuple(F.var_mean(x, _dims_arg(dim), keepdim=keepdim, correction=correction))


@op(aten.std_mean.correction)
def _std_mean(cx: Ctx, x: Tensor, dim: Any = None, *, correction: Any = None,
              keepdim: bool = False) -> tuple:  # fmt: skip
    return tuple(F.std_mean(x, _dims_arg(dim), keepdim=keepdim, correction=correction))


@op(aten.std.correction)
def _std(cx: Ctx, x: Tensor, dim: Any = None, *, correction: Any = None, keepdim: bool = False
         ) -> Tensor:  # fmt: skip
    return F.std(x, _dims_arg(dim), keepdim=keepdim, correction=correction)


@op(aten.diagonal.default, aten.diagonal_copy.default)
def _diagonal(cx: Ctx, x: Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
    return F.diagonal(x, offset, dim1, dim2)


@op(aten.ldexp.Tensor)
def _ldexp(cx: Ctx, x: Any, other: Any) -> Tensor:
    """x * 2**other, in x's floating dtype (exp2 of an integer exponent is exact)."""
    x = _need(x, "input")
    out = cx.dtype
    e = other.cast(out) if isinstance(other, Tensor) else x._lift(float(other)).cast(out)
    return F.mul(x.cast(out), F.exp2(e))


@op(aten.linalg_vector_norm.default)
def _vector_norm(cx: Ctx, x: Tensor, ord: Any = 2, dim: Any = None, keepdim: bool = False,  # noqa: A002
                 *, dtype: Any = None) -> Tensor:  # fmt: skip
    return F.vector_norm(x, ord, _dims_arg(dim), keepdim, dtype=_ld(dtype))


@op(aten.dist.default)
def _dist(cx: Ctx, a: Tensor, b: Tensor, p: Any = 2) -> Tensor:
    return F.norm(F.sub(a, b), p)


@op(aten.amax.default)
def _amax(cx: Ctx, x: Tensor, dim: Any = (), keepdim: bool = False) -> Tensor:
    return x if x.ndim == 0 else F.amax(x, dim, keepdim)  # a 0-d input's dim 0 is itself


@op(aten.amin.default)
def _amin(cx: Ctx, x: Tensor, dim: Any = (), keepdim: bool = False) -> Tensor:
    return x if x.ndim == 0 else F.amin(x, dim, keepdim)


@op(aten.max.dim)
def _max_dim(cx: Ctx, x: Tensor, dim: int, keepdim: bool = False) -> tuple[Tensor, Tensor]:
    return F.amax(x, dim, keepdim), F.argmax(x, dim, keepdim)


@op(aten.min.dim)
def _min_dim(cx: Ctx, x: Tensor, dim: int, keepdim: bool = False) -> tuple[Tensor, Tensor]:
    return F.amin(x, dim, keepdim), F.argmin(x, dim, keepdim)


@op(aten.max.default)
def _max_all(cx: Ctx, x: Tensor) -> Tensor:
    return F.amax(x)


@op(aten.min.default)
def _min_all(cx: Ctx, x: Tensor) -> Tensor:
    return F.amin(x)


@op(aten.argmax.default)
def _argmax(cx: Ctx, x: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    return F.argmax(x, dim, keepdim)


@op(aten.argmin.default)
def _argmin(cx: Ctx, x: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    return F.argmin(x, dim, keepdim)


@op(aten.any.default, aten.any.dim, aten.any.dims)
def _any(cx: Ctx, x: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
    return F.any(x, _dims_arg(dim), keepdim)


@op(aten.all.default, aten.all.dim, aten.all.dims)
def _all(cx: Ctx, x: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
    return F.all(x, _dims_arg(dim), keepdim)


@op(aten.cumsum.default)
def _cumsum(cx: Ctx, x: Tensor, dim: int, *, dtype: Any = None) -> Tensor:
    return F.cumsum(x, dim, dtype=_ld(dtype))


@op(aten.cumprod.default)
def _cumprod(cx: Ctx, x: Tensor, dim: int, *, dtype: Any = None) -> Tensor:
    return F.cumprod(x, dim, dtype=_ld(dtype))


@op(aten.cummax.default)
def _cummax(cx: Ctx, x: Tensor, dim: int) -> tuple:
    return tuple(F.cummax(x, dim))


@op(aten.cummin.default)
def _cummin(cx: Ctx, x: Tensor, dim: int) -> tuple:
    return tuple(F.cummin(x, dim))


@op(aten._softmax.default, aten.softmax.int)
def _softmax(cx: Ctx, x: Tensor, dim: int, half_to_float: Any = False) -> Tensor:
    return F.softmax(x, dim)


@op(aten._log_softmax.default, aten.log_softmax.int)
def _log_softmax(cx: Ctx, x: Tensor, dim: int, half_to_float: Any = False) -> Tensor:
    return F.log_softmax(x, dim)


@op(aten.logsumexp.default)
def _logsumexp(cx: Ctx, x: Tensor, dim: Any, keepdim: bool = False) -> Tensor:
    return F.logsumexp(x, dim, keepdim)


# ----------------------------------------------------------------------------- matmul
@op(aten.mm.default, aten.bmm.default, aten.matmul.default)
def _mm(cx: Ctx, a: Tensor, b: Tensor) -> Tensor:
    return F.matmul(a, b)


@op(aten.addmm.default)
def _addmm(cx: Ctx, bias: Tensor, a: Tensor, b: Tensor, *, beta: Any = 1, alpha: Any = 1) -> Tensor:
    return F.addmm(bias, a, b, beta=beta, alpha=alpha)


@op(aten.baddbmm.default)
def _baddbmm(cx: Ctx, bias: Tensor, a: Tensor, b: Tensor, *, beta: Any = 1, alpha: Any = 1
             ) -> Tensor:  # fmt: skip
    return F.baddbmm(bias, a, b, beta=beta, alpha=alpha)


@op(aten.addmv.default)
def _addmv(cx: Ctx, bias: Tensor, a: Tensor, v: Tensor, *, beta: Any = 1, alpha: Any = 1) -> Tensor:
    return F.addmv(bias, a, v, beta=beta, alpha=alpha)


@op(aten.addbmm.default)
def _addbmm(cx: Ctx, bias: Tensor, a: Tensor, b: Tensor, *, beta: Any = 1, alpha: Any = 1
            ) -> Tensor:  # fmt: skip
    return F.addbmm(bias, a, b, beta=beta, alpha=alpha)


@op(aten.addr.default)
def _addr(cx: Ctx, bias: Tensor, a: Tensor, b: Tensor, *, beta: Any = 1, alpha: Any = 1) -> Tensor:
    return F.addr(bias, a, b, beta=beta, alpha=alpha)


@op(aten._cdist_forward.default)
def _cdist(cx: Ctx, x1: Tensor, x2: Tensor, p: float, compute_mode: Any = None) -> Tensor:
    diff = F.sub(x1.unsqueeze(-2), x2.unsqueeze(-3))  # (..., P, R, M)
    return F.norm(diff, p, -1)


# ----------------------------------------------------------------------------- views
@op(aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.squeeze.default,
    aten.squeeze.dim, aten.squeeze.dims, aten.unsqueeze.default, aten.flatten.using_ints,
    aten.unflatten.int, aten.view_as.default)  # fmt: skip
def _reshape(cx: Ctx, x: Tensor, *args: Any, **kw: Any) -> Tensor:
    # the fake value holds the resolved shape (no -1, symbolic sizes simplified by torch)
    shape = cx.shape()
    try:
        return x.reshape(shape)
    except ValueError:
        quotients = [e for e in shape if isinstance(e, sym.Expr) and e.kind == sym.DIV]
        if not quotients:
            raise
    # a view to (b, a // b, ...) of a tensor of a elements per row (a batch split off rows
    # that hold batch x heads): as many elements only where b divides a, which eager's view
    # requires and each call checks (Dims.divides); the elements are then the same, in order
    n: sym.sint = 1
    for e in shape:
        n = sym.mul(n, e)
    # the same count wherever each dividend is a multiple of its divisor: write it so
    exact: dict[str, sym.sint] = {}
    for k, q in enumerate(quotients):
        a, b = q.args[0], q.args[1]
        if not (a.kind == sym.VAR and a.name not in exact):
            raise ValueError(f"reshape: cannot view {tuple(x.shape)} as {tuple(shape)}")
        exact[a.name] = sym.mul(b, sym.dim(f"_exact{k}", 1, max(sym.upper_bound(a), 1)))
    if sym.add(sym.substitute(n, exact), sym.mul(sym.substitute(x.numel(), exact), -1)) != 0:
        raise ValueError(f"reshape: cannot view {tuple(x.shape)} as {tuple(shape)}")
    what = f"view to {tuple(shape)}"
    cx.dims.divides += [(q.args[0], q.args[1], what) for q in quotients]
    return x.reshape(-1).slice(0, 0, n).reshape(shape)


@op(aten.expand.default, aten.expand_as.default)
def _expand(cx: Ctx, x: Tensor, *args: Any, **kw: Any) -> Tensor:
    return x.expand(cx.shape())


@op(aten.permute.default)
def _permute(cx: Ctx, x: Tensor, dims: Sequence[int]) -> Tensor:
    return x.permute(list(dims))


@op(aten.transpose.int)
def _transpose(cx: Ctx, x: Tensor, a: int, b: int) -> Tensor:
    return F.transpose(x, a, b)


@op(aten.t.default)
def _t(cx: Ctx, x: Tensor) -> Tensor:
    return F.t(x)


@op(aten.slice.Tensor)
def _slice(cx: Ctx, x: Tensor, dim: int = 0, start: Any = None, end: Any = None, step: int = 1
           ) -> Tensor:  # fmt: skip
    d = x._axis(dim)
    n = x.shape[d]
    length = cx.shape()[d]  # torch's, end and clamping applied
    if start is None:
        start = 0
    elif cx.dims.negative(start, "slice"):
        start = sym.maximum(sym.add(n, start), 0)
    elif not sym.prove_lt(start, sym.add(n, 1)):
        start = sym.minimum(start, n)
    return x.slice(d, start, length, step)


@op(aten.select.int)
def _select(cx: Ctx, x: Tensor, dim: int, index: Any) -> Tensor:
    if isinstance(index, sym.Expr):
        index = cx.dims.position(index, x.shape[x._axis(dim)], "select")
    return F.select(x, dim, index)


@op(aten.narrow.default)
def _narrow(cx: Ctx, x: Tensor, dim: int, start: Any, length: Any) -> Tensor:
    if isinstance(start, sym.Expr):
        start = cx.dims.position(start, x.shape[x._axis(dim)], "narrow")
    return F.narrow(x, dim, start, length)


@op(aten.cat.default)
def _cat(cx: Ctx, tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    # torch ignores legacy empty 1-D tensors in cat
    ts = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)] or list(tensors)
    return F.cat(ts, dim)


@op(aten.stack.default)
def _stack(cx: Ctx, tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    return F.stack(list(tensors), dim)


def _split_at(x: Tensor, sizes: Sequence[Any], dim: int) -> tuple[Tensor, ...]:
    d = x._axis(dim)
    out: list[Tensor] = []
    off: Any = 0
    for s in sizes:
        out.append(x.slice(d, off, s))
        off = sym.add(off, s)
    return tuple(out)


@op(aten.split_with_sizes.default)
def _split_with_sizes(cx: Ctx, x: Tensor, sizes: Sequence[Any], dim: int = 0) -> tuple:
    return _split_at(x, sizes, dim)


@op(aten.split.Tensor)
def _split(cx: Ctx, x: Tensor, size: Any, dim: int = 0) -> tuple:
    d = x._axis(dim)
    return _split_at(x, [cx.dims.shape(v)[d] for v in cx.val], d)


@op(aten.unbind.int)
def _unbind(cx: Ctx, x: Tensor, dim: int = 0) -> tuple:
    return F.unbind(x, dim)


@op(aten.constant_pad_nd.default)
def _pad(cx: Ctx, x: Tensor, pad: Sequence[Any], value: Any = 0) -> Tensor:
    return F.pad(x, list(pad), "constant", value)


@op(aten.flip.default)
def _flip(cx: Ctx, x: Tensor, dims: Sequence[int]) -> Tensor:
    return F.flip(x, list(dims))


@op(aten.roll.default)
def _roll(cx: Ctx, x: Tensor, shifts: Any, dims: Any = ()) -> Tensor:
    return F.roll(x, shifts, dims if dims else None)


@op(aten.repeat.default)
def _repeat(cx: Ctx, x: Tensor, repeats: Sequence[Any]) -> Tensor:
    return F.repeat(x, *repeats)


@op(aten.tril.default)
def _tril(cx: Ctx, x: Tensor, diagonal: int = 0) -> Tensor:
    return F.tril(x, diagonal)


@op(aten.triu.default)
def _triu(cx: Ctx, x: Tensor, diagonal: int = 0) -> Tensor:
    return F.triu(x, diagonal)


# ----------------------------------------------------------------------------- indexing
@op(aten.index.Tensor, aten._unsafe_index.Tensor)
def _index(cx: Ctx, x: Tensor, indices: Sequence[Any]) -> Tensor:
    key = tuple(slice(None) if i is None else _need(i, "index") for i in indices)
    if any(isinstance(k, Tensor) and k.dtype is dt.bool_ for k in key):
        raise Unsupported("indexing with a bool mask (data-dependent shape)")
    return F.getitem(x, key)


@op(aten.index_select.default)
def _index_select(cx: Ctx, x: Tensor, dim: int, index: Tensor) -> Tensor:
    if x.ndim == 0:  # torch treats a 0-d input as 1-d here
        return F.index_select(x.reshape((1,)), 0, index.reshape((-1,))).reshape(cx.shape())
    return F.index_select(x, dim, index)


@op(aten.gather.default)
def _gather(cx: Ctx, x: Tensor, dim: int, index: Tensor, *, sparse_grad: bool = False) -> Tensor:
    return F.gather(x, dim, index)


@op(aten.embedding.default)
def _embedding(cx: Ctx, weight: Tensor, indices: Tensor, padding_idx: int = -1, *args: Any
               ) -> Tensor:  # fmt: skip
    return F.embedding(indices, weight)


@op(aten.scatter.src, aten.scatter.value)
def _scatter(cx: Ctx, x: Tensor, dim: int, index: Tensor, src: Any) -> Tensor:
    if isinstance(src, Tensor):
        return F.scatter(x, dim, index, src)
    return F.scatter(x, dim, index, value=src)


@op(aten.scatter_add.default)
def _scatter_add(cx: Ctx, x: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:
    return F.scatter_add(x, dim, index, src)


@op(aten.index_put.default)
def _index_put(cx: Ctx, x: Tensor, indices: Sequence[Any], values: Any, accumulate: bool = False
               ) -> Tensor:  # fmt: skip
    given = [i for i in indices if i is not None]
    if len(given) != 1 or given[0].dtype is dt.bool_ or indices[-1] is None:
        raise Unsupported("index_put with other than one integer index (None before it)")
    flat = cx.flat_inputs.get(id(x))
    if flat is not None and given[0].ndim == 1 and not accumulate and isinstance(values, Tensor):
        out = F.index_put_flat(flat, x.shape, list(indices), values)  # can update in place
        cx.flat_writes[id(out.node)] = (flat.node, out.layout)
        return out
    return F.index_put(x, list(indices), values, accumulate)


# ----------------------------------------------------------------------------- creation
def _fill(cx: Ctx, value: Any) -> Tensor:
    return F.full(cx.g, cx.shape(), value, dtype=cx.dtype)


@op(aten.full.default, aten.new_full.default, aten.full_like.default)
def _full(cx: Ctx, *args: Any, **kw: Any) -> Tensor:
    return _fill(cx, args[-1])


@op(aten.zeros.default, aten.zeros_like.default, aten.new_zeros.default, aten.empty.memory_format,
    aten.empty_like.default, aten.new_empty.default, aten.empty_strided.default)  # fmt: skip
def _zeros(cx: Ctx, *args: Any, **kw: Any) -> Tensor:
    return _fill(cx, 0)


@op(aten.ones.default, aten.ones_like.default, aten.new_ones.default)
def _ones(cx: Ctx, *args: Any, **kw: Any) -> Tensor:
    return _fill(cx, 1)


@op(aten.scalar_tensor.default)
def _scalar_tensor(cx: Ctx, value: Any, **kw: Any) -> Tensor:
    return _fill(cx, value)


@op(aten.fill.Scalar)
def _fill_scalar(cx: Ctx, x: Tensor, value: Any) -> Tensor:
    return F.full_like(x, value)


@op(aten.arange.start_step, aten.arange.start, aten.arange.default)
def _arange(cx: Ctx, *args: Any, step: Any = 1, **kw: Any) -> Tensor:
    start, end = (0, args[0]) if len(args) == 1 else args[:2]
    step = args[2] if len(args) > 2 else step
    return F.arange(cx.g, start, end, step, dtype=cx.dtype)


# ----------------------------------------------------------------------------- nn
@op(aten.convolution.default)
def _convolution(cx: Ctx, x: Tensor, w: Tensor, b: Tensor | None, stride: Any, padding: Any,
                 dilation: Any, transposed: bool, output_padding: Any, groups: int
                 ) -> Tensor:  # fmt: skip
    nd = w.ndim - 2
    if transposed:
        fns = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}
        if nd not in fns:
            raise Unsupported(f"conv_transpose{nd}d")
        return fns[nd](x, w, b, list(stride), list(padding), list(output_padding), groups,
                       list(dilation))  # fmt: skip
    fn = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}.get(nd)
    if fn is None:
        raise Unsupported(f"conv{nd}d")
    return fn(x, w, b, list(stride), list(padding), list(dilation), groups)


@op(aten.max_pool2d_with_indices.default, aten.max_pool1d_with_indices.default)
def _max_pool(cx: Ctx, x: Tensor, kernel: Any, stride: Any = (), padding: Any = 0,
              dilation: Any = 1, ceil_mode: bool = False) -> tuple:  # fmt: skip
    nd = len(kernel)
    if cx.node is not None and any(u.args[1] == 1 for u in cx.node.users):  # the indices
        if MAX_POOL_INDICES is None:
            raise Unsupported("max pooling indices")
        return MAX_POOL_INDICES(cx, x, kernel, stride, padding, dilation, nd)
    fn = F.max_pool2d if nd == 2 else F.max_pool1d
    return fn(x, list(kernel), list(stride) or None, padding, dilation, ceil_mode), None


@op(aten.avg_pool2d.default)
def _avg_pool2d(cx: Ctx, x: Tensor, kernel: Any, stride: Any = (), padding: Any = 0,
                ceil_mode: bool = False, count_include_pad: bool = True,
                divisor_override: Any = None) -> Tensor:  # fmt: skip
    return F.avg_pool2d(x, list(kernel), list(stride) or None, padding, ceil_mode,
                        count_include_pad, divisor_override)  # fmt: skip


@op(aten._adaptive_avg_pool2d.default)
def _adaptive_avg_pool2d(cx: Ctx, x: Tensor, output_size: Sequence[int]) -> Tensor:
    return F.adaptive_avg_pool2d(x, list(output_size))


# ----------------------------------------------------------------------------- structure
@op(operator.getitem)
def _getitem(cx: Ctx, seq: Any, k: int) -> Any:
    if not isinstance(seq, (tuple, list)):
        raise Unsupported("getitem of a non-sequence")
    v = seq[k]
    if v is None:
        raise Unsupported(f"output {k} of a multi-output op (only used in training)")
    return v


def convert_call(cx: Ctx, target: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """Convert one call; the result matches the fake value's dtype and rank."""
    is_complex = touches_complex(cx.node)
    fn = (COMPLEX if is_complex else TABLE).get(target)
    if fn is None and not is_complex:
        fn = NAMED.get(str(target))
    if fn is None:
        raise Unsupported("complex values" if is_complex and target in TABLE else "no converter")
    v = cx.val
    if isinstance(v, torch.Tensor) and all(isinstance(s, int) for s in v.shape) and not v.numel() \
            and not v.is_complex():  # fmt: skip
        return F.full(cx.g, cx.shape(), 0, dtype=cx.dtype)  # an empty result computes nothing
    try:
        out = fn(cx, *args, **kwargs)
    except Unsupported:
        raise
    except Exception as e:  # a converter that cannot build this node: eager runs it correctly
        raise Unsupported(f"{type(e).__name__}: {_short(e)}") from e
    return _match(cx, out, cx.val)


def _short(e: Exception, n: int = 160) -> str:
    s = str(e).splitlines()[0] if str(e) else ""
    return s if len(s) <= n else s[: n - 3] + "..."


def _match(cx: Ctx, out: Any, val: Any) -> Any:
    if isinstance(val, (tuple, list)) and isinstance(out, (tuple, list)):
        if len(val) != len(out):
            raise Unsupported("converter returned the wrong number of outputs")
        return tuple(None if o is None else _match(cx, o, v) for o, v in zip(out, val, strict=True))
    if not isinstance(val, torch.Tensor):
        return out
    if not isinstance(out, Tensor):
        raise Unsupported(f"converter returned {type(out).__name__} for a tensor")
    want = cx.dims.shape(val)
    if val.is_complex():  # real pairs (convert_complex.py)
        want = (*want, 2)
    if len(want) != out.ndim or any(
        isinstance(a, int) and isinstance(b, int) and a != b
        for a, b in zip(want, out.shape, strict=True)
    ):
        # a mismatch is a converter bug; eager is right, so never return this value
        raise Unsupported(f"converted shape {out.shape} differs from torch's {tuple(val.shape)}")
    if val.is_complex():
        if val.dtype not in PARTS:
            raise Unsupported(f"dtype {val.dtype}")
        return out.cast(PARTS[val.dtype])
    return out.cast(dt.to_dtype(val.dtype))
