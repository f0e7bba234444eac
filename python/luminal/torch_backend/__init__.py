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
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

# each converter module registers its converters in convert's tables when imported
from . import (  # noqa: F401
    convert_complex,
    convert_conv,
    convert_elementwise,
    convert_index,
    convert_linalg,
    convert_nn,
    convert_reduce,
    convert_views,
)
from .aten import _compile_aten, _decompositions
from .convert import supported_targets
from .explain import Explanation, explain_with
from .partition import Stats, stats, warn_once
from .resize import keep_nearest_whole

# what AOTAutograd raises for graphs eager PyTorch can still run; anything else (dynamo's own
# restart signals among them) must propagate
_TRACE_ERRORS = (GuardOnDataDependentSymNode, DynamicOutputShapeException,
                 DataDependentOutputException)  # fmt: skip

__all__ = [
    "Explanation", "Stats", "explain", "luminal_backend", "reset_stats", "stats",
    "supported_targets",
]  # fmt: skip


def explain(model: Any, *args: Any, dynamic: bool | None = True, **kwargs: Any) -> Explanation:
    """Compile ``model`` (a module or function) with the luminal backend, call it once on
    ``args`` / ``kwargs`` under ``torch.no_grad()``, and report: graph breaks, partitions,
    plans, what ran in eager PyTorch and why. Resets dynamo's caches and ``stats`` (other
    compiled models recompile on their next call)."""
    return explain_with(luminal_backend, reset_stats, model, *args, dynamic=dynamic, **kwargs)


def reset_stats() -> None:
    """Zero the counters in ``stats`` and forget which warnings were given."""
    from . import partition

    partition.stats.__init__()  # type: ignore[misc]  # in place: importers hold the object
    partition._warned.clear()


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
        from .aot import training_backend  # forward and backward both compiled by luminal

        return training_backend(gm, example_inputs)
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
    keep_nearest_whole(gm)
    try:
        return aot_autograd(
            fw_compiler=fw,
            decompositions=_decompositions(inference=True),
            keep_inference_input_mutations=True,
        )(gm, example_inputs)
    except _TRACE_ERRORS as e:  # tracing to ATen failed on a data-dependent size: eager runs it
        msg = str(e).splitlines()[0][:200] if str(e) else ""
        warn_once(f"aot:{msg}", f"luminal: tracing this graph to ATen failed "
                  f"({type(e).__name__}: {msg}); it runs in eager PyTorch")  # fmt: skip
        return gm.forward
