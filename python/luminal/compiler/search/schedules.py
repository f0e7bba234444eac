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
from ...graph import dtypes as dt
from ...graph import symbolic as sym
from ...graph.ops import Op
from .. import kernel_ir as K
from ..lower import Lowered
from ..schedule import alternatives, apply, jam2_applies, top_reduces
from ..target import ScheduleSpace
from .cost import applied, estimate
from .select import Step, representative_dims, subprogram
from .tuner import Candidate, Tuner, spread, sub_fingerprint

# signature(scheduled kernel, dim names): equal for kernels that generate the same code
Signature = Callable[[K.Kernel, list[str]], Hashable]

# Test hook: functions kernel -> a replacement kernel (or None), each added as one more
# candidate labelled "test:<function name>"; tests use it to show a wrong candidate is dropped.
EXTRA_CANDIDATES: list[Callable[[K.Kernel], K.Kernel | None]] = []


def choose_schedules(low: Lowered, tuner: Tuner, signature: Signature) -> Lowered:
    """``low`` with a measured schedule set on every kernel that has alternatives. Every
    kernel's candidates are listed first, each decision handed to the tuner to compile in the
    background as it is listed, the rest compiled in one batch before the measurements."""
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
            d = decisions[key] = _candidates(low, kern, tuner, signature, dims, names, reference)
            if d is not None:  # compiled while the next kernels' candidates are listed
                tuner.prefetch([("schedule", d.dims, d.reference, d.cands)], wait=False)
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
    # the kernels no decision measured compile while the stages after this one run, instead
    # of last, when the plan is loaded (SmolLM2: its attention kernel alone, 0.45 s)
    unmeasured = {k: kern for kern, k in zip(low.kernels, keys, strict=True)
                  if k is not None and decisions[k] is None}  # fmt: skip
    tuner.warm([subprogram(low, [kern]) for kern in unmeasured.values()])
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
    """The decision to take for ``kern``; None when it keeps its schedule unmeasured.

    Every schedule is estimated, but only the best ranked are rendered to tell equal code
    apart: the tuner measures the default and the ``max_candidates - 1`` others ``spread``
    picks, so the walk in that order stops once that many distinct ones are found (rendering
    every schedule was most of a cold search's Python time). The candidates are the default,
    then the others in the walk's order, so the tuner picks them as this walk did; the ones
    the walk did not reach are listed unrendered and are never measured."""
    scheds = alternatives(kern, tuner.space)
    if not scheds:
        return None
    scheds += column_blocks(kern, tuner.space)
    unsplit = replace(kern, schedule=K.Schedule(split=0, jam=0))
    if kern.when is not None:  # runs for a part of the range: measured within it
        dims = representative_dims(reference)
    if estimate(subprogram(low, [kern]), dims, tuner.cost) * 1e6 < flags.SEARCH_MIN_US.as_float():
        return None  # too small for a measured choice to pay for its compile time
    options: list[tuple[str, K.Kernel]] = [(s.label(), replace(kern, schedule=s)) for s in scheds]
    for hook in EXTRA_CANDIDATES:
        alt = hook(kern)
        if alt is not None:
            options.append((f"test:{getattr(hook, '__name__', 'hook')}", alt))
    cands = []
    for label, k in options:
        sub = subprogram(low, [k])
        cut = sub.kernels[0]
        assert isinstance(cut, K.Kernel)
        cands.append(Candidate(label, sub, estimate(sub, dims, tuner.cost), k, _group(cut)))
    # the default first (alternatives lists it first), the rest in the order the tuner
    # measures them (``spread``: by cost, ties spread over distinct structures); a schedule
    # that renders as one already kept is dropped and not counted as picked, so the tuner,
    # given the kept ones and the rest, picks as this walk did
    costs = [c.cost for c in cands]
    groups = [c.group for c in cands]
    ref_sig = signature(_applied(unsplit), names)
    seen: set[Hashable] = set()
    kept: list[Candidate] = []
    picked: list[int] = []
    pool = list(range(len(cands)))
    i: int | None = 0
    while i is not None:
        pool.remove(i)
        c = cands[i]
        sig = signature(_applied(c.payload), names)
        if sig not in seen:
            seen.add(sig)
            same = c.payload.schedule is not None and sig == ref_sig
            kept.append(replace(c, sub=reference) if same else c)
            picked.append(i)
        if len(kept) >= tuner.max_candidates:
            break
        i = spread(costs, groups, picked, pool)
    if len(seen) < 2:
        return None
    # not reached: never measured, listed for the record
    kept += sorted((cands[j] for j in pool), key=lambda c: c.cost)
    return Decision(dims, reference, kept)


def column_blocks(k: K.Kernel, space: ScheduleSpace) -> list[K.Schedule]:
    """Blocks of one row by C columns (``jam2=C``, C in the target's ``columns``, both task
    orders) for a product whose weight is gathered by the row: each element's sums are plain
    f32 sums along the innermost output dim whose bodies read a ``K.Gather`` whose row uses
    neither the summed variable nor the column (a mixture of experts' weight, by each row's
    expert), every load that moves with the sum unit-stride in it. No two rows share a
    weight load there, so the row jams and 2-D blocks of ``schedule.alternatives`` do not
    apply, but C columns of a row share its row's load and sum in C accumulators (as the
    target's renderer does it); none where the target's space lists no ``columns``. [] for
    any other kernel."""
    cols = space.columns
    n = len(k.shape)
    if not cols or n == 0 or k.scatter_row is not None or not jam2_applies(k):
        return []
    col = f"_i{n - 1}"
    memo: dict[int, frozenset[str]] = {}
    tops = [r for r in top_reduces(k.value) if col in K.free_vars(r, memo)]
    if not tops:
        return []
    for r in tops:
        if r.op is not Op.SUM_REDUCE or r.dtype is not dt.f32:
            return []
        inner = list(K.walk(r.body))
        if any(isinstance(x, (K.Reduce, K.Masked, K.SoftmaxSum)) for x in inner):
            return []
        gathers = [x for x in inner if isinstance(x, K.Gather)]
        if not gathers or any(
            x.dtype is not dt.f32
            or not x.row.dtype.is_int
            or sym.lower_bound(x.rows) < 1
            or {r.var.name, col} & K.free_vars(x.row, memo)
            for x in gathers
        ):
            return []
        for x in inner:
            if isinstance(x, K.Load) and isinstance(x.index, sym.Expr) and r.var in x.index.vars():
                step = sym.add(sym.substitute(x.index, {r.var.name: sym.add(r.var, 1)}),
                               sym.mul(x.index, -1))  # fmt: skip
                if step != 1:
                    return []
    return [K.Schedule(-1, 0, o, 0, 0, c) for c in cols for o in space.orders]


def _group(k: K.Kernel) -> tuple[Hashable, ...]:
    """A schedule's structure for ``spread``, coarse to fine: its register block (jammed dim,
    rows, columns; the default rule's resolved), task order, split, chunk."""
    s = applied(k).schedule or K.Schedule()
    block = (s.jam_dim if s.jam > 1 else 0, max(s.jam, 1), max(s.jam2, 1))
    return (block, s.order, s.split, s.chunk)


def _decide(kern: K.Kernel, tuner: Tuner, d: Decision) -> K.Schedule | None:
    """The measured schedule (None: the default, which needs nothing on the kernel, so plans
    and digests stay as they were)."""
    k = tuner.choose(kern.name, "schedule", d.dims, d.reference, d.cands).payload
    assert isinstance(k, K.Kernel)
    return None if k.schedule == K.Schedule() else k.schedule
