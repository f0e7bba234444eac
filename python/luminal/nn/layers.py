"""Standard layers with PyTorch's constructor arguments and state-dict names."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from .. import functional as F
from ..functional._base import prod
from ..functional._nnbase import tuple_arg
from ..graph import dtypes as dt
from ..tensor import Tensor
from .module import Module, Parameter

IntOr = int | Sequence[int]


def _uniform(fan_in: int) -> tuple[str, float]:
    return ("uniform", 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0)


def _opt(p: Parameter | None, x: Tensor) -> Tensor | None:
    return None if p is None else p.bind(x.graph)


class Linear(Module):
    def __init__(
        self, in_features: int, out_features: int, bias: bool = True, dtype: Any = dt.f32
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = Parameter((out_features, in_features), dtype, _uniform(in_features))
        self.bias = Parameter((out_features,), dtype, _uniform(in_features)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight.bind(x.graph), _opt(self.bias, x))

    def extra_repr(self) -> str:
        bias = self.bias is not None
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={bias}"


class Embedding(Module):
    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        padding_idx: int | None = None,
        dtype: Any = dt.f32,
    ) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim, self.padding_idx = (
            num_embeddings,
            embedding_dim,
            padding_idx,
        )
        self.weight = Parameter((num_embeddings, embedding_dim), dtype, ("normal", 1.0))

    def forward(self, idx: Tensor) -> Tensor:
        return F.embedding(idx, self.weight.bind(idx.graph), self.padding_idx)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"


class _LastDimsNorm(Module):
    """What LayerNorm and RMSNorm share: the normalized shape, eps and a weight of ones."""

    def __init__(
        self, normalized_shape: IntOr, eps: float | None, affine: bool, dtype: Any
    ) -> None:
        super().__init__()
        self.normalized_shape = (
            (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        )
        self.eps = eps
        self.weight = Parameter(self.normalized_shape, dtype, ("const", 1.0)) if affine else None

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}"


class LayerNorm(_LastDimsNorm):
    def __init__(
        self,
        normalized_shape: IntOr,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        dtype: Any = dt.f32,
    ) -> None:
        super().__init__(normalized_shape, eps, elementwise_affine, dtype)
        self.eps: float = eps
        affine_bias = elementwise_affine and bias
        self.bias = Parameter(self.normalized_shape, dtype, ("const", 0.0)) if affine_bias else None

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(
            x, self.normalized_shape, _opt(self.weight, x), _opt(self.bias, x), self.eps
        )


class RMSNorm(_LastDimsNorm):
    def __init__(
        self,
        normalized_shape: IntOr,
        eps: float | None = None,
        elementwise_affine: bool = True,
        dtype: Any = dt.f32,
    ) -> None:
        super().__init__(normalized_shape, eps, elementwise_affine, dtype)

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, self.normalized_shape, _opt(self.weight, x), self.eps)


class GroupNorm(Module):
    def __init__(
        self,
        num_groups: int,
        num_channels: int,
        eps: float = 1e-5,
        affine: bool = True,
        dtype: Any = dt.f32,
    ) -> None:
        super().__init__()
        self.num_groups, self.num_channels, self.eps = num_groups, num_channels, eps
        self.weight = Parameter((num_channels,), dtype, ("const", 1.0)) if affine else None
        self.bias = Parameter((num_channels,), dtype, ("const", 0.0)) if affine else None

    def forward(self, x: Tensor) -> Tensor:
        return F.group_norm(x, self.num_groups, _opt(self.weight, x), _opt(self.bias, x), self.eps)


class _BatchNorm(Module):
    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        dtype: Any = dt.f32,
    ) -> None:
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.weight = Parameter((num_features,), dtype, ("const", 1.0)) if affine else None
        self.bias = Parameter((num_features,), dtype, ("const", 0.0)) if affine else None
        self.track_running_stats = track_running_stats
        if track_running_stats:
            self.register_buffer("running_mean", Parameter((num_features,), dtype, ("const", 0.0)))
            self.register_buffer("running_var", Parameter((num_features,), dtype, ("const", 1.0)))
            self.register_buffer("num_batches_tracked", Parameter((), dt.i64))  # loaded, unused

    def forward(self, x: Tensor) -> Tensor:
        if self.track_running_stats:
            rm, rv = (
                self._buffers["running_mean"].bind(x.graph),
                self._buffers["running_var"].bind(x.graph),
            )
            return F.batch_norm(
                x, rm, rv, _opt(self.weight, x), _opt(self.bias, x), False, self.momentum, self.eps
            )
        return F.batch_norm(
            x, None, None, _opt(self.weight, x), _opt(self.bias, x), True, self.momentum, self.eps
        )

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}"


class BatchNorm1d(_BatchNorm):
    pass


class BatchNorm2d(_BatchNorm):
    pass


class _ConvNd(Module):
    nd = 0

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: IntOr,
        stride: IntOr = 1,
        padding: str | IntOr = 0,
        dilation: IntOr = 1,
        groups: int = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
        dtype: Any = dt.f32,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        if padding_mode != "zeros":
            raise NotImplementedError(f"{name}: padding_mode={padding_mode!r} (only 'zeros')")
        if in_channels % groups or out_channels % groups:
            raise ValueError(
                f"{name}: in_channels {in_channels} and out_channels {out_channels} must be "
                f"divisible by groups {groups}"
            )
        ks = tuple_arg(kernel_size, self.nd, name, "kernel_size")
        self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, ks
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups
        fan_in = in_channels // groups * math.prod(ks)
        self.weight = Parameter((out_channels, in_channels // groups, *ks), dtype, _uniform(fan_in))
        self.bias = Parameter((out_channels,), dtype, _uniform(fan_in)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        fn = F.conv1d if self.nd == 1 else F.conv2d
        return fn(
            x,
            self.weight.bind(x.graph),
            _opt(self.bias, x),
            self.stride,
            self.padding,
            self.dilation,
            self.groups,
        )

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}, padding={self.padding}"
        )


class Conv1d(_ConvNd):
    nd = 1


class Conv2d(_ConvNd):
    nd = 2


class Identity(Module):
    def forward(self, x: Tensor) -> Tensor:
        return x


class Dropout(Module):
    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return F.dropout(x, self.p, self.training)


class ReLU(Module):
    def forward(self, x: Tensor) -> Tensor:
        return F.relu(x)


class GELU(Module):
    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        self.approximate = approximate

    def forward(self, x: Tensor) -> Tensor:
        return F.gelu(x, self.approximate)


class SiLU(Module):
    def forward(self, x: Tensor) -> Tensor:
        return F.silu(x)


class Tanh(Module):
    def forward(self, x: Tensor) -> Tensor:
        return F.tanh(x)


class Sigmoid(Module):
    def forward(self, x: Tensor) -> Tensor:
        return F.sigmoid(x)


class Softmax(Module):
    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: Tensor) -> Tensor:
        return F.softmax(x, self.dim)


class Flatten(Module):
    def __init__(self, start_dim: int = 1, end_dim: int = -1) -> None:
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x: Tensor) -> Tensor:
        s, e = x._axis(self.start_dim), x._axis(self.end_dim)
        return x.reshape([*x.shape[:s], prod(x.shape[s : e + 1]), *x.shape[e + 1 :]])
