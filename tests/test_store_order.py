"""Values computed in the order their readers walk them (compiler/store_order.py): which
nodes qualify, that the rewritten graph computes the same values (every node keeping its id,
a weight read along the new order repacked), and the search choosing between the two
programs with each side's own weights (compiler/search/fusion.py ``choose_groups``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import luminal as lm
import luminal.functional as F
from kernel_cache import use_kernel_cache
from luminal.compile import build_plan
from luminal.compiler.lower import lower
from luminal.compiler.search.fusion import choose_groups
from luminal.compiler.search.tuner import Tuner
from luminal.compiler.store_order import permutable, permuted
from optest import rand

H = lm.dim("h", 2, 64)


def _block(c: int = 12, k: int = 5, batch: int = 3) -> tuple[lm.Graph, np.ndarray, np.ndarray]:
    """ConvNeXt's pattern: a channels-last map read as NCHW by a depthwise convolution whose
    output a layer norm reads channels-last again."""
    g = lm.Graph("block")
    x = g.input("x", (batch, H, H, c))
    w, b = rand(c, 1, k, k), rand(c)
    y = F.conv2d(x.permute(0, 3, 1, 2), g.weight("w", data=w), g.weight("b", data=b),
                 padding=k // 2, groups=c)  # fmt: skip
    g.output("y", F.layer_norm(y.permute(0, 2, 3, 1), (c,)))
    return g, w, b


def _ref(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    t = torch.from_numpy(x).permute(0, 3, 1, 2)
    y = TF.conv2d(t, torch.from_numpy(w), torch.from_numpy(b), padding=w.shape[-1] // 2,
                  groups=w.shape[0])  # fmt: skip
    return TF.layer_norm(y.permute(0, 2, 3, 1), (w.shape[0],)).numpy()


def test_a_value_read_through_one_permutation_is_computed_in_that_order() -> None:
    g, w, b = _block()
    order = permutable(g)
    assert order, "the convolution's output, its bias add and its product qualify"
    assert all(n.op.name in ("MUL", "ADD", "SUM_REDUCE") for n in g.nodes if n.id in order)
    g2 = permuted(g, order)
    assert [n.id for n in g2.nodes] == [n.id for n in g.nodes]
    assert "w" not in g2.weights and any(k.startswith("w#packed") for k in g2.weights)
    for hs in (2, 5, 9):
        x = rand(3, hs, hs, 12)
        want = _ref(x, w, b)
        np.testing.assert_allclose(g2.run({"x": x})["y"], want, rtol=1e-4, atol=1e-4)
        cg = lm.compile(g2, search=False, cache=False)
        np.testing.assert_allclose(cg.run({"x": x})["y"], want, rtol=1e-4, atol=1e-4)


def _exp_ids(g: lm.Graph) -> set[int]:
    return {n.id for n in g.nodes if n.op.name == "EXP2"}


def test_values_read_otherwise_keep_their_order() -> None:
    # two readers through different permutations
    g = lm.Graph("two")
    y = g.input("x", (4, H, 6)).exp()
    g.output("a", y.permute(0, 2, 1).sum(2))
    g.output("b", y.permute(2, 0, 1).sum(2))
    assert not _exp_ids(g) & set(permutable(g))
    # an output reads it as it lies
    g = lm.Graph("out")
    y = g.input("x", (4, H, 6)).exp()
    g.output("y", y)
    g.output("t", y.permute(0, 2, 1).sum(2))
    assert not _exp_ids(g) & set(permutable(g))
    # rows kept whole, only regrouped (attention's heads around rows of head_dim)
    g = lm.Graph("heads")
    y = g.input("q", (3, H, 8)).exp()
    g.output("y", y.permute(1, 0, 2).sum(2))
    assert not _exp_ids(g) & set(permutable(g))
    # the one permutation that moves the innermost axis qualifies
    g = lm.Graph("moved")
    y = g.input("q", (3, H, 8)).exp()
    g.output("y", y.permute(0, 2, 1).sum(2))
    assert _exp_ids(g) <= set(permutable(g))


@pytest.mark.parametrize("weights", [True, False])
def test_the_search_checks_each_side_with_its_own_weights(weights, tmp_path, monkeypatch) -> None:
    """The permuted program reads its weight repacked under another name: checked on random
    weights, the two sides would disagree; checked on the programs' own weights they agree,
    and the faster side is kept."""
    use_kernel_cache(monkeypatch, tmp_path)
    g, w, b = _block()
    order = permutable(g)
    low, alt = lower(g), lower(permuted(g, order))

    def measure(sub, dims):
        return 1.0 if any("#packed" in x.name for x in sub.buffers) else 2.0

    def evaluate(sub, dims):
        from luminal.targets import get

        return get("cpu").evaluate(sub, dims)

    tuner = Tuner(measure, "test", evaluate)
    chosen = choose_groups(low, alt, tuner, frozenset(order), "store_order",
                           ("as built", "permuted"), weights=weights)  # fmt: skip
    assert bool(chosen) is weights
    if chosen:
        ex = lm.load(build_plan(alt, "block").to_bytes())
        x = rand(3, 7, 7, 12)
        np.testing.assert_allclose(ex.run({"x": x})["y"], _ref(x, w, b), rtol=1e-4, atol=1e-4)


def test_compile_with_the_store_order_stage_matches_torch(tmp_path, monkeypatch) -> None:
    use_kernel_cache(monkeypatch, tmp_path)
    g, w, b = _block(c=16, k=7, batch=2)
    cg = lm.compile(g, cache=False, typical_dims={"h": 8})
    for hs in (3, 8, 11):
        x = rand(2, hs, hs, 16)
        np.testing.assert_allclose(cg.run({"x": x})["y"], _ref(x, w, b), rtol=1e-4, atol=1e-4)
