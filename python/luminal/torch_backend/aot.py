"""Training graphs under ``torch.compile``: AOTAutograd with luminal compiling both halves.

AOTAutograd traces the joint forward + backward graph, decomposes it to core ATen and splits
it into a forward graph (outputs and the tensors saved for backward) and a backward graph;
both are converted and compiled by the inference path (``partition.split``), with every
input a run-time input (parameters change in place at each ``optimizer.step()``, so none is
baked into a plan as a weight). ``loss.backward()`` then gives PyTorch's gradients and the
optimizer stays in PyTorch.

Backward ops that core ATen keeps (``convolution_backward``, ...) are converted here by
luminal's own autograd: the forward op is rebuilt from its converter and differentiated with
``luminal.compiler.autograd`` seeded by the incoming gradient, so no op needs backward code.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd

from .. import functional as F
from ..compiler import autograd
from ..tensor import Tensor
from .aten import _compile_aten, _decompositions
from .convert import TABLE, Ctx, op
from .convert_conv import _convolution
from .partition import stats, warn_once
from .symbols import Unsupported

aten = torch.ops.aten


def _compile_half(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    run = _compile_aten(gm, example_inputs, weight_positions=set(), n_inputs=len(phs))
    return make_boxed_func(run)


def training_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                     **options: Any) -> Callable:  # fmt: skip
    """A dynamo backend for graphs that need gradients: forward and backward as plans."""
    if options:
        raise TypeError(f"luminal training backend: unknown options {sorted(options)}")
    tensors = [t for t in example_inputs if isinstance(t, torch.Tensor)]
    if any(t.device.type != "cpu" for t in tensors):
        warn_once("device", "luminal's torch backend runs CPU tensors only for now; this "
                  "graph runs in eager PyTorch")  # fmt: skip
        stats.compiles += 1
        return gm.forward
    return aot_autograd(
        fw_compiler=_compile_half,
        bw_compiler=_compile_half,
        decompositions=_decompositions(),
    )(gm, example_inputs)


def _vjp_of(fwd: Callable[..., Tensor], grad_out: Tensor, primals: Sequence[Tensor],
            wanted: Sequence[bool]) -> list[Tensor | None]:  # fmt: skip
    """Gradients of ``fwd(*primals)`` seeded with ``grad_out``, for the primals whose
    ``wanted`` flag is set (None for the others)."""
    own = [p + 0.0 for p in primals]  # each primal its own node: gradients are per node
    y = fwd(*own)
    gs = autograd.gradients(y.graph, y.edge, [p.node for p in own],
                            seed=grad_out.cast(y.dtype).edge)  # fmt: skip
    out: list[Tensor | None] = []
    for p, w, e in zip(own, wanted, gs):
        out.append(None if not w else Tensor(*e) if e is not None else p * 0.0)
    return out


@op(aten.convolution_backward.default)
def _convolution_backward(cx: Ctx, grad_out: Tensor, x: Tensor, w: Tensor, bias_sizes: Any,
                          stride: Any, padding: Any, dilation: Any, transposed: bool,
                          output_padding: Any, groups: int, mask: Sequence[bool]
                          ) -> tuple:  # fmt: skip
    def fwd(a: Tensor, b: Tensor) -> Tensor:
        return _convolution(cx, a, b, None, stride, padding, dilation, transposed,
                            output_padding, groups)  # fmt: skip

    gx, gw = _vjp_of(fwd, grad_out, [x, w], [mask[0], mask[1]])
    gb = grad_out.sum([0, *range(2, grad_out.ndim)]) if mask[2] else None
    return (gx, gw, gb)


@op(aten._scaled_dot_product_flash_attention_for_cpu_backward.default)
def _sdpa_cpu_backward(cx: Ctx, grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Any,
                       logsumexp: Any, dropout_p: float, is_causal: bool, *,
                       attn_mask: Any = None, scale: Any = None) -> tuple:  # fmt: skip
    if dropout_p:
        raise Unsupported("attention dropout in training (random masks)")

    def fwd(a: Tensor, b: Tensor, c: Tensor) -> Tensor:
        return F.scaled_dot_product_attention(a, b, c, attn_mask, 0.0, is_causal, scale, True)

    return tuple(_vjp_of(fwd, grad_out, [q, k, v], [True, True, True]))


_layer_norm_out = TABLE[aten.native_layer_norm.default]


@op(aten.native_layer_norm.default)
def _layer_norm_with_stats(cx: Ctx, x: Tensor, shape: Sequence[Any], w: Any, b: Any,
                           eps: float) -> tuple:  # fmt: skip
    """The inference converter's output plus mean and 1/std (kept dims), which AOTAutograd
    saves for the backward graph."""
    out = _layer_norm_out(cx, x, shape, w, b, eps)[0]
    dims = list(range(x.ndim - len(shape), x.ndim))
    xf = x._floating()
    mean = xf.mean(dims, keepdim=True)
    rstd = ((xf - mean) * (xf - mean)).mean(dims, keepdim=True).add(eps).rsqrt()
    return out, mean, rstd
