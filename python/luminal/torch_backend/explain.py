"""``explain(model, *args, **kwargs)``: what a user reads when a compiled model is slow.

It runs the call twice from a clean dynamo state: once through ``torch._dynamo.explain`` for
the graphs dynamo captured and why it broke between them, once through the luminal backend
for what became luminal plans and what stayed in eager PyTorch (and why).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from . import partition


@dataclass
class Explanation:
    graphs: int  # FX graphs dynamo captured
    graph_breaks: list[str]  # why dynamo split the call (each break is eager Python between)
    compiles: int  # graphs the backend compiled on this call
    partitions: list[int]  # ATen nodes in each luminal partition
    plans: int  # plans built
    eager_ops: dict[str, int]  # ATen op -> nodes left to eager PyTorch
    fallbacks: list[str] = field(default_factory=list)  # each reason something ran in eager

    @property
    def fully_in_luminal(self) -> bool:
        return not (self.graph_breaks or self.eager_ops or self.fallbacks)

    def __str__(self) -> str:
        lines = [
            f"dynamo: {self.graphs} graph(s), {len(self.graph_breaks)} graph break(s)",
            *(f"  break: {r}" for r in self.graph_breaks),
            f"luminal: {self.compiles} compile(s), {len(self.partitions)} partition(s) "
            f"({', '.join(str(n) for n in self.partitions) or 'none'} ATen nodes), "
            f"{self.plans} plan(s)",
        ]
        if self.eager_ops:
            lines.append("eager PyTorch ran these ATen ops (nodes):")
            lines += [f"  {k}: {v}" for k, v in sorted(self.eager_ops.items())]
        lines += [f"  why: {r}" for r in dict.fromkeys(self.fallbacks)]
        if self.fully_in_luminal:
            lines.append("everything ran in luminal")
        return "\n".join(lines)


def explain_with(backend: Any, reset_stats: Any, model: Any, *args: Any,
                 dynamic: bool | None = True, **kwargs: Any) -> Explanation:  # fmt: skip
    """``luminal.torch_backend.explain`` with the backend and the stats reset it uses."""
    torch._dynamo.reset()
    with torch.no_grad():
        dx = torch._dynamo.explain(model)(*args, **kwargs)
    breaks = [_reason(r) for r in dx.break_reasons]
    torch._dynamo.reset()
    reset_stats()
    compiled = torch.compile(model, backend=backend, dynamic=dynamic)
    with torch.no_grad():
        compiled(*args, **kwargs)
    st = partition.stats
    return Explanation(dx.graph_count, breaks, st.compiles, list(st.partition_sizes), st.plans,
                       dict(st.eager_ops), list(st.fallbacks))  # fmt: skip


def _reason(r: Any) -> str:
    where = ""
    stack = getattr(r, "user_stack", None)
    if stack:
        f = stack[-1]
        where = f" at {f.filename}:{f.lineno}"
    return f"{getattr(r, 'reason', r)}{where}"
