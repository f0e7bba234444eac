"""Sibling products: a graph pass that merges sums of products sharing one operand.

Projections of one activation by several constant weights (attention's q, k and v; an MLP's
gate and up) are separate matmuls: ``sum_k A[.., k] * W_i[n, k]``. Stacking the weights along
``n`` makes them one matmul whose output holds each result as a slice: one GEMM of N = N_1 +
N_2 + ... instead of several narrow ones (a narrow GEMM packs the shared operand again and runs
below the library's efficiency), and one kernel launch. Every output value is the same sum
over the same k, so results are unchanged. Premises: each product is an elementwise multiply
read whole by one SUM_REDUCE; the shared operand is the same node through the same view and
does not vary along the weight's row axis; each weight is an f32 weight with data, read
row-major as ``W[n, k]`` (n the product's row axis, k the summed one) whatever its shape.

A node that reads two slices of the merged product (silu(gate) * up) cannot be a library
call's epilogue. Lowering stores it when the next product would compute it again per output
column (a SiLU's exp); a cheap one is fused into that product as its operand, and the gemm
search's copy alternative (``search/gemm.py::match_gemm_copy``) computes it into a scratch
buffer before that product's GEMM. ``LUMINAL_SIBLINGS=0`` skips the pass.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, TypeVar

import numpy as np

from ..graph import dtypes as dt
from ..graph import symbolic as sym
from ..graph.graph import Graph, Node
from ..graph.ops import Leaf, Op
from ..graph.view import View, contiguous_strides, idx_vars

G = TypeVar("G", bound=Graph)


def _match(graph: Graph, r: Node, users: dict[int, list[Node]]) -> tuple[Any, int] | None:
    """(group key, index of the weight source in the multiply) for a sum that qualifies."""
    if r.op is not Op.SUM_REDUCE:
        return None
    m, vr = r.srcs[0]
    if m.op is not Op.MUL or len(users.get(m.id, [])) != 1 or vr != View.contiguous(m.shape):
        return None
    a = r.arg
    if len(m.shape) < 2:
        return None
    p = len(m.shape) - 2 if a == len(m.shape) - 1 else None
    if p is None or m.dtype is not dt.f32:
        return None
    for w_pos in (0, 1):
        (w, vw), (x, vx) = m.srcs[w_pos], m.srcs[1 - w_pos]
        if w.op is not Leaf.INPUT or not w.arg[1] or w.arg[0] not in graph.weights:
            continue
        if w.dtype is not dt.f32 or vw.valid != 1:
            continue
        n_ext, k_ext = m.shape[p], m.shape[a]
        if not isinstance(n_ext, int) or not isinstance(k_ext, int):
            continue
        if int(np.asarray(graph.weights[w.arg[0]]).size) != n_ext * k_ext:
            continue  # read row-major as (n, k) whatever shape it was given
        if vw.index != sym.add(sym.mul(idx_vars(m.shape)[p], k_ext), idx_vars(m.shape)[a]):
            continue
        if f"_i{p}" in sym.var_names(vx.index) | sym.var_names(vx.valid):
            continue  # the shared operand must not vary along the weight's rows
        rest = tuple(s for j, s in enumerate(m.shape) if j != p)
        return (x.id, vx.index, vx.valid, rest, p, a, w_pos), w_pos
    return None


def merge_sibling_products(graph: G) -> G:
    """A copy of ``graph`` with each group of qualifying sibling sums merged into one (its
    weights stacked into a new weight ``<first>#stacked``), or ``graph`` when none."""
    users: dict[int, list[Node]] = defaultdict(list)
    for n in graph.nodes:
        for s, _ in n.srcs:
            users[s.id].append(n)
    groups: dict[Any, list[Node]] = defaultdict(list)
    for n in graph.nodes:
        hit = _match(graph, n, users)
        if hit is not None:
            groups[hit[0]].append(n)
    groups = {k: v for k, v in groups.items() if len(v) >= 2}
    if not groups:
        return graph
    g = type(graph)(graph.name)
    new: dict[int, Node] = {}
    taken = set(graph.inputs)
    stacked_of: dict[int, tuple[Node, int]] = {}  # sum id -> (merged sum, row offset)
    pending = {r.id: key for key, rs in groups.items() for r in rs}
    merged_muls = {r.srcs[0][0].id for r in (x for rs in groups.values() for x in rs)}
    # the operands of merged products: stacked weights, and the shared ones (kept as they are)
    stacked = {r.srcs[0][0].srcs[k[-1]][0].id for k, rs in groups.items() for r in rs}
    shared = {r.srcs[0][0].srcs[1 - k[-1]][0].id for k, rs in groups.items() for r in rs}
    for name, n in graph.inputs.items():
        if n.id in stacked and n.id not in shared and all(u.id in merged_muls
                                                          for u in users[n.id]):  # fmt: skip
            continue  # a weight read only by merged products: its rows are in the stack
        new[n.id] = g.add_input(name, n.shape, n.dtype, weight=n.arg[1])
        if name in graph.weights:
            g.weights[name] = graph.weights[name]
    for n in graph.toposort():
        if n.id in new or n.op is Leaf.INPUT:
            continue
        if n.id in pending and n.id not in stacked_of:
            key = pending[n.id]
            _merge(graph, g, groups[key], key[-1], new, taken, stacked_of)
        if n.id in stacked_of:
            continue
        if n.id in merged_muls:
            continue  # a merged product: nothing reads it any more
        srcs = [_read(s, v, new, stacked_of) for s, v in n.srcs]
        up = graph.state.get(n.arg) if n.op is Leaf.OUTPUT else None
        new[n.id] = g.add_like(n, srcs, updates=up)
    g.verify()
    return g


def _merge(
    graph: Graph,
    g: Graph,
    rs: list[Node],
    w_pos: int,
    new: dict[int, Node],
    taken: set[str],
    stacked_of: dict[int, tuple[Node, int]],
) -> None:
    m0 = rs[0].srcs[0][0]
    x, vx = m0.srcs[1 - w_pos]
    ws = [r.srcs[0][0].srcs[w_pos][0] for r in rs]
    k_ext = m0.shape[rs[0].arg]
    rows = [np.asarray(graph.weights[w.arg[0]]).reshape(-1, k_ext) for w in ws]
    data = np.concatenate(rows, axis=0)
    base, k = str(ws[0].arg[0]).split("#")[0] + "#stacked", 1
    name = base
    while name in taken:
        k += 1
        name = f"{base}{k}"
    taken.add(name)
    leaf = g.add_input(name, data.shape, dt.f32, weight=True)
    g.weights[name] = np.ascontiguousarray(data)
    a, p = rs[0].arg, len(m0.shape) - 2
    shape = list(m0.shape)
    shape[p] = int(data.shape[0])
    iv = idx_vars(shape)
    wv = View(tuple(shape), sym.add(sym.mul(iv[p], int(data.shape[1])), iv[a]))
    xs = View(tuple(shape), vx.index, vx.valid)  # does not name the row axis (checked)
    # the shared operand may itself be a merged sum (a DFT's cos and sin products feeding the
    # next axis's pair): read through its slice of the stack
    srcs = [_read(x, xs, new, stacked_of), (leaf, wv)]
    if w_pos == 0:
        srcs.reverse()
    mul = g.add_op(Op.MUL, srcs)
    merged = g.add_op(Op.SUM_REDUCE, [(mul, View.contiguous(mul.shape))], arg=a)
    off = 0
    for r, part in zip(rs, rows, strict=True):
        stacked_of[r.id] = (merged, off)
        off += part.shape[0]


def _read(
    s: Node, v: View, new: dict[int, Node], stacked_of: dict[int, tuple[Node, int]]
) -> tuple[Node, View]:
    """A read of ``s`` through ``v``; of a merged sum, the same values in its slice."""
    if s.id not in stacked_of:
        return new[s.id], v
    merged, off = stacked_of[s.id]
    p = len(s.shape) - 1  # the row axis of the sum's output (the summed axis was last)
    strides = contiguous_strides(s.shape)
    mstrides = contiguous_strides(merged.shape)
    index: Any = 0
    for j, (st, ext) in enumerate(zip(strides, s.shape)):
        coord = sym.mod(sym.floordiv(v.index, st), ext)
        if j == p:
            coord = sym.add(coord, off)
        index = sym.add(index, sym.mul(coord, mstrides[j]))
    return merged, View(v.shape, index, v.valid)
