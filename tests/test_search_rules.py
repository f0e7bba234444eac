"""What the search leaves to its cost model instead of measuring (compile time)."""

import numpy as np

import luminal as lm
from kernel_cache import use_kernel_cache
from luminal.compile import build_plan
from luminal.compiler import kernel_ir as K
from luminal.compiler.lower import lower
from luminal.compiler.pipeline import graph_passes
from luminal.compiler.search import select
from luminal.compiler.search.tuner import Tuner
from luminal.compiler.target import CostModel
from luminal.loaders import quants
from luminal.targets.cpu import COST, CpuTarget
from optest import rand
from test_loaders import _random_blocks


def _product(fmt: str, rows, n: int, k: int) -> lm.Graph:
    g = lm.Graph("product")
    x = g.input("x", (rows, k))
    if fmt == "f32":
        w = g.weight("w", data=rand(n, k))
    else:
        w = quants.quantized_weight(g, "w", fmt, _random_blocks(fmt, n, k).reshape(-1), (n, k))
    g.output("y", x @ w.transpose(0, 1))
    return g


def _decision(g: lm.Graph, tuner: Tuner):
    low = lower(graph_passes(g))
    dims = select.representative_dims(low)
    buffers = list(low.buffers)
    (choice,) = [c for s in low.kernels if (c := select._options(low, s, buffers, tuner, dims))]
    cands = select._candidates(low, buffers + choice.extra, choice, tuner, dims)
    return cands, select._decision(low, choice, cands, tuner, dims)


def test_an_option_estimated_far_behind_is_not_measured():
    # SmolLM2's gate/up shape: the dequantized copy + GEMM is estimated 2x the generated
    # kernel (it measured 3-14x slower), so only the generated kernel's task orders are left,
    # and those the schedule stage chooses when it runs
    g = _product("Q4_1", 32, 1536, 576)
    cands, d = _decision(g, Tuner(lambda s, d: 1.0, "t", cost=COST, schedules=True))
    assert any(c.label == "copy+gemm" for c in cands)
    assert d is None
    _, d = _decision(g, Tuner(lambda s, d: 1.0, "t", cost=COST))
    assert d is not None and [c.label for c in d.cands] == ["generated", "generated,order=1"]
    # an f32 product of BERT's size: the GEMM and the generated kernel are within the margin
    # (the generated one measured 1.2-1.5x slower), both are measured
    _, d = _decision(_product("f32", 128, 768, 768), Tuner(lambda s, d: 1.0, "t", cost=COST))
    assert d is not None and {"generated", "gemm"} <= {c.label for c in d.cands}
    assert d.reference is d.cands[0].sub


def test_a_lone_library_option_is_checked_against_the_plain_kernel_not_timed(tmp_path, monkeypatch):
    use_kernel_cache(monkeypatch, tmp_path)
    g = _product("f32", 64, 96, 128)
    low = lower(graph_passes(g))
    timed, checked = [], []
    target = CpuTarget()

    def evaluate(sub, dims):
        checked.append(sub)
        return target.evaluate(sub, dims)

    # a library this much faster leaves the generated kernel out of the running
    tuner = Tuner(lambda s, d: timed.append(s) or 1.0, "lone", evaluate,
                  cost=CostModel(library_speedup=1e4), schedules=True)  # fmt: skip
    chosen = select.choose_library_calls(low, tuner)
    assert timed == [] and len(checked) == 2  # the reference, then the call, each run once
    plain = [k for k in checked[0].kernels if isinstance(k, K.Kernel)]
    assert plain and all(k.schedule == K.Schedule(split=0, jam=0) for k in plain)
    assert any(isinstance(s, K.LibCall) for s in chosen.kernels)
    ex = lm.load(build_plan(chosen, "lone").to_bytes())
    a = rand(64, 128)
    np.testing.assert_allclose(ex.run({"x": a})["y"], g.run({"x": a})["y"], rtol=1e-4, atol=1e-4)
    # cached: a second search checks nothing
    checked.clear()
    tuner = Tuner(lambda s, d: 1.0, "lone", evaluate, cost=CostModel(library_speedup=1e4),
                  schedules=True)  # fmt: skip
    select.choose_library_calls(lower(graph_passes(g)), tuner)
    assert checked == []
