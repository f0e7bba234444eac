"""A float weight read once with a stride along its reader's innermost axis (a product's
weight stored [in, out], GPT-2's) is stored transposed at compile time (``fold_scales``'s
repacking), so the product's loads are contiguous and the default 2-D block applies."""

from __future__ import annotations

import numpy as np

import luminal as lm
from luminal.compile import build_plan
from luminal.compiler import kernel_ir as K
from luminal.compiler import schedule as S
from luminal.compiler.fold import fold_scales
from luminal.compiler.lower import lower
from luminal.compiler.pipeline import graph_passes
from luminal.graph.ops import Leaf

RNG = np.random.default_rng(5)


def _in_out(rows: int, k: int, n: int) -> tuple[lm.Graph, np.ndarray]:
    g = lm.Graph("in_out")
    x = g.input("x", (rows, k))
    w = RNG.standard_normal((k, n)).astype(np.float32)
    g.output("y", x @ g.weight("w", data=w))
    return g, w


def test_an_in_out_weight_is_stored_transposed_and_computes_the_same() -> None:
    g, w = _in_out(7, 45, 13)
    f = fold_scales(g)
    assert "w" not in f.weights  # replaced, not kept beside its copy
    (name,) = f.weights
    np.testing.assert_array_equal(np.asarray(f.weights[name]), w.T)
    x = RNG.standard_normal((7, 45)).astype(np.float32)
    np.testing.assert_allclose(f.run({"x": x})["y"], g.run({"x": x})["y"], rtol=1e-6)
    # the product's loads are unit-stride now: it gets the default block, and the plan runs it
    low = lower(graph_passes(g))
    (kern,) = [k for k in low.kernels if isinstance(k, K.Kernel)]
    sched = S.apply(kern).schedule
    assert sched is not None and sched.jam2 == S.DEFAULT_BLOCK[1]
    got = lm.load(build_plan(low).to_bytes()).run({"x": x})["y"]
    np.testing.assert_allclose(got, g.run({"x": x})["y"], rtol=2e-5, atol=1e-4)


def test_contiguous_and_shared_weights_stay() -> None:
    # [out, in] read along in: unit-stride already, nothing to do
    g = lm.Graph("out_in")
    x = g.input("x", (3, 16))
    g.output("y", x @ g.weight("w", data=RNG.standard_normal((8, 16)).astype(np.float32)).T)
    assert fold_scales(g) is g
    # a weight read twice would be held twice: kept as it is
    g2 = lm.Graph("shared")
    x2 = g2.input("x", (3, 16))
    w2 = g2.weight("w", data=RNG.standard_normal((16, 16)).astype(np.float32))
    g2.output("y", x2 @ w2 + x2 @ w2.T)
    f2 = fold_scales(g2)
    assert list(f2.weights) == ["w"]
    assert [n for n in f2.nodes if n.op is Leaf.INPUT and n.arg[0] == "w"]
