"""Choose each reduction kernel's schedule by measurement.

For a kernel with a reduction a schedule changes (a GEMV row, a row sum, a quantized dot
product), ``schedule.alternatives`` lists explicit schedules (reduction split factor, output
elements per task). Schedules that generate the same code (``signature``, given by the
caller, renders the kernel) are one candidate. The tuner (tuner.py) ranks the rest with the
cost model, measures the best few, checks the kept one against the kernel as lowered (no
split) on random inputs, and caches the choice by (kernel, sizes, target). The chosen
schedule is set on the kernel (``K.Kernel.schedule``); ``build_plan`` applies it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import replace

from ... import flags
from .. import kernel_ir as K
from ..lower import Lowered
from ..schedule import alternatives, apply
from .cost import estimate
from .select import Step, representative_dims, subprogram
from .tuner import Candidate, Tuner, sub_fingerprint

# signature(scheduled kernel, dim names): equal for kernels that generate the same code
Signature = Callable[[K.Kernel, list[str]], Hashable]

# Test hook: functions kernel -> a replacement kernel (or None), each added as one more
# candidate labelled "test:<function name>"; tests use it to show a wrong candidate is dropped.
EXTRA_CANDIDATES: list[Callable[[K.Kernel], K.Kernel | None]] = []


def choose_schedules(low: Lowered, tuner: Tuner, signature: Signature) -> Lowered:
    """``low`` with a measured schedule set on every kernel that has alternatives."""
    dims = representative_dims(low)
    names = sorted(low.dims)
    steps: list[Step] = []
    # identical kernels (a model's layers) get one decision: candidates are rendered to tell
    # equal schedules apart, which costs more than the decision's cache lookup
    memo: dict[str, K.Schedule | None] = {}
    for kern in low.kernels:
        steps.append(_choose(low, kern, tuner, signature, dims, names, memo))
    return Lowered(low.buffers, steps, low.dims, low.weights)  # type: ignore[arg-type]


def _applied(k: K.Kernel) -> K.Kernel:
    out = apply(k)
    assert isinstance(out, K.Kernel)
    return out


def _choose(
    low: Lowered,
    kern: Step,
    tuner: Tuner,
    signature: Signature,
    dims: dict[str, int],
    names: list[str],
    memo: dict[str, K.Schedule | None],
) -> Step:
    if not isinstance(kern, K.Kernel):
        return kern
    unsplit = replace(kern, schedule=K.Schedule(split=0))
    reference = subprogram(low, [unsplit])
    ranges = sorted((n, d.lo, d.hi) for n, d in reference.dims.items())
    key = f"{sub_fingerprint(reference)}|{kern.schedule}|{ranges}"
    if key not in memo:
        chosen = _decide(low, kern, tuner, signature, dims, names, reference)
        memo[key] = chosen.schedule if isinstance(chosen, K.Kernel) else None
    sched = memo[key]
    return kern if sched is None or sched == kern.schedule else replace(kern, schedule=sched)


def _decide(
    low: Lowered,
    kern: K.Kernel,
    tuner: Tuner,
    signature: Signature,
    dims: dict[str, int],
    names: list[str],
    reference: Lowered,
) -> Step:
    scheds = alternatives(kern, tuner.space)
    if not scheds:
        return kern
    unsplit = replace(kern, schedule=K.Schedule(split=0))
    if kern.when is not None:  # runs for a part of the range: measured within it
        dims = representative_dims(reference)
    if estimate(subprogram(low, [kern]), dims, tuner.cost) * 1e6 < flags.SEARCH_MIN_US.as_float():
        return kern  # too small for a measured choice to pay for its compile time
    ref_sig = signature(_applied(unsplit), names)
    seen: set[Hashable] = set()
    options: list[tuple[str, K.Kernel]] = []
    for s in scheds:
        k = replace(kern, schedule=s)
        sig = signature(_applied(k), names)
        if sig not in seen:
            seen.add(sig)
            options.append((s.label(), k))
    for hook in EXTRA_CANDIDATES:
        alt = hook(kern)
        if alt is not None:
            options.append((f"test:{getattr(hook, '__name__', 'hook')}", alt))
    if len(options) < 2:
        return kern
    cands = []
    for label, k in options:
        same = k.schedule is not None and signature(_applied(k), names) == ref_sig
        sub = reference if same else subprogram(low, [k])
        cands.append(Candidate(label, sub, estimate(sub, dims, tuner.cost), k))
    chosen = tuner.choose(kern.name, "schedule", dims, reference, cands)
    k = chosen.payload
    assert isinstance(k, K.Kernel)
    # the default needs nothing on the kernel: leave it unset (plans and digests as before)
    return kern if k.schedule == K.Schedule() else k
