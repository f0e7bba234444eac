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
from dataclasses import dataclass, replace

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
    """``low`` with a measured schedule set on every kernel that has alternatives. Every
    kernel's candidates are listed first, so the tuner prepares them in one batch."""
    dims = representative_dims(low)
    names = sorted(low.dims)
    # identical kernels (a model's layers) get one decision: candidates are rendered to tell
    # equal schedules apart, which costs more than the decision's cache lookup
    decisions: dict[str, Decision | None] = {}
    keys: list[str | None] = []
    for kern in low.kernels:
        if not isinstance(kern, K.Kernel):
            keys.append(None)
            continue
        unsplit = replace(kern, schedule=K.Schedule(split=0, jam=0))
        reference = subprogram(low, [unsplit])
        ranges = sorted((n, d.lo, d.hi) for n, d in reference.dims.items())
        key = f"{sub_fingerprint(reference)}|{kern.schedule}|{ranges}"
        keys.append(key)
        if key not in decisions:
            decisions[key] = _candidates(low, kern, tuner, signature, dims, names, reference)
    tuner.prefetch([("schedule", d.dims, d.reference, d.cands) for d in decisions.values() if d])
    chosen: dict[str, K.Schedule | None] = {}
    steps: list[Step] = []
    for kern, k in zip(low.kernels, keys, strict=True):
        if k is None or not isinstance(kern, K.Kernel):
            steps.append(kern)
            continue
        if k not in chosen:
            d = decisions[k]
            chosen[k] = None if d is None else _decide(kern, tuner, d)
        sched = chosen[k]
        steps.append(
            kern if sched is None or sched == kern.schedule else replace(kern, schedule=sched)
        )
    return Lowered(low.buffers, steps, low.dims, low.weights)  # type: ignore[arg-type]


def _applied(k: K.Kernel) -> K.Kernel:
    out = apply(k)
    assert isinstance(out, K.Kernel)
    return out


@dataclass
class Decision:
    """One kernel's schedule decision: its sizes, reference program and candidates."""

    dims: dict[str, int]
    reference: Lowered
    cands: list[Candidate]


def _candidates(
    low: Lowered,
    kern: K.Kernel,
    tuner: Tuner,
    signature: Signature,
    dims: dict[str, int],
    names: list[str],
    reference: Lowered,
) -> Decision | None:
    """The decision to take for ``kern``; None when it keeps its schedule unmeasured."""
    scheds = alternatives(kern, tuner.space)
    if not scheds:
        return None
    unsplit = replace(kern, schedule=K.Schedule(split=0, jam=0))
    if kern.when is not None:  # runs for a part of the range: measured within it
        dims = representative_dims(reference)
    if estimate(subprogram(low, [kern]), dims, tuner.cost) * 1e6 < flags.SEARCH_MIN_US.as_float():
        return None  # too small for a measured choice to pay for its compile time
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
        return None
    cands = []
    for label, k in options:
        same = k.schedule is not None and signature(_applied(k), names) == ref_sig
        sub = reference if same else subprogram(low, [k])
        cands.append(Candidate(label, sub, estimate(sub, dims, tuner.cost), k))
    return Decision(dims, reference, cands)


def _decide(kern: K.Kernel, tuner: Tuner, d: Decision) -> K.Schedule | None:
    """The measured schedule (None: the default, which needs nothing on the kernel, so plans
    and digests stay as they were)."""
    k = tuner.choose(kern.name, "schedule", d.dims, d.reference, d.cands).payload
    assert isinstance(k, K.Kernel)
    return None if k.schedule == K.Schedule() else k.schedule
