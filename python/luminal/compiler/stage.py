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


def strided_sum_operands(graph: Graph) -> dict[tuple[int, int], tuple[list[int], int]]:
    """(elementwise node id, source position) -> (the node's axes that read names, the summed
    axis): the operands of a summed product read through a div/mod split of the summed axis
    and shared across at least ``MIN_REUSE`` values of the other axes."""
    users: dict[int, list[Node]] = {}
    for n in graph.nodes:
        for s, _ in n.srcs:
            users.setdefault(s.id, []).append(n)
    out: dict[tuple[int, int], tuple[list[int], int]] = {}
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
                axes = [a for a in range(len(v.shape)) if f"_i{a}" in used]
                out[(c.id, j)] = (axes, r.arg)
    return out


Operand = tuple[int, int]  # (reading node id, source position) in the unstaged graph


def stage_strided_reads(
    graph: G, summed_major: frozenset[Operand] = frozenset(),
    copies: dict[int, Operand] | None = None,
) -> G:  # fmt: skip
    """A copy of ``graph`` in which each operand found by ``strided_sum_operands`` is first
    copied contiguously (the values its view reads, in the order of the reading node's axes;
    the operands in ``summed_major`` summed axis first: ``summed_major_operands``), then read
    from the copy. ``copies``, when given, receives copy node id -> operand. Returns ``graph``
    when there is none."""
    found = strided_sum_operands(graph)
    if not found:
        return graph

    def sources(g: Graph, n: Node, srcs: list[tuple[Node, View]]) -> list[tuple[Node, View]]:
        out = []
        for j, (s, v) in enumerate(srcs):
            if (n.id, j) not in found:
                out.append((s, v))
                continue
            axes, k = found[(n.id, j)]
            if (n.id, j) in summed_major:
                axes = [k] + [a for a in axes if a != k]
            copy, view = _staged(g, s, v, axes)
            if copies is not None:
                copies[copy.id] = (n.id, j)
            out.append((copy, view))
        return out

    g = graph.rebuilt(sources)
    g.verify()
    return g


def summed_major_operands(graph: Graph) -> frozenset[Operand]:
    """The staged operands whose source rows run along an output axis rather than along the
    summed one (a convolution's patches: the image is read along a row of outputs). Copied
    summed axis first, the copy's innermost loop reads and writes rows of the source where
    the row-order copy moves runs of kernel-width values, and the product reads the copy as a
    transposed operand. Which layout is faster depends on the product's
    shape and on the GEMM form that consumes it, so both are measured
    (``compiler/search/fusion.py``)."""
    nodes = {n.id: n for n in graph.nodes}
    out = set()
    for key, (axes, k) in strided_sum_operands(graph).items():
        v = nodes[key[0]].srcs[key[1]][1]
        if k in axes and _rows_along_output(v, axes, k):
            out.add(key)
    return frozenset(out)


def _staged(g: Graph, s: Node, v: View, axes: list[int]) -> tuple[Node, View]:
    """A contiguous copy of what ``v`` reads from ``s`` (``v``'s ``axes``, in order), and the
    view through which the reader reads the copy instead. An axis that ``v`` splits by a
    chain of divisors (k as (head, d)) is a loop per part in the copy, so the copy's
    reads are affine; its memory layout is that of the unsplit axes."""
    parts = [split_axis(v.index, f"_i{a}", v.shape[a]) for a in axes]
    while True:
        read = _read(v, axes, parts)
        last = parts[-1]
        inner = f"_i{sum(map(len, parts)) - 1}"
        if len(last) == 1 or not (sym.has_divmod(read.index, inner)
                                  or sym.has_divmod(read.valid, inner)):  # fmt: skip
            break
        # the innermost part is read through a division all the same (a conv's taps after a
        # 2x upsample: (tap + w) // 2): split off, it would only be a shorter loop
        last[-2:] = [(sym.mul(last[-2][0], last[-1][0]), last[-1][1])]
    copy = g.add_op(Op.CAST, [(s, read)], arg=s.dtype)
    outer = idx_vars(v.shape)
    index: Any = 0
    for a, st in zip(axes, contiguous_strides(tuple(v.shape[a] for a in axes))):
        index = sym.add(index, sym.mul(outer[a], st))
    return copy, View(tuple(v.shape), index)


def _read(v: View, axes: list[int], parts: list[list[tuple[sym.sint, sym.sint]]]) -> View:
    """``v`` over the copy's loops: ``axes`` walked by one loop per part of ``parts``."""
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
    return View(shape, sym.substitute(v.index, rename), sym.substitute(v.valid, rename))


def _rows_along_output(v: View, axes: list[int], k: int) -> bool:
    """Whether ``v`` walks its source in shorter steps along one of its output ``axes`` than
    the innermost loop over ``k`` is long: one row of the source then serves many outputs."""
    zero = {f"_i{b}": 0 for b in range(len(v.shape))}
    at0 = sym.substitute(v.index, zero)
    inner_k = split_axis(v.index, f"_i{k}", v.shape[k])[-1][0]
    if not isinstance(inner_k, int):
        return False
    for a in axes:
        if a == k:
            continue
        step = sym.as_int(sym.add(sym.substitute(v.index, {**zero, f"_i{a}": 1}), sym.mul(at0, -1)))
        if step is not None and 0 < abs(step) < inner_k:
            return True
    return False
