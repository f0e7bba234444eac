"""Activation functions named as in ``torch.nn.functional``.

Piecewise functions avoid selects: ``max(x, 0)`` is a MAX_REDUCE over a padded axis (``relu``),
and ``min(x, 0) = -relu(-x)``, so ``elu(x) = relu(x) + alpha * expm1(min(x, 0))`` needs no
mask and stays exact at ±inf.
"""

from __future__ import annotations

from ..graph import dtypes as dt
from ..tensor import Tensor
from ._base import need_tensor, select
from .elementwise import _in_f32, abs, clamp, gt, neg
from .transcendental import _erfc, _exp, _expm1, _log1p, _sigmoid, _tanh, sigmoid, tanh

__all__ = [
    "celu", "elu", "gelu", "glu", "hardsigmoid", "hardswish", "hardtanh", "leaky_relu",
    "logsigmoid", "mish", "relu", "relu6", "selu", "sigmoid", "silu", "softplus", "softsign",
    "tanh", "tanhshrink", "threshold",
]  # fmt: skip


def relu(input: Tensor, inplace: bool = False) -> Tensor:  # noqa: A002
    x = need_tensor("relu", input)
    if x.dtype is dt.bool_:
        raise TypeError(f"relu: not defined for bool tensors ({x.shape})")
    return x.unsqueeze(-1).pad_dim(-1, 0, 1).max_reduce(-1)  # the padded element is the 0


def _min0(x: Tensor) -> Tensor:
    return neg(relu(neg(x)))


def hardtanh(
    input: Tensor, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False
) -> Tensor:  # noqa: A002
    return clamp(input, min_val, max_val)


def relu6(input: Tensor, inplace: bool = False) -> Tensor:  # noqa: A002
    return clamp(relu(input), max=6.0)


def leaky_relu(input: Tensor, negative_slope: float = 0.01, inplace: bool = False) -> Tensor:  # noqa: A002
    x = need_tensor("leaky_relu", input)
    return relu(x).add(_min0(x).mul(negative_slope))


def _elu(x: Tensor, alpha: float, scale: float, input_scale: float) -> Tensor:
    neg_part = _expm1(_min0(x).mul(input_scale)).mul(alpha)
    out = relu(x).add(neg_part)
    return out.mul(scale) if scale != 1.0 else out


def elu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:  # noqa: A002
    return _in_f32(_elu)(input, alpha, 1.0, 1.0)


def celu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:  # noqa: A002
    return _in_f32(_elu)(input, alpha, 1.0, 1.0 / alpha)


_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def selu(input: Tensor, inplace: bool = False) -> Tensor:  # noqa: A002
    return _in_f32(_elu)(input, _SELU_ALPHA, _SELU_SCALE, 1.0)


def _gelu(x: Tensor, approximate: str) -> Tensor:
    if approximate == "tanh":
        # 0.5 * (1 + tanh(u)) == sigmoid(2u): one exp2 and a division instead of tanh's
        # rational fit and its four clamps (the chain was compute-bound on a CPU), and no
        # cancellation in 1 + tanh(u) where tanh(u) nears -1
        inner = x.add(x.mul(x).mul(x).mul(0.044715)).mul(2 * 0.7978845608028654)
        return x.mul(_sigmoid(inner))
    return x.mul(0.5).mul(_erfc(x.mul(-0.7071067811865476)))


def gelu(input: Tensor, approximate: str = "none") -> Tensor:  # noqa: A002
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return _in_f32(_gelu)(input, approximate)


def silu(input: Tensor, inplace: bool = False) -> Tensor:  # noqa: A002
    return _in_f32(lambda x: x.mul(_sigmoid(x)))(input)


def _softplus(x: Tensor, beta: float) -> Tensor:
    """max(bx, 0) + log1p(exp(-|bx|)), / beta: stable everywhere, no threshold select needed
    (above PyTorch's threshold the second term is below f32 resolution)."""
    bx = x.mul(beta) if beta != 1.0 else x
    out = relu(bx).add(_log1p(_exp(neg(abs(bx)))))
    return out.mul(1.0 / beta) if beta != 1.0 else out


def softplus(input: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:  # noqa: A002
    return _in_f32(_softplus)(input, beta)


def logsigmoid(input: Tensor) -> Tensor:  # noqa: A002
    return _in_f32(lambda x: neg(_softplus(neg(x), 1.0)))(input)


def mish(input: Tensor, inplace: bool = False) -> Tensor:  # noqa: A002
    return _in_f32(lambda x: x.mul(_tanh(_softplus(x, 1.0))))(input)


def hardsigmoid(input: Tensor, inplace: bool = False) -> Tensor:  # noqa: A002
    return _in_f32(lambda x: clamp(x.add(3.0), 0.0, 6.0).mul(1.0 / 6.0))(input)


def hardswish(input: Tensor, inplace: bool = False) -> Tensor:  # noqa: A002
    return _in_f32(lambda x: x.mul(clamp(x.add(3.0), 0.0, 6.0)).mul(1.0 / 6.0))(input)


def softsign(input: Tensor) -> Tensor:  # noqa: A002
    return _in_f32(lambda x: x.mul(abs(x).add(1.0).reciprocal()))(input)


def tanhshrink(input: Tensor) -> Tensor:  # noqa: A002
    return _in_f32(lambda x: x.add(neg(_tanh(x))))(input)


def threshold(input: Tensor, threshold: float, value: float, inplace: bool = False) -> Tensor:  # noqa: A002
    """x where x > threshold else value (an exact select)."""
    x = need_tensor("threshold", input)
    c = gt(x, threshold)
    return select(c, x, x._lift(value).cast(x.dtype).expand(x.shape))


def glu(input: Tensor, dim: int = -1) -> Tensor:  # noqa: A002
    x = need_tensor("glu", input)
    d = x._axis(dim)
    n = x.shape[d]
    if not isinstance(n, int) or n % 2:
        raise ValueError(f"glu: dim {dim} of shape {x.shape} must have an even size")
    return x.slice(d, 0, n // 2).mul(sigmoid(x.slice(d, n // 2, n // 2)))
