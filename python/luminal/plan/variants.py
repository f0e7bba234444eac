"""One plan holding several programs for one graph, chosen at run time by a bound dim.

A language model's prefill (many tokens: GEMMs on f32 weights) and decode (one token: GEMVs on
packed weights) are two programs of the same inputs and outputs. ``by_dim`` merges such plans
into one: every step of variant ``i`` gets the condition ``starts[i] <= dim < starts[i + 1]``
(format version 3, ``Step.when``), so one run executes exactly one variant's steps. Inputs and
outputs (and in-place updates, such as KV caches) are shared by name; each variant keeps its
own kernels, weights and scratch buffers (scratch of different variants may overlap in the
arena: they never run in one call).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

from .model import (
    Copy,
    Expr,
    FileWeight,
    InlineWeight,
    KernelFormat,
    Launch,
    LibCall,
    Op,
    PlanData,
    PlanError,
    Postfix,
    Role,
    Step,
)

# kernel formats whose code names its entry point in text (renamed when merged)
_TEXT_FORMATS = (KernelFormat.c_source, KernelFormat.cuda_source, KernelFormat.msl)


def _io_signature(p: PlanData) -> dict[str, tuple[Role, int, str | None]]:
    sig: dict[str, tuple[Role, int, str | None]] = {}
    for b in p.buffers:
        if b.role in (Role.input, Role.output):
            alias = p.buffers[b.alias].name if b.alias is not None else None
            sig[b.name] = (b.role, int(b.dtype), alias)
    return sig


def _condition(dim: int, lo: int | None, hi: int | None) -> Postfix:
    """``lo <= dims[dim] < hi`` (either bound may be absent) as a postfix program."""
    prog: list[tuple[int, int]] = []
    if lo is not None:
        prog += [(Op.CONST, lo - 1), (Op.DIM, dim), (Op.LT, 0)]
    if hi is not None:
        prog += [(Op.DIM, dim), (Op.CONST, hi), (Op.LT, 0)]
    if lo is not None and hi is not None:
        prog.append((Op.MUL, 0))
    return Postfix(tuple((int(o), int(a)) for o, a in prog))


def by_dim(plans: Sequence[PlanData], dim: str, starts: Sequence[int]) -> PlanData:
    """One plan that runs ``plans[i]`` where ``starts[i] <= dim < starts[i + 1]`` (the last one
    up to the dim's maximum; ``starts[0]`` must be the dim's minimum). The plans must be for
    one backend, with the same dims (names and order; ranges equal except ``dim``'s, where
    each plan's range must hold the part it runs: the merged range is their union) and the
    same inputs and outputs (names, roles, dtypes, in-place updates). Each variant's
    expressions are evaluated over the whole range when dims are bound."""
    if len(plans) < 2 or len(starts) != len(plans):
        raise ValueError(f"by_dim: {len(plans)} plans need as many starts, got {len(starts)}")
    first = plans[0]
    names = [d.name for d in first.dims]
    if dim not in names:
        raise ValueError(f"by_dim: the plans have no dim {dim!r} (dims: {names})")
    at = names.index(dim)
    lo, hi = min(p.dims[at].min for p in plans), max(p.dims[at].max for p in plans)
    if list(starts) != sorted(set(starts)) or starts[0] != lo or starts[-1] > hi:
        raise ValueError(
            f"by_dim: starts {list(starts)} must increase from {dim}'s minimum {lo} and stay "
            f"within its maximum {hi}"
        )
    sig = _io_signature(first)
    for i, p in enumerate(plans):
        if p.backend != first.backend:
            raise PlanError(f"by_dim: plan {i} is for {p.backend!r}, plan 0 for {first.backend!r}")
        others = [(x.name, x.min, x.max) for j, x in enumerate(p.dims) if j != at]
        if [x.name for x in p.dims] != names or others != [
            (x.name, x.min, x.max) for j, x in enumerate(first.dims) if j != at
        ]:
            raise PlanError(f"by_dim: plan {i} has other dims than plan 0")
        # each variant was compiled for the part of the range it runs
        end = starts[i + 1] - 1 if i + 1 < len(starts) else hi
        if not p.dims[at].min <= starts[i] <= end <= p.dims[at].max:
            raise PlanError(
                f"by_dim: plan {i} runs {dim} in [{starts[i]}, {end}] but was compiled for "
                f"[{p.dims[at].min}, {p.dims[at].max}]"
            )
        if _io_signature(p) != sig:
            raise PlanError(f"by_dim: plan {i} has other inputs or outputs than plan 0")
    dims = [replace(x) for x in first.dims]
    dims[at] = replace(dims[at], min=lo, max=hi)
    out = type(first)(first.backend, first.arch, dims)
    out.buffers = [replace(b) for b in first.buffers]
    io_ids = {b.name: j for j, b in enumerate(out.buffers) if b.role in (Role.input, Role.output)}
    entries: set[str] = set()
    for i, p in enumerate(plans):
        bmap: dict[int, int] = {}
        for j, b in enumerate(p.buffers):
            if b.role in (Role.input, Role.output):
                bmap[j] = io_ids[b.name]
            elif i == 0:
                bmap[j] = j
            else:
                bmap[j] = len(out.buffers)
                out.buffers.append(replace(b, name=f"v{i}/{b.name}"))
        kmap: dict[int, int] = {}
        for j, k in enumerate(p.kernels):
            entry, code = k.entry, k.code
            if entry in entries:
                if k.format not in _TEXT_FORMATS:
                    raise PlanError(f"by_dim: kernel entry {entry!r} repeats in a binary kernel")
                new = f"v{i}_{entry}"
                code = re.sub(rf"\b{re.escape(entry)}\b".encode(), new.encode(), bytes(code))
                entry = new
            entries.add(entry)
            kmap[j] = len(out.kernels)
            out.kernels.append(replace(k, name=f"v{i}/{k.name}" if i else k.name, entry=entry,
                                       code=code))  # fmt: skip
        upto = starts[i + 1] if i + 1 < len(starts) else None
        when = _condition(at, starts[i] if i else None, upto)
        index = {x.name: j for j, x in enumerate(p.dims)}
        for s in p.steps:
            # a step with a condition of its own (a part of the range its program chose
            # another kernel for) runs where both hold
            both = when if s.when is None else _both(s.when, when, index)
            out.steps.append(_moved(s, bmap, kmap, both))
        for w in p.weights:
            if isinstance(w, (InlineWeight, FileWeight)):
                out.weights.append(replace(w, buffer=bmap[w.buffer]))
    out.metadata = dict(first.metadata)
    ends = [*starts[1:], hi + 1]
    out.metadata["variants"] = f"{dim}: " + ", ".join(f"[{a}, {b})" for a, b in zip(starts, ends))
    return out


def _both(a: Expr, b: Postfix, index: dict[str, int]) -> Postfix:
    first = [(int(Op.CONST), a)] if isinstance(a, int) else a.to_postfix(index)
    prog = [*first, *b.to_postfix(index)]
    if b.program:
        prog.append((int(Op.MUL), 0))
    return Postfix(tuple((int(o), int(x)) for o, x in prog))


def _moved(s: Step, bmap: dict[int, int], kmap: dict[int, int], when: Postfix) -> Step:
    if isinstance(s, Launch):
        return replace(s, kernel=kmap[s.kernel], args=[bmap[a] for a in s.args], when=when)
    if isinstance(s, LibCall):
        return replace(s, fields=dict(s.fields), args=[bmap[a] for a in s.args], when=when)
    if isinstance(s, Copy):
        return replace(s, dst=bmap[s.dst], src=bmap[s.src], when=when)
    raise PlanError(f"by_dim: not a step: {s!r}")


__all__ = ["by_dim"]
