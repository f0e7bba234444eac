"""Graph -> Graph passes run before lowering, as data (DESIGN.md §4.1).

``PASSES`` is the pipeline: print it, reorder it, or bisect a problem by dropping entries.
Each entry is (name, pass, flag that turns it off with ``0``). Every pass returns an
equivalent graph (or the same object when it changes nothing); results are checked against
the reference interpreter by the test suite.
"""

from __future__ import annotations

from collections.abc import Callable

from .. import flags
from ..graph.graph import Graph
from .search.egraph import simplify
from .siblings import merge_sibling_products
from .stage import stage_strided_reads


def egraph_pass(graph: Graph) -> Graph:
    """Equality saturation with the rules of ``search/rules/*.rules``."""
    return simplify(graph, verbose=flags.debug() >= 3)[0]


PASSES: list[tuple[str, Callable[[Graph], Graph], flags.Flag]] = [
    ("siblings", merge_sibling_products, flags.SIBLINGS),
    ("egraph", egraph_pass, flags.EGRAPH),
    ("stage", stage_strided_reads, flags.STAGE),
]


def run_passes(graph: Graph) -> Graph:
    state = graph.state
    for _, fn, flag in PASSES:
        if flag.get() != "0":
            graph = fn(graph)
    # passes keep inputs and outputs, so in-place updates still apply (lower re-checks them)
    graph.state = dict(state)
    return graph
