"""What every target does the same way: assemble the plan from generated kernels and library
calls (buffers, the arena, steps, weights)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from ..compiler import kernel_ir as K
from ..compiler.lower import Lowered
from ..compiler.memory import plan_memory
from ..graph import symbolic as sym
from ..plan import InlineWeight, KernelFormat, Launch, LibCall, Plan, Role

_ROLE = {"input": Role.input, "output": Role.output, "weight": Role.weight, "scratch": Role.scratch}


@dataclass
class Launchable:
    """A generated kernel as the plan holds it."""

    name: str
    format: KernelFormat
    code: bytes | str
    args: list[int]
    grid: tuple
    block: tuple


def _condition(low: Lowered, when: K.When | None) -> sym.sint | None:
    """A step's ``when`` (dims, lo, hi) as the plan's condition: None where it always holds."""
    if when is None:
        return None
    names, lo, hi = when
    n: sym.sint = 1
    for name in names:
        n = sym.mul(n, low.dims[name])
    cond = sym.logical_and(sym.lt(lo - 1, n), sym.lt(n, hi + 1))
    return None if cond == 1 else cond


def assemble_plan(
    low: Lowered,
    name: str,
    backend: str,
    arch: str,
    launches: Iterable[Launchable],
    libcalls: Mapping[int, K.LibCall],
) -> Plan:
    """The plan of ``low``: step i is ``libcalls[i]`` when present, else the next of
    ``launches`` (one per remaining step, in order). Kernels with the same code are held once
    in the plan and launched on their own buffers."""
    plan = Plan(backend=backend, arch=arch, metadata={"graph": name})
    dim_names = sorted(low.dims)
    for n in dim_names:
        d = low.dims[n]
        plan.add_dim(n, d.lo, d.hi)
    steps = [K.step_buffers(k) for k in low.kernels]
    mem = plan_memory({b.id: b.nbytes() for b in low.buffers if b.role == "scratch"}, steps)
    for b in low.buffers:
        plan.add_buffer(
            b.name, b.dtype.name, _ROLE[b.role], b.shape, b.nbytes(), mem.offsets.get(b.id),
            alias=b.alias,
        )  # fmt: skip
    pending = iter(launches)
    kernel_ids: dict[tuple[KernelFormat, bytes | str], int] = {}
    for i in range(len(low.kernels)):
        if i in libcalls:
            lc = libcalls[i]
            plan.steps.append(
                LibCall(lc.func, dict(lc.fields), list(lc.args), _condition(low, lc.when))
            )
            continue
        k = next(pending)
        kid = kernel_ids.get((k.format, k.code))
        if kid is None:
            kid = kernel_ids[(k.format, k.code)] = plan.add_kernel(k.name, k.format, k.name, k.code)
        when = _condition(low, low.kernels[i].when)
        plan.steps.append(Launch(kid, k.args, k.grid, k.block, when=when))
    for b in low.buffers:
        if b.role == "weight":
            if b.name not in low.weights:
                raise ValueError(
                    f"weight {b.name!r} has no data: give data= or call .set() before compiling"
                )
            plan.weights.append(InlineWeight(b.id, np.ascontiguousarray(low.weights[b.name])))
    plan.metadata["arena_slots"] = str(mem.slots)
    return plan
