"""Values computed in the order their readers walk them.

A value every reader takes through one permutation of its axes (a convolution's output read
channels-last by the layer norm after it, as in ConvNeXt) can be computed in that order:
an elementwise op reads its sources through the same permutation, a reduction its source
through the permutation of the axes it keeps, and the readers then read it as it lies. Where
that pays (the value's kernel walks its own sources along the new innermost axis; its
readers' loads become unit-stride) and where it does not (the kernel's stores or loads become
strided instead) depends on the kernels around it, so the search measures both programs
(pipeline stage "store_order"). The rewrite keeps every node's id: the graph is rebuilt in
the order its nodes were made.
"""

from __future__ import annotations

from itertools import permutations

import numpy as np

from ..graph import symbolic as sym
from ..graph.graph import Graph, Node, Src
from ..graph.ops import ELEMENTWISE, REDUCE, Leaf, Op
from ..graph.view import View
from .fold import last_step, repacked_values, repacked_view

# values of higher rank are left as they are: the permutations of their axes are enumerated
# (720 at rank 6, a grouped convolution's product)
MAX_RANK = 6


def _reduce_order(n: Node, order: tuple[int, ...]) -> tuple[int, ...]:
    """The permutation of a reduction's source axes that puts its kept axes in ``order`` with
    the summed axis just before the last one: the source's innermost axis is then the one the
    result's kernel runs along (its vector lanes), which is the axis a weight the source reads
    is stored along (``_packed_reads``)."""
    kept = [k for k in range(len(n.shape) + 1) if k != n.arg]
    moved = [kept[o] for o in order]
    return (*moved[:-1], n.arg, *moved[-1:])


def _through(n: Node, order: tuple[int, ...] | None, view: View) -> View:
    """The view node ``n`` reads a source through once ``n`` itself is computed in ``order``
    (None: as it is)."""
    if order is None:
        return view
    if n.op in REDUCE:
        return view.permute(_reduce_order(n, order))
    return view.permute(order)


def _as_permuted(shape: tuple, view: View) -> tuple[int, ...] | None:
    """The permutation P (not the identity) with ``view`` equal to the contiguous layout of
    ``shape`` permuted by P, size-1 axes dropped or added (a grouped convolution's group
    axis), or None."""
    if view.valid != 1 or not 2 <= len(shape) <= MAX_RANK:
        return None
    wide = [s for s in shape if s != 1]
    if sorted(map(str, wide)) != sorted(str(s) for s in view.shape if s != 1):
        return None
    base = View.contiguous(shape)
    if _read_as(base, view.shape) == view:
        return None  # read as it lies
    for order in permutations(range(len(shape))):
        moved = [o for o in order if shape[o] != 1]
        if moved == sorted(moved) or [shape[o] for o in moved] != [s for s in view.shape if s != 1]:
            continue  # the layout as it is (size-1 axes moved), or another shape
        if _read_as(base.permute(order), view.shape) == view:
            return order
    return None


def _read_as(view: View, shape: tuple) -> View:
    """``view`` with size-1 axes dropped or added to take ``shape``."""
    return view if tuple(view.shape) == tuple(shape) else view.reshape(shape)


def permutable(graph: Graph, only: frozenset[int] | None = None) -> dict[int, tuple[int, ...]]:
    """Node id -> the axis order to compute it in, for each elementwise or reducing node
    (of ``only``, when given) whose readers all read it through one permutation, counting
    the readers that are themselves computed permuted."""
    readers: dict[int, list[tuple[Node, View]]] = {}
    for n in graph.nodes:
        for s, v in n.srcs:
            readers.setdefault(s.id, []).append((n, v))
    order: dict[int, tuple[int, ...]] = {}
    for n in reversed(graph.nodes):  # readers before the nodes they read
        if not isinstance(n.op, Op) or not (n.op in ELEMENTWISE or n.op in REDUCE):
            continue
        if only is not None and n.id not in only:
            continue
        seen: tuple[int, ...] | None = None
        for r, v in readers.get(n.id, []):
            if r.op is Leaf.OUTPUT and r.graph.state.get(r.arg) is not None:
                seen = None  # an in-place update writes the input as it lies
                break
            got = _as_permuted(n.shape, _through(r, order.get(r.id), v))
            if got is None or (seen is not None and got != seen):
                seen = None
                break
            seen = got
        # an order that keeps the innermost axis keeps each row as it is (attention's heads
        # regrouped around rows of head_dim): the kernels would walk memory alike, and the
        # search would relower the whole program to find that out
        if seen is not None and _innermost(n.shape, seen) != _innermost(n.shape, None):
            order[n.id] = seen
    return order


def _innermost(shape: tuple, order: tuple[int, ...] | None) -> int:
    """The last axis of size other than 1 of ``shape`` laid out in ``order``."""
    axes = [o for o in (order or range(len(shape))) if shape[o] != 1]
    return axes[-1] if axes else -1


def _packed_reads(
    graph: Graph, order: dict[int, tuple[int, ...]]
) -> dict[int, tuple[str, np.ndarray, View]]:
    """Weight input id -> (name, values, view) for each float weight that one permuted
    elementwise node reads, once and whole, with a stride along that node's innermost axis:
    stored in the node's axis order instead (as ``fold.py`` does for the graph as built), so
    the loads along the kernel's lanes are contiguous."""
    reads: dict[int, list[tuple[Node, View]]] = {}
    for n in graph.nodes:
        for src, v in n.srcs:
            if src.op is Leaf.INPUT and src.arg[1] and src.arg[0] in graph.weights:
                reads.setdefault(src.id, []).append((n, v))
    taken = set(graph.inputs)
    out: dict[int, tuple[str, np.ndarray, View]] = {}
    for wid, rs in reads.items():
        n, v = rs[0]
        if len(rs) != 1 or n.id not in order or n.op not in ELEMENTWISE:
            continue
        v = _through(n, order[n.id], v)
        used = [int(x[2:]) for x in sym.var_names(v.index) if x.startswith("_i")]
        w = np.asarray(graph.weights[graph.nodes[wid].arg[0]])
        elems = 1
        for k in used:
            elems *= sym.as_int(v.shape[k]) or 0  # 0: a symbolic size, not repacked
        if v.valid != 1 or w.dtype.kind != "f" or w.ndim < 2:
            continue
        if len(v.shape) - 1 not in used or last_step(v) == 1:
            continue
        if elems != w.size:
            continue  # the whole weight, each element once: the copy replaces it
        base = str(graph.nodes[wid].arg[0]).split("#")[0] + "#packed"
        name, k = base, 1
        while name in taken:
            k += 1
            name = f"{base}{k}"
        taken.add(name)
        out[wid] = (name, repacked_values(w, v), repacked_view(v))
    return out


def permuted(graph: Graph, order: dict[int, tuple[int, ...]]) -> Graph:
    """``graph`` with each node of ``order`` computed in its axis order (``permutable``) and
    read as it lies. Every node keeps its id; returns ``graph`` itself when a node would not
    (two nodes that the rewrite makes the same)."""
    if not order:
        return graph
    packed = _packed_reads(graph, order)
    g = type(graph)(graph.name)
    new: dict[int, Node] = {}
    for n in graph.nodes:
        if n.op is Leaf.INPUT:
            name, weight = n.arg
            if n.id in packed:  # replaced in place: the nodes after it keep their ids
                name, values, _ = packed[n.id]
                made = g.add_input(name, values.shape, n.dtype, weight=True)
                g.weights[name] = values
            else:
                made = g.add_input(name, n.shape, n.dtype, weight=weight)
                if name in graph.weights:
                    g.weights[name] = graph.weights[name]
        else:
            srcs: list[Src] = []
            for s, v in n.srcs:
                v = _through(n, order.get(n.id), v)
                if s.id in order:  # the readers' view, checked by permutable: as it lies
                    v = _read_as(View.contiguous(tuple(s.shape[o] for o in order[s.id])), v.shape)
                elif s.id in packed:
                    v = packed[s.id][2]
                srcs.append((new[s.id], v))
            up = graph.state.get(n.arg) if n.op is Leaf.OUTPUT else None
            if n.op in REDUCE and n.id in order:
                made = g.add_op(n.op, srcs, arg=len(n.shape) - 1)  # _reduce_order's axis
            else:
                made = g.add_like(n, srcs, updates=up)
        if made.id != n.id:
            return graph
        new[n.id] = made
    g.state = dict(graph.state)
    return g
