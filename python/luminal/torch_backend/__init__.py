"""``torch.compile(model, backend="luminal")``: PyTorch models compiled to luminal plans.

Dynamo hands over an FX graph; AOTAutograd functionalizes it and decomposes it to core ATen;
``convert`` turns each ATen op into luminal ops; ``partition`` leaves ops luminal cannot convert
to eager PyTorch (one warning per op) and runs the rest as compiled plans. Parameters and
buffers become plan weights; dynamic torch sizes become luminal dims, so one compile serves
every batch size and sequence length dynamo's guards allow.

Inference only: a graph that needs gradients (grad mode on and an input or parameter that
requires grad) runs in eager PyTorch with a warning. Importing ``luminal`` never imports torch;
this subpackage is loaded by torch through the ``torch_dynamo_backends`` entry point.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.source import is_from_unspecialized_param_buffer_source
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

from .convert import supported_targets
from .explain import Explanation, explain
from .partition import Env, Stats, binders_for, split, stats, warn_once

# what AOTAutograd raises for graphs eager PyTorch can still run; anything else (dynamo's own
# restart signals among them) must propagate
_TRACE_ERRORS = (GuardOnDataDependentSymNode, DynamicOutputShapeException,
                 DataDependentOutputException)  # fmt: skip

__all__ = [
    "Explanation", "Stats", "explain", "luminal_backend", "reset_stats", "stats",
    "supported_targets",
]  # fmt: skip


def reset_stats() -> None:
    """Zero the counters in ``stats`` and forget which warnings were given."""
    from . import partition

    partition.stats.__init__()  # type: ignore[misc]  # in place: importers hold the object
    partition._warned.clear()


@functools.cache
def _decompositions() -> dict[Any, Callable]:
    from torch._decomp import core_aten_decompositions

    return dict(core_aten_decompositions())


def _is_weight(node: torch.fx.Node, example: Any) -> bool:
    grapharg = node.meta.get("grapharg")
    source = getattr(grapharg, "source", None)
    if source is not None and is_from_unspecialized_param_buffer_source(source):
        return True
    return isinstance(example, torch.nn.Parameter)


def luminal_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **options: Any
                    ) -> Callable:  # fmt: skip
    """The dynamo backend. ``options`` is accepted for ``torch.compile(options=...)``; none
    are defined yet."""
    if options:
        raise TypeError(f"luminal backend: unknown options {sorted(options)}")
    tensors = [t for t in example_inputs if isinstance(t, torch.Tensor)]
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        warn_once("grad", "luminal compiles inference graphs only: this graph needs gradients "
                  "(grad mode is on and a parameter or input requires grad), so it runs in "
                  "eager PyTorch. Call the model under torch.no_grad() or "
                  "torch.inference_mode() to run it with luminal.")  # fmt: skip
        stats.compiles += 1
        return gm.forward
    if any(t.device.type != "cpu" for t in tensors):
        warn_once("device", "luminal's torch backend runs CPU tensors only for now; this "
                  "graph runs in eager PyTorch")  # fmt: skip
        stats.compiles += 1
        return gm.forward
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    weights = {
        i for i, (n, x) in enumerate(zip(phs, example_inputs, strict=False)) if _is_weight(n, x)
    }
    if len(phs) != len(example_inputs):
        weights = set()
    fw = functools.partial(_compile_aten, weight_positions=weights, n_inputs=len(phs))
    try:
        return aot_autograd(fw_compiler=fw, decompositions=_decompositions())(gm, example_inputs)
    except _TRACE_ERRORS as e:  # tracing to ATen failed on a data-dependent size: eager runs it
        msg = str(e).splitlines()[0][:200] if str(e) else ""
        warn_once(f"aot:{msg}", f"luminal: tracing this graph to ATen failed "
                  f"({type(e).__name__}: {msg}); it runs in eager PyTorch")  # fmt: skip
        return gm.forward


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
    env = Env(binders_for(gm))
    try:
        runner = split(gm, weight_names, shape_env, env)
    except Exception as e:  # a backend bug must not stop a model eager PyTorch can run
        warn_once(f"split:{e}", f"luminal: converting this graph failed ({type(e).__name__}: "
                  f"{str(e)[:200]}); it runs in eager PyTorch")  # fmt: skip
        return gm

    def run(*args: Any) -> Any:
        env.bind(args)
        return runner(*args)

    return run
