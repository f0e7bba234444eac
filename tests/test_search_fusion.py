"""Fuse or store (compiler/search/fusion.py): values a kernel reads through overlapping
windows are found by lowering, and whether they are stored first is the measured choice."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import luminal as lm
import luminal.functional as F
from kernel_cache import use_kernel_cache
from luminal.compile import build_plan
from luminal.compiler import kernel_ir as K
from luminal.compiler.lower import _overlapping, lower
from luminal.compiler.search.fusion import choose_fusions
from luminal.compiler.search.tuner import Tuner
from luminal.functional import conv as C
from luminal.graph import symbolic as sym
from luminal.graph.view import View
from optest import rand

B = lm.dim("b", 1, 64)


def test_overlapping_windows_and_merges():
    i0, i1 = sym.index_var(0, 7), sym.index_var(1, 3)
    shape = (16,)
    assert _overlapping(View((7, 3), sym.add(sym.mul(i0, 2), i1)), shape)  # 2*o + k, k < 3
    assert not _overlapping(View((5, 3), sym.add(sym.mul(i0, 3), i1)), (15,))  # 3*a + b
    k = sym.index_var(1, 2)
    assert not _overlapping(View((7, 2), sym.add(sym.mul(i0, 2), k)), (14,))  # pool 2x2/2
    assert not _overlapping(View((7, 3), i0), shape)  # a broadcast is no window


def _graph() -> lm.Graph:
    # batch norm, relu and a pool inlined into the next conv's patches: each pooled value is
    # read by about 9/4 of the strided conv's taps
    g = lm.Graph("cnn")
    x = g.input("x", (B, 3, 21, 19))
    w1, w2 = g.input("w1", (6, 3, 3, 3)), g.input("w2", (8, 6, 3, 3))
    s, t = g.input("s", (6, 1, 1)), g.input("t", (6, 1, 1))
    y = F.relu(C.conv2d(x, w1, None, padding=1) * s + t)
    y = F.max_pool2d(y, 2)
    g.output("y", C.conv2d(y, w2, None, stride=2, padding=1))
    return g


def _ref(a: dict[str, np.ndarray]) -> np.ndarray:
    t = {k: torch.from_numpy(v) for k, v in a.items()}
    y = torch.relu(TF.conv2d(t["x"], t["w1"], None, padding=1) * t["s"] + t["t"])
    return TF.conv2d(TF.max_pool2d(y, 2), t["w2"], None, stride=2, padding=1).numpy()


def _inputs(b: int) -> dict[str, np.ndarray]:
    return {"x": rand(b, 3, 21, 19), "w1": rand(6, 3, 3, 3), "w2": rand(8, 6, 3, 3),
            "s": rand(6, 1, 1), "t": rand(6, 1, 1)}  # fmt: skip


@pytest.mark.parametrize("prefer", ["fused", "stored"])
def test_windowed_value_stored_or_fused_by_measurement(prefer, tmp_path, monkeypatch):
    use_kernel_cache(monkeypatch, tmp_path)
    g = _graph()
    low = lower(g)
    assert low.windowed, "the pooled value read through the conv's windows is a candidate"
    stored = lower(g, frozenset(low.windowed[:1]))
    assert len(stored.kernels) == len(low.kernels) + 1
    labels = []

    def measure(sub, dims):
        # the stored program has one kernel more than the fused one
        n = len(sub.kernels)
        labels.append(n)
        return 1.0 if (n > 1) == (prefer == "stored") else 2.0

    def evaluate(sub, dims):
        from luminal.targets import get

        return get("cpu").evaluate(sub, dims)

    tuner = Tuner(measure, "test", evaluate)
    out = choose_fusions(g, low, tuner, lambda x: x)
    assert labels, "nothing was measured"
    assert len(out.kernels) == len(low.kernels) + (prefer == "stored")
    ex = lm.load(build_plan(out, "cnn").to_bytes())
    for b in (1, 3):
        a = _inputs(b)
        np.testing.assert_allclose(ex.run(a)["y"], _ref(a), rtol=1e-4, atol=1e-3)


def test_compile_searches_fusion_and_matches_torch(tmp_path, monkeypatch):
    use_kernel_cache(monkeypatch, tmp_path)
    cg = lm.compile(_graph())
    for b in (2, 5):
        a = _inputs(b)
        np.testing.assert_allclose(cg.run(a)["y"], _ref(a), rtol=1e-4, atol=1e-3)


def test_a_product_both_programs_call_joins_the_copies_it_reads(tmp_path, monkeypatch):
    # with the strided conv a library product in both programs (the same call, so not among
    # the steps that differ), the fused side's patch copy and the stored side's producer +
    # copy still meet in one group, through that call: it is measured both ways
    from luminal.compiler.search.select import choose_library_calls

    use_kernel_cache(monkeypatch, tmp_path)
    g = _graph()
    seen = []

    def measure(sub, dims):
        calls = [s for s in sub.kernels if isinstance(s, K.LibCall)]
        return 1.0 if calls and all(c.func == "gemm" for c in calls) else 2.0

    def evaluate(sub, dims):
        from luminal.targets import get

        return get("cpu").evaluate(sub, dims)

    tuner = Tuner(measure, "test-joined", evaluate)
    real = tuner.choose

    def choose(name, kind, dims, reference, candidates, default=0):
        seen.append((kind, [c.sub for c in candidates]))
        return real(name, kind, dims, reference, candidates, default)

    monkeypatch.setattr(tuner, "choose", choose)
    finish = lambda low: choose_library_calls(low, tuner)  # noqa: E731
    low = finish(lower(g))
    assert sum(isinstance(s, K.LibCall) for s in low.kernels) == 2
    out = choose_fusions(g, low, tuner, finish)
    fusion = [subs for kind, subs in seen if kind == "fusion"]
    assert fusion, "the windowed value was not measured both ways"
    for subs in fusion:
        assert all(any(isinstance(s, K.LibCall) for s in sub.kernels) for sub in subs)
    ex = lm.load(build_plan(out, "cnn").to_bytes())
    for b in (1, 3):
        a = _inputs(b)
        np.testing.assert_allclose(ex.run(a)["y"], _ref(a), rtol=1e-4, atol=1e-3)
