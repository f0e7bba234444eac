"""bf16 products: a graph pass that computes products by weights with bf16 operands and f32
sums (opt-in: ``LUMINAL_MATMUL_PRECISION=bf16``, PyTorch's ``set_float32_matmul_precision
("medium")`` for the weights' products).

Each product by a weight (a ``SUM_REDUCE`` of a ``MUL`` one of whose operands is an f32 or
bf16 weight) gets both operands rounded to bf16, nearest even: the activation as a cast in
the graph (computed once per element, not once per weight row it meets), an f32 weight as a
new bf16 weight rounded at compile time (half the bytes in the plan; a weight without data
yet is rounded in the graph instead). The product of two bf16 values is exact in f32, so the
graph's value is the f32 sum of exact products: the reference interpreter defines it, and a
GEMM of bf16 operands (a target's bf16 dot-product instructions or matrix units) computes it
up to summation order. Products of two activations (attention's scores and mixing) and by
block-quantized weights keep their numerics.
"""

from __future__ import annotations

from typing import TypeVar

import ml_dtypes
import numpy as np

from .. import flags
from ..graph import dtypes as dt
from ..graph.graph import Graph, Node
from ..graph.ops import Leaf, Op
from ..graph.view import View
from .fold import _fresh
from .products import sum_products

G = TypeVar("G", bound=Graph)

MODES = ("", "f32", "bf16")


def mode() -> str:
    """``LUMINAL_MATMUL_PRECISION`` checked: ``bf16`` or empty (``f32`` reads as empty)."""
    m = flags.MATMUL_PRECISION.choice(MODES, "bf16, or f32 / empty for f32 products")
    return "" if m == "f32" else m


def _weight_leaf(n: Node) -> Node | None:
    """The weight ``n`` is, as f32: an f32 weight, or a bf16 weight widened to f32."""
    if n.op is Leaf.INPUT and n.arg[1] and n.dtype is dt.f32:
        return n
    if n.op is Op.CAST and n.dtype is dt.f32:
        s, v = n.srcs[0]
        if s.op is Leaf.INPUT and s.arg[1] and s.dtype is dt.bf16 and v == View.contiguous(s.shape):
            return s
    return None


def _activation(n: Node) -> bool:
    """An f32 operand that is neither a weight nor a bf16 value widened already."""
    if n.dtype is not dt.f32 or (n.op is Leaf.INPUT and n.arg[1]):
        return False
    return not (n.op is Op.CAST and n.srcs[0][0].dtype is dt.bf16)


def round_products(graph: G) -> G:
    """A copy of ``graph`` in which every product by an f32 or bf16 weight reads both operands
    rounded to bf16; ``graph`` itself when ``LUMINAL_MATMUL_PRECISION`` is not bf16 or no
    product qualifies."""
    if mode() != "bf16":
        return graph
    found: dict[int, int] = {}  # multiply id -> position of its weight operand
    for _, c in sum_products(graph):
        for j in (0, 1):
            if _weight_leaf(c.srcs[j][0]) is not None and _activation(c.srcs[1 - j][0]):
                found[c.id] = j
                break
    if not found:
        return graph
    taken = set(graph.inputs)
    rounded: dict[int, Node] = {}  # weight leaf id (in graph) -> its bf16 value widened (in g)
    cast_x: dict[int, Node] = {}  # activation id (in g) -> its bf16 rounding widened

    def widened(g: Graph, n: Node) -> Node:
        return g.add_op(Op.CAST, [(n, View.contiguous(n.shape))], arg=dt.f32)

    def rounded_here(g: Graph, n: Node) -> Node:  # f32(bf16(n)), computed in the graph
        return widened(g, g.add_op(Op.CAST, [(n, View.contiguous(n.shape))], arg=dt.bf16))

    def bf16_weight(g: Graph, leaf: Node, src: Node) -> Node:
        if leaf.id not in rounded:
            name = leaf.arg[0]
            if leaf.dtype is dt.bf16:
                rounded[leaf.id] = src  # the cast to f32 of a bf16 weight, as it is
            elif name in graph.weights:
                new = _fresh(f"{name}#bf16", taken)
                w = g.add_input(new, leaf.shape, dt.bf16, weight=True)
                g.weights[new] = np.asarray(graph.weights[name], np.float32).astype(
                    ml_dtypes.bfloat16
                )
                rounded[leaf.id] = widened(g, w)
            else:  # no data yet: rounded where it is read
                rounded[leaf.id] = rounded_here(g, src)
        return rounded[leaf.id]

    def sources(g: Graph, n: Node, srcs: list[tuple[Node, View]]) -> list[tuple[Node, View]]:
        if n.id not in found:
            return srcs
        j = found[n.id]
        leaf = _weight_leaf(n.srcs[j][0])
        assert leaf is not None
        (w, wv), (x, xv) = srcs[j], srcs[1 - j]
        out = list(srcs)
        out[j] = (bf16_weight(g, leaf, w), wv)
        if x.id not in cast_x:
            cast_x[x.id] = rounded_here(g, x)
        out[1 - j] = (cast_x[x.id], xv)
        return out

    g = graph.rebuilt(sources)
    g.verify()
    return g
