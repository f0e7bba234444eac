"""Sums of products in a graph: the pattern the products' graph passes rewrite."""

from __future__ import annotations

from collections.abc import Iterator

from ..graph.graph import Graph, Node
from ..graph.ops import Op
from ..graph.view import View


def sum_products(graph: Graph) -> Iterator[tuple[Node, Node]]:
    """(sum, multiply) for every ``SUM_REDUCE`` that reads a ``MUL`` whole and alone: the
    multiply has no other reader, so a pass may change what it multiplies."""
    users = graph.use_counts()
    for r in graph.nodes:
        if r.op is not Op.SUM_REDUCE:
            continue
        c, vr = r.srcs[0]
        if c.op is Op.MUL and users.get(c.id) == 1 and vr == View.contiguous(c.shape):
            yield r, c
