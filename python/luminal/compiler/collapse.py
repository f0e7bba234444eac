"""Adjacent symbolic dims a kernel only reads as one index merged into one loop.

A batch of sequences gives kernels of shape (batch, seq, n) whose every index reads the two
outer dims as ``batch_i * seq + seq_i``: one dim of batch x seq rows, split in two loops.
Split, a schedule that blocks rows (a row jam, a register block) can block only one of them,
chosen at compile time, and one batch of one sentence or many one-token sequences leaves it a
block of one. Merged, the block runs over rows whatever their split at run time, and a GEMM
match sees one row dim.

Only pairs of symbolic outer dims are merged (dims whose size is known at compile time can be
scheduled for as they are), and only where nothing reads the merged index through a division
or modulo (an index of ``seq`` alone: a position embedding, a mask row): the layout written is
the same, contiguous rows of the merged dim.
"""

from __future__ import annotations

from dataclasses import fields, replace

from ..graph import symbolic as sym
from . import kernel_ir as K
from .lower import Lowered


def collapse_dims(low: Lowered) -> Lowered:
    """``low`` with each kernel's mergeable dims merged (``collapse``)."""
    return replace(low, kernels=[collapse(k) if isinstance(k, K.Kernel) else k
                                 for k in low.kernels])  # fmt: skip


def collapse(k: K.Kernel) -> K.Kernel:
    """``k`` with every pair of adjacent symbolic outer dims it reads as one index merged,
    outermost first, until none is left."""
    while True:
        merged = next((m for d in range(len(k.shape) - 2) if (m := _merged(k, d)) is not None),
                      None)  # fmt: skip
        if merged is None:
            return k
        k = merged


def _merged(k: K.Kernel, d: int) -> K.Kernel | None:
    """``k`` with dims ``d`` and ``d + 1`` as one, or None where they cannot be."""
    a, b = k.shape[d], k.shape[d + 1]
    if k.scatter_row is not None or not (isinstance(a, sym.Expr) and isinstance(b, sym.Expr)):
        return None
    shape = (*k.shape[:d], sym.mul(a, b), *k.shape[d + 2 :])
    q = sym.index_var(d, shape[d])
    assert isinstance(q, sym.Expr)
    mapping: dict[str, sym.sint] = {f"_i{d}": sym.floordiv(q, b), f"_i{d + 1}": sym.mod(q, b)}
    for j in range(d + 2, len(k.shape)):
        mapping[f"_i{j}"] = sym.index_var(j - 1, k.shape[j])
    value = K.substitute(k.value, mapping)
    if any(sym.has_divmod(e, q.name) for e in _exprs(value)):
        return None
    return replace(k, shape=shape, value=value)


def _exprs(v: K.Value):
    """Every symbolic expression the tree holds (indexes, masks, extents)."""
    for x in K.walk(v):
        for f in fields(x):
            e = getattr(x, f.name)
            if isinstance(e, sym.Expr):
                yield e
                if e.kind == sym.VAR:
                    yield from (a for a in e.args if isinstance(a, sym.Expr))
