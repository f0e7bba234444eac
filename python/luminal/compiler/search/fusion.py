"""Fuse or store, by measurement.

Lowering inlines a cheap value into the kernel that reads it. When that kernel reads each
element several times through overlapping windows (a convolution's patches over a batch-normed,
activated, pooled map), the value is recomputed per read; storing it first costs a pass over
memory instead. Neither is right for every graph, so for each such value (``Lowered.windowed``)
both programs are built: the graph is lowered again with the value stored, the target's library
calls are chosen for it as for the first program, and the steps that differ between the two are
cut out and measured by the tuner like any other choice (checked against each other, cached on
disk). Cut-outs name their buffers after the graph (inputs by name, intermediates by node), so
both read the same random inputs and their common outputs are compared.
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
    choices) with each windowed value stored where the stored program measures faster."""
    stored: frozenset[int] = frozenset()
    dims = representative_dims(low)
    memo: dict[str, bool] = {}
    old_keys = _keys(low)
    for node in low.windowed:
        alt = finish(lower(graph, stored | {node}))
        new_keys = _keys(alt)
        old_set, new_set = set(old_keys), set(new_keys)
        gone = [s for s, key in zip(low.kernels, old_keys, strict=True) if key not in new_set]
        new = [s for s, key in zip(alt.kernels, new_keys, strict=True) if key not in old_set]
        if not gone or not new:
            continue
        fused, split = _cut(low, gone, "fused"), _cut(alt, new, "stored")
        key = f"{sub_fingerprint(fused)}|{sub_fingerprint(split)}"
        if key not in memo:
            cands = [
                Candidate("fused", fused, estimate(fused, dims, tuner.cost)),
                Candidate("stored", split, estimate(split, dims, tuner.cost)),
            ]
            name = f"{gone[-1].name}<-t{node}"
            memo[key] = tuner.choose(name, "fusion", dims, fused, cands).label == "stored"
        if memo[key]:
            low, stored, old_keys = alt, stored | {node}, new_keys
    return low


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


def _cut(low: Lowered, steps: Sequence[Step], side: str) -> Lowered:
    """``steps`` cut out, buffers named after the graph. What they write that nothing after
    them reads is named for ``side`` only: the two programs' scratch differs (a product
    flattened in one, not the other), and only what the rest of the program sees is compared."""
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
    return replace(sub, buffers=bufs)
