"""Staging strided operands of sums: a graph pass run before lowering.

A product summed over k (a matmul: broadcast multiply, then SUM_REDUCE) reads an operand that
does not depend on an output axis (the activation of a GEMV, shared by every weight row) once
per value of that axis. When the view it is read through splits k with div/mod (an attention
output stored head-major and read as (seq, heads * head_dim)), every one of those reads
recomputes the split: scalar index arithmetic per vector load in the generated kernel, and no
unit stride for a library call. Copying the operand once into a contiguous buffer (a few
hundred values for a GEMV) and reading that instead costs one small kernel.

The copy is an explicit same-dtype CAST: lowering never fuses one into its consumer (the
graph front end never makes an identity cast, so the node exists only to be materialized).
"""

from __future__ import annotations

from typing import Any, TypeVar

from ..graph import symbolic as sym
from ..graph.graph import Graph, Node
from ..graph.ops import ELEMENTWISE, Leaf, Op
from ..graph.view import View, contiguous_strides, idx_vars, split_axis

G = TypeVar("G", bound=Graph)

MIN_REUSE = 16  # stage an operand read at least this many times per element


def strided_sum_operands(graph: Graph) -> dict[tuple[int, int], list[int]]:
    """(elementwise node id, source position) -> the node's axes that read names: the
    operands of a summed product read through a div/mod split of the summed axis and shared
    across at least ``MIN_REUSE`` values of the other axes."""
    users: dict[int, list[Node]] = {}
    for n in graph.nodes:
        for s, _ in n.srcs:
            users.setdefault(s.id, []).append(n)
    out: dict[tuple[int, int], list[int]] = {}
    for r in graph.nodes:
        if r.op is not Op.SUM_REDUCE:
            continue
        c, vr = r.srcs[0]
        if c.op not in ELEMENTWISE or len(users.get(c.id, [])) != 1:
            continue
        if vr != View.contiguous(c.shape):
            continue
        k = f"_i{r.arg}"
        for j, (s, v) in enumerate(c.srcs):
            if s.op in (Leaf.CONSTANT, Op.IOTA) or (s.op is Leaf.INPUT and s.arg[1]):
                continue  # constants fold; weights are repacked when the plan is built
            if not sym.has_divmod(v.index, k):
                continue
            used = sym.var_names(v.index) | sym.var_names(v.valid)
            reuse = 1
            for a, ext in enumerate(v.shape):
                if f"_i{a}" not in used:
                    reuse *= max(sym.lower_bound(ext), 1)
            if reuse >= MIN_REUSE:
                out[(c.id, j)] = [a for a in range(len(v.shape)) if f"_i{a}" in used]
    return out


def stage_strided_reads(graph: G) -> G:
    """A copy of ``graph`` in which each operand found by ``strided_sum_operands`` is first
    copied contiguously (the values its view reads, in the order of the reading node's axes),
    then read from the copy. Returns ``graph`` when there is none."""
    found = strided_sum_operands(graph)
    if not found:
        return graph

    def sources(g: Graph, n: Node, srcs: list[tuple[Node, View]]) -> list[tuple[Node, View]]:
        return [_staged(g, s, v, found[(n.id, j)]) if (n.id, j) in found else (s, v)
                for j, (s, v) in enumerate(srcs)]  # fmt: skip

    g = graph.rebuilt(sources)
    g.verify()
    return g


def _staged(g: Graph, s: Node, v: View, axes: list[int]) -> tuple[Node, View]:
    """A contiguous copy of what ``v`` reads from ``s`` (``v``'s ``axes``, in order), and the
    view through which the reader reads the copy instead. An axis that ``v`` splits by a
    chain of divisors (k as (head, d)) is a loop per part in the copy, so the copy's
    reads are affine; its memory layout is that of the unsplit axes."""
    parts = [split_axis(v.index, f"_i{a}", v.shape[a]) for a in axes]
    shape = tuple(ext for ps in parts for ext, _ in ps)
    inner = idx_vars(shape)
    rename: dict[str, Any] = {}
    j = 0
    for a, ps in zip(axes, parts):
        e: Any = 0
        for _, mult in ps:
            e = sym.add(e, sym.mul(inner[j], mult))
            j += 1
        rename[f"_i{a}"] = e
    read = View(shape, sym.substitute(v.index, rename), sym.substitute(v.valid, rename))
    copy = g.add_op(Op.CAST, [(s, read)], arg=s.dtype)
    outer = idx_vars(v.shape)
    index: Any = 0
    for a, st in zip(axes, contiguous_strides(tuple(v.shape[a] for a in axes))):
        index = sym.add(index, sym.mul(outer[a], st))
    return copy, View(tuple(v.shape), index)
