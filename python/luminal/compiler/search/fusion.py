"""Fuse or store, and the layout of staged copies, by measurement.

Lowering inlines a cheap value into the kernel that reads it. When that kernel reads each
element several times through overlapping windows (a convolution's patches over a batch-normed,
activated, pooled map), the value is recomputed per read; storing it first costs a pass over
memory instead. Neither is right for every graph, so for each such value (``Lowered.windowed``)
both programs are built: the graph is lowered again with the value stored, the target's library
calls are chosen for it as for the first program, and the steps that differ between the two are
cut out and measured by the tuner like any other choice (checked against each other, cached on
disk). Cut-outs name their buffers after the graph (inputs by name, intermediates by node), so
both read the same random inputs and their common outputs are compared.

Staged copies of a product's strided operand (``compiler/stage.py``) are chosen the same way:
copied in the product's row order or summed axis first.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import replace

from ...graph.graph import Graph
from .. import kernel_ir as K
from ..lower import Lowered, lower
from .cost import estimate
from .select import representative_dims, subprogram
from .tuner import Candidate, Tuner, sub_fingerprint

Step = K.Kernel | K.LibCall


def choose_fusions(
    graph: Graph, low: Lowered, tuner: Tuner, finish: Callable[[Lowered], Lowered]
) -> Lowered:
    """``low`` (lowered from ``graph`` and passed through ``finish``, the later lowered-program
    choices) with each windowed value stored where the stored program measures faster.

    The graph is lowered once more with every windowed value stored. The steps that differ
    between the two programs fall into groups joined by the buffers they share (a value's
    producer and the convolutions reading it); each group is measured both ways and its values
    stored where that is faster. Lowering and choosing library calls once per value instead
    cost MobileNetV2's compile 10 of its 17 s (17 values)."""
    if not low.windowed:
        return low
    every = frozenset(low.windowed)
    alt = finish(lower(graph, every))
    chosen = choose_groups(low, alt, tuner, every, "fusion", ("fused", "stored"))
    if not chosen:
        return low
    return alt if chosen == every else finish(lower(graph, frozenset(chosen)))


def choose_layouts(
    low: Lowered, alt: Lowered, copies: dict[int, tuple[int, int]], tuner: Tuner
) -> set[tuple[int, int]]:
    """The staged operands (``compiler/stage.py``) to copy summed axis first: ``alt`` is the
    program with every operand of ``copies`` (copy node id -> operand) so copied, ``low`` the
    one with none; each group of differing steps (a copy and the products reading it) is
    measured both ways."""
    chosen = choose_groups(low, alt, tuner, frozenset(copies), "layout", ("rows", "columns"))
    return {copies[c] for c in chosen}


def choose_groups(
    low: Lowered, alt: Lowered, tuner: Tuner, owners: frozenset[int], kind: str,
    labels: tuple[str, str], weights: bool = False,
) -> set[int]:  # fmt: skip
    """Of ``owners`` (node ids whose buffers ``alt`` writes differently from ``low``), those
    whose group of differing steps measures faster as in ``alt``. Groups are joined by the
    buffers their steps share; a model's repeated layers are measured once. With
    ``weights``, the cut-outs read the programs' weights as they are (``alt`` may store a
    weight in another layout, under another name) instead of random values."""
    old_keys, new_keys = _keys(low), _keys(alt)
    old_set, new_set = set(old_keys), set(new_keys)
    gone = _with_scratch_readers(
        low, [s for s, key in zip(low.kernels, old_keys, strict=True) if key not in new_set]
    )
    new = _with_scratch_readers(
        alt, [s for s, key in zip(alt.kernels, new_keys, strict=True) if key not in old_set]
    )
    dims = representative_dims(low)
    chosen: set[int] = set()
    memo: dict[str, bool] = {}
    for old_steps, new_steps in _groups(low, gone, alt, new):
        mine = {n for n in owners if f"t{n}" in _written(alt, new_steps)}
        if not mine or not old_steps:
            continue
        a = _cut(low, old_steps, labels[0], weights)
        b = _cut(alt, new_steps, labels[1], weights)
        key = f"{sub_fingerprint(a)}|{sub_fingerprint(b)}"
        if key not in memo:
            cands = [
                Candidate(labels[0], a, estimate(a, dims, tuner.cost)),
                Candidate(labels[1], b, estimate(b, dims, tuner.cost)),
            ]
            name = f"{old_steps[-1].name}<-" + ",".join(f"t{n}" for n in sorted(mine))
            memo[key] = tuner.choose(name, kind, dims, a, cands).label == labels[1]
        if memo[key]:
            chosen |= mine
    return chosen


def _with_scratch_readers(low: Lowered, changed: list[Step]) -> list[Step]:
    """``changed`` with the steps of ``low`` that read scratch one of them writes, in program
    order: a library call both programs have (the same product of a copy) reads each
    program's own copy, and only through what it writes do the two sides' groups meet. A
    convolution split by range (a generated kernel for small sizes, copy + product for
    large) had its parts measured apart from the producer they read and compared with
    unlike cut-outs."""
    mine = {id(s) for s in changed}
    scratch = {b for s in changed for b in K.step_buffers(s)[0]
               if _stable(low.buffers[b].name) != low.buffers[b].name}  # fmt: skip
    return [s for s in low.kernels if id(s) in mine or scratch & set(K.step_buffers(s)[1])]


def _names(low: Lowered, step: Step) -> set[str]:
    return {_stable(low.buffers[b].name) for bs in K.step_buffers(step) for b in bs}


def _written(low: Lowered, steps: Sequence[Step]) -> set[str]:
    return {_stable(low.buffers[b].name) for s in steps for b in K.step_buffers(s)[0]}


def _groups(
    old: Lowered, gone: Sequence[Step], new_low: Lowered, new: Sequence[Step]
) -> list[tuple[list[Step], list[Step]]]:
    """The differing steps of the two programs (``gone`` from ``old``, ``new`` from
    ``new_low``) in groups joined by a buffer name any two of them share that one of them
    writes, each group's steps in program order."""

    def names(low: Lowered, s: Step, side: int, written_only: bool = False) -> set[str]:
        # a kernel's scratch (named after its kernel, whose number differs between the
        # programs) joins only its own side's steps
        out = set()
        for bs in K.step_buffers(s)[:1] if written_only else K.step_buffers(s):
            for b in bs:
                raw = low.buffers[b].name
                out.add(f"{side}:{raw}" if _stable(raw) != raw else raw)
        return out

    # joined through what one of them writes: inputs many steps only read (the image, a
    # buffer of dims-derived scalars) would join unrelated layers into one group
    written = {n for s in gone for n in names(old, s, 0, True)}
    written |= {n for s in new for n in names(new_low, s, 1, True)}
    steps = [(0, s, names(old, s, 0) & written) for s in gone]
    steps += [(1, s, names(new_low, s, 1) & written) for s in new]
    parent = list(range(len(steps)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[str, int] = {}
    for i, (_, _, joins) in enumerate(steps):
        for n in joins:
            if n in owner:
                parent[root(i)] = root(owner[n])
            else:
                owner[n] = i
    groups: dict[int, tuple[list[Step], list[Step]]] = {}
    for i, (side, s, _) in enumerate(steps):
        groups.setdefault(root(i), ([], []))[side].append(s)
    return list(groups.values())


def _stable(name: str) -> str:
    # kernel numbers shift when a kernel is added: scratch named after kernels drop them
    return re.sub(r"^k\d+_", "", name)


def _keys(low: Lowered) -> list[str]:
    """Per step: what it computes from which buffers, independent of ids and kernel numbers."""
    out = []
    for s in low.kernels:
        sub = subprogram(low, [s])
        names = ",".join(_stable(low.buffers[int(b.name[1:])].name) for b in sub.buffers)
        out.append(f"{sub_fingerprint(sub)}|{names}")
    return out


def _cut(low: Lowered, steps: Sequence[Step], side: str, weights: bool = False) -> Lowered:
    """``steps`` cut out, buffers named after the graph. What they write that nothing after
    them reads is named for ``side`` only: the two programs' scratch differs (a product
    flattened in one, not the other), and only what the rest of the program sees is compared.
    With ``weights``, the weights it reads come along (``random_inputs`` takes them)."""
    sub = subprogram(low, steps)
    inside = {id(s) for s in steps}
    read_after = {b for s in low.kernels if id(s) not in inside for b in K.step_buffers(s)[1]}
    bufs, seen = [], set()
    for b in sub.buffers:
        full = low.buffers[int(b.name[1:])]
        name = _stable(full.name)
        if b.role == "output" and full.role not in ("output",) and full.id not in read_after:
            name = f"{side}:{name}"
        while name in seen:
            name += "'"
        seen.add(name)
        bufs.append(replace(b, name=name))
    held = {}
    if weights:
        held = {
            b.name: low.weights[full.name]
            for b, full in zip(bufs, (low.buffers[int(x.name[1:])] for x in sub.buffers),
                               strict=True)
            if full.role == "weight" and full.name in low.weights
        }  # fmt: skip
    return replace(sub, buffers=bufs, weights=held)
