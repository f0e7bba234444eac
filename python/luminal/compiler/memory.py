"""The memory planner: pack scratch buffers into one arena by lifetime.

Sizes are symbolic, so offsets are too. Buffers go into *slots*; a slot is reused by a later
buffer once every step that reads its current tenant has run (never by a buffer written in
the same step that reads it). A slot is as large as the largest tenant (a symbolic max
where sizes cannot be compared), and slot offsets are prefix sums of 64-byte aligned sizes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..graph import symbolic as sym
from ..graph.symbolic import sint

ALIGN = 64


@dataclass
class MemoryPlan:
    offsets: dict[int, sint]  # buffer id -> byte offset in the arena
    arena_bytes: sint
    slots: int  # number of distinct regions (the peak number of live scratch buffers)


def _aligned(n: sint) -> sint:
    return sym.mul(sym.ceildiv(n, ALIGN), ALIGN)


def _fits(small: sint, big: sint) -> bool:
    return small is big or small == big or sym.prove_nonneg(sym.add(big, sym.mul(small, -1)))


def plan_memory(
    sizes: Mapping[int, sint], steps: Sequence[tuple[Sequence[int], Sequence[int]]]
) -> MemoryPlan:
    """``sizes``: scratch buffer id -> bytes. ``steps``: (writes, reads) buffer ids per step in
    execution order (ids not in ``sizes`` are ignored)."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, (writes, reads) in enumerate(steps):
        for b in list(writes) + list(reads):
            if b in sizes:
                first.setdefault(b, i)
                last[b] = i
    slot_size: list[sint] = []
    slot_free_after: list[int] = []  # step index after which the slot is free again
    slot_of: dict[int, int] = {}
    for b in sorted(first, key=lambda b: (first[b], b)):
        start, size = first[b], _aligned(sizes[b])
        free = [s for s in range(len(slot_size)) if slot_free_after[s] < start]
        exact = [s for s in free if _fits(size, slot_size[s])]
        if exact:
            s = min(exact, key=lambda s: sym.upper_bound(slot_size[s]))
        elif free:
            s = max(free, key=lambda s: sym.upper_bound(slot_size[s]))
            slot_size[s] = sym.maximum(slot_size[s], size)
        else:
            s = len(slot_size)
            slot_size.append(size)
            slot_free_after.append(-1)
        slot_of[b] = s
        slot_free_after[s] = last[b]
    offsets_of_slot: list[sint] = []
    acc: sint = 0
    for sz in slot_size:
        offsets_of_slot.append(acc)
        acc = sym.add(acc, sz)
    return MemoryPlan({b: offsets_of_slot[s] for b, s in slot_of.items()}, acc, len(slot_size))
