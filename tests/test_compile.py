"""The compile pipeline: lowering, fusion, memory planning, plans that run and reload."""

import os
import subprocess
import sys

import numpy as np

import luminal as lm
from luminal.compiler.lower import lower
from luminal.compiler.memory import plan_memory
from luminal.graph import symbolic as sym
from optest import rand


def _chain_graph(n_ops: int, shared: bool) -> lm.Graph:
    g = lm.Graph("chain")
    x = g.input("x", (lm.dim("n", 1, 1 << 20),))
    y = x
    for i in range(n_ops):
        z = y.mul(1.0001).add(0.5) if i % 2 else y.sin()
        # reading y through a second view forces it into a buffer: ping-pong slots
        y = z.add(y.flip(0)).mul(0.5) if shared else z
    g.output("y", y)
    return g


def test_elementwise_chain_is_one_kernel():
    g = _chain_graph(100, shared=False)
    low = lower(g)
    assert len(low.kernels) == 1
    assert all(b.role != "scratch" for b in low.buffers)


def test_chain_of_100_ops_peaks_at_constant_arena():
    g = _chain_graph(100, shared=True)
    cg = lm.compile(g)
    slots = int(cg.plan.metadata["arena_slots"])
    assert slots <= 3, slots
    n = 100_000
    # the arena holds a small constant number of n-element buffers, not 100
    assert cg.executor.shapes(n=n)["y"] == (n,)
    x = rand(n)
    out = cg.run({"x": x})["y"]
    ref = g.run({"x": x})["y"]
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
    assert 0 < cg.executor.arena_bytes <= 3 * 4 * n + 3 * 64


def test_memory_planner_reuses_slots():
    seq = sym.dim("seq", 1, 4096)
    sizes = {0: seq * 4, 1: seq * 4, 2: seq * 8, 3: seq * 4}
    steps = [([0], []), ([1], [0]), ([2], [1]), ([3], [2])]
    mp = plan_memory(sizes, steps)
    assert mp.slots == 2
    assert mp.offsets[0] != mp.offsets[1]


def test_symbolic_graph_runs_compiled_for_several_seq():
    seq = lm.dim("seq", 1, 4096)
    g = lm.Graph("sym")
    x = g.input("x", (seq, 64))
    w = g.weight("w", data=rand(64, 3))
    y = x.unsqueeze(2).mul(w.unsqueeze(0)).sum_reduce(1).exp2().max_reduce(0)
    g.output("y", y)
    cg = lm.compile(g)
    for s in (1, 7, 300):
        a = rand(s, 64)
        np.testing.assert_allclose(cg.run({"x": a})["y"], g.run({"x": a})["y"], rtol=1e-4)


def test_plan_reloads_in_fresh_process(tmp_path):
    g = lm.Graph("fresh")
    x = g.input("x", (5, 7))
    g.output("y", x.permute(1, 0).sqrt().sum_reduce(1))
    cg = lm.compile(g)
    path = tmp_path / "p.lmp"
    cg.save(path)
    a = rand(5, 7, low=0.0, high=3.0)
    np.save(tmp_path / "x.npy", a)
    code = (
        "import numpy as np, luminal.runtime as r;"
        f"o = r.load({str(path)!r}).run({{'x': np.load({str(tmp_path / 'x.npy')!r})}})['y'];"
        f"np.save({str(tmp_path / 'o.npy')!r}, o)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ))
    np.testing.assert_allclose(np.load(tmp_path / "o.npy"), g.run({"x": a})["y"], rtol=1e-5)
