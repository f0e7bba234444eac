"""Normalizations, vector norms and dropout, named as in ``torch.nn.functional``.

Statistics are computed in f32 for low-precision inputs (as PyTorch's kernels do) and the
result is returned in the input's dtype. Convolutions and pooling are in ``conv.py``,
attention and rotary embeddings in ``attention.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..graph import dtypes as dt
from ..graph.symbolic import sint
from ..tensor import Tensor, broadcast_shapes
from ._base import prod, same, shape_str
from ._nnbase import acc
from .elementwise import div, maximum, sub
from .reduce import mean, norm
from .transcendental import rsqrt

__all__ = [
    "batch_norm",
    "cosine_similarity",
    "dropout",
    "group_norm",
    "instance_norm",
    "layer_norm",
    "normalize",
    "rms_norm",
]

_EPS = {
    dt.f64: 2.220446049250313e-16,
    dt.f32: 1.1920928955078125e-07,
    dt.f16: 0.0009765625,
    dt.bf16: 0.0078125,
}


def _check_float(name: str, x: Tensor) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: expected a Tensor, got {type(x).__name__}")
    if not x.dtype.is_float:
        raise TypeError(
            f"{name}: expected a floating-point input, got {x.dtype.name}{shape_str(x.shape)}"
        )


def _normalized(name: str, x: Tensor, normalized_shape: int | Sequence[sint]) -> list[int]:
    ns = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    n = len(ns)
    if (
        n == 0
        or n > x.ndim
        or not all(same(a, b) for a, b in zip(x.shape[x.ndim - n :], ns, strict=True))
    ):
        raise ValueError(
            f"{name}: normalized_shape {shape_str(ns)} does not match the last dims of "
            f"input shape {shape_str(x.shape)}"
        )
    return list(range(-n, 0))


def _affine(
    name: str, y: Tensor, weight: Tensor | None, bias: Tensor | None, shape: Sequence[sint]
) -> Tensor:
    """y * weight + bias, with weight/bias reshaped to ``shape`` for broadcasting."""
    for what, p in (("weight", weight), ("bias", bias)):
        if p is not None and not same(p.numel(), prod(shape)):
            raise ValueError(
                f"{name}: {what} shape {shape_str(p.shape)} does not match {shape_str(shape)}"
            )
    if weight is not None:
        y = y.mul(weight.reshape(shape))
    if bias is not None:
        y = y.add(bias.reshape(shape))
    return y


def _standardize(x: Tensor, dims: Sequence[int], eps: float) -> Tensor:
    """(x - mean) / sqrt(var + eps) over ``dims``, with the variance taken in a second pass
    over the centered values (no cancellation when the mean is large)."""
    xc = sub(x, mean(x, dims, keepdim=True))
    return xc.mul(rsqrt(mean(xc.mul(xc), dims, keepdim=True).add(eps)))


def layer_norm(
    input: Tensor,  # noqa: A002 - PyTorch's argument name
    normalized_shape: int | Sequence[sint],
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
) -> Tensor:
    _check_float("layer_norm", input)
    dims = _normalized("layer_norm", input, normalized_shape)
    y = _standardize(acc(input), dims, eps)
    shape = input.shape[input.ndim - len(dims) :]
    return _affine("layer_norm", y, weight, bias, shape).cast(input.dtype)


def rms_norm(
    input: Tensor,  # noqa: A002
    normalized_shape: int | Sequence[sint],
    weight: Tensor | None = None,
    eps: float | None = None,
) -> Tensor:
    """x / sqrt(mean(x^2) + eps) * weight; ``eps`` defaults to the dtype's machine epsilon."""
    _check_float("rms_norm", input)
    dims = _normalized("rms_norm", input, normalized_shape)
    eps = _EPS.get(input.dtype, _EPS[dt.f32]) if eps is None else eps
    x = acc(input)
    y = x.mul(rsqrt(mean(x.mul(x), dims, keepdim=True).add(eps)))
    return _affine("rms_norm", y, weight, None, input.shape[input.ndim - len(dims) :]).cast(
        input.dtype
    )


def _channels(name: str, x: Tensor, min_ndim: int = 2) -> sint:
    _check_float(name, x)
    if x.ndim < min_ndim:
        raise ValueError(
            f"{name}: expected an input (N, C, ...) of rank >= {min_ndim}, got {shape_str(x.shape)}"
        )
    return x.shape[1]


def _chan_shape(x: Tensor) -> tuple[sint, ...]:
    return (x.shape[1],) + (1,) * (x.ndim - 2)


def group_norm(
    input: Tensor,  # noqa: A002
    num_groups: int,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
) -> Tensor:
    c = _channels("group_norm", input)
    if not isinstance(c, int) or num_groups <= 0 or c % num_groups:
        raise ValueError(
            f"group_norm: {c} channels (input {shape_str(input.shape)}) are not divisible "
            f"into {num_groups} groups"
        )
    x = acc(input)
    g = x.reshape([x.shape[0], num_groups, prod([c // num_groups, *x.shape[2:]])])
    y = _standardize(g, [-1], eps).reshape(x.shape)
    return _affine("group_norm", y, weight, bias, _chan_shape(x)).cast(input.dtype)


def _channel_norm(
    name: str,
    input: Tensor,  # noqa: A002
    dims: Sequence[int],
    running: tuple[Tensor | None, Tensor | None] | None,
    weight: Tensor | None,
    bias: Tensor | None,
    eps: float,
) -> Tensor:
    """Batch / instance norm: the input's own statistics over ``dims``, or the ``running``
    (mean, var) per channel; then the per-channel affine."""
    x = acc(input)
    if running is None:
        y = _standardize(x, dims, eps)
    else:
        mu, var = _running(name, x, *running)
        y = sub(x, mu).mul(rsqrt(var.add(eps)))
    return _affine(name, y, weight, bias, _chan_shape(x)).cast(input.dtype)


def _running(name: str, x: Tensor, rm: Tensor | None, rv: Tensor | None) -> tuple[Tensor, Tensor]:
    if rm is None or rv is None:
        raise ValueError(
            f"{name}: running_mean and running_var are needed when batch statistics are off"
        )
    c = x.shape[1]
    for what, t in (("running_mean", rm), ("running_var", rv)):
        if not same(t.numel(), c):
            raise ValueError(
                f"{name}: {what} shape {shape_str(t.shape)} does not match {c} channels "
                f"of input {shape_str(x.shape)}"
            )
    return acc(rm).reshape(_chan_shape(x)), acc(rv).reshape(_chan_shape(x))


def batch_norm(
    input: Tensor,  # noqa: A002
    running_mean: Tensor | None,
    running_var: Tensor | None,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> Tensor:
    """Inference batch norm over dim 1 with running stats; ``training=True`` normalizes with
    the batch's own (biased) statistics and updates nothing."""
    _channels("batch_norm", input)
    dims = [0, *range(2, input.ndim)]
    stats = None if training else (running_mean, running_var)
    return _channel_norm("batch_norm", input, dims, stats, weight, bias, eps)


def instance_norm(
    input: Tensor,  # noqa: A002
    running_mean: Tensor | None = None,
    running_var: Tensor | None = None,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    use_input_stats: bool = True,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> Tensor:
    """Normalize each (sample, channel) over its spatial dims (or with running stats)."""
    _channels("instance_norm", input, 3)
    stats = None if use_input_stats else (running_mean, running_var)
    return _channel_norm(
        "instance_norm", input, list(range(2, input.ndim)), stats, weight, bias, eps
    )


def normalize(
    input: Tensor,  # noqa: A002
    p: float = 2.0,
    dim: int = 1,
    eps: float = 1e-12,
) -> Tensor:
    """x / max(||x||_p, eps) along ``dim``."""
    _check_float("normalize", input)
    x = acc(input)
    return div(x, maximum(norm(x, p, dim, True), eps)).cast(input.dtype)


def cosine_similarity(x1: Tensor, x2: Tensor, dim: int = 1, eps: float = 1e-8) -> Tensor:
    """Like PyTorch: each input is divided by max(its norm, eps), then the dot along ``dim``."""
    _check_float("cosine_similarity", x1)
    _check_float("cosine_similarity", x2)
    shape = broadcast_shapes(x1.shape, x2.shape, "cosine_similarity")
    d = dt.promote(x1.dtype, x2.dtype)
    a, b = acc(x1.cast(d)).expand(shape), acc(x2.cast(d)).expand(shape)
    na = maximum(norm(a, 2, dim, True), eps)
    nb = maximum(norm(b, 2, dim, True), eps)
    return div(a, na).mul(div(b, nb)).sum_reduce(dim).cast(d)


def dropout(
    input: Tensor,  # noqa: A002
    p: float = 0.5,
    training: bool = False,
    inplace: bool = False,
) -> Tensor:
    """Identity: luminal compiles inference graphs (``training=True`` with p > 0 is refused)."""
    if not 0 <= p <= 1:
        raise ValueError(f"dropout: p must be in [0, 1], got {p}")
    if training and p > 0:
        raise ValueError(
            "dropout: training-mode dropout is not supported (luminal compiles inference graphs)"
        )
    return input
