"""The ATen-level compiler both dynamo backends share: AOTAutograd's decompositions, and the
forward (or backward) compiler that splits an ATen graph into luminal plans and eager rest."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._guards import detect_fake_mode

from .partition import Env, binders_for, split, stats, warn_once
from .symbols import guard_multiples

# Ops core ATen keeps whole that luminal has no converter for, where PyTorch's own
# decomposition reaches ops that it converts
_EXTRA_DECOMPOSED = (
    "adaptive_max_pool2d.default", "adaptive_max_pool3d.default", "grid_sampler_2d.default",
    "max_pool3d_with_indices.default", "upsample_bicubic2d.default",
    "upsample_bilinear2d.default", "upsample_trilinear3d.default",
)  # fmt: skip


# Ops core ATen decomposes that inference graphs keep whole: luminal converts them directly,
# and their decomposition is the slow part of tracing (CPU attention's math form does its
# shape arithmetic on symbolic sizes: 1.4 s of a small BERT's 3 s trace). Training keeps the
# decomposition: backward reads the attention's log-sum-exp, which the converter leaves out.
_INFERENCE_WHOLE = ("_scaled_dot_product_flash_attention_for_cpu.default",)


def _target(name: str) -> Any:
    packet, overload = name.split(".")
    return getattr(getattr(torch.ops.aten, packet, None), overload, None)


@functools.cache
def _decompositions(inference: bool = False) -> dict[Any, Callable]:
    from torch._decomp import core_aten_decompositions, decomposition_table

    table = dict(core_aten_decompositions())
    for name in _EXTRA_DECOMPOSED:
        target = _target(name)
        if target is not None and target in decomposition_table:
            table[target] = decomposition_table[target]
    for name in _INFERENCE_WHOLE if inference else ():
        table.pop(_target(name), None)
    return table


def _compile_aten(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *,
                  weight_positions: set[int], n_inputs: int) -> Callable:  # fmt: skip
    """AOTAutograd's forward compiler: the ATen graph's inputs are dynamo's, in order, unless
    AOTAutograd changed their number (then nothing is treated as a weight)."""
    stats.compiles += 1  # counted here: dynamo may restart a trace before this point
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(phs) != n_inputs:
        weight_positions = set()
    weight_names = {phs[i].name for i in weight_positions}
    fake_mode = detect_fake_mode(example_inputs)
    shape_env = getattr(fake_mode, "shape_env", None)
    env = Env(binders_for(gm), guard_multiples(shape_env))
    try:
        runner = split(gm, weight_names, shape_env, env)
    except Exception as e:  # a backend bug must not stop a model eager PyTorch can run
        warn_once(f"split:{e}", f"luminal: converting this graph failed ({type(e).__name__}: "
                  f"{str(e)[:200]}); it runs in eager PyTorch")  # fmt: skip
        return gm

    forward = runner.forward  # the generated code itself: nn.Module's call dispatch costs µs

    def run(*args: Any) -> Any:
        try:
            env.bind(args)
        except ValueError as e:  # a size outside dynamo's guards: eager PyTorch runs it
            warn_once(f"bind:{e}", f"luminal: {e}; this call runs in eager PyTorch")
            env.eager = True
            try:
                return forward(*args)
            finally:
                env.eager = False
        return forward(*args)

    return run
