"""Jammed schedules (``K.Schedule.jam``: register blocking over an outer output dim): a
product of a few rows by a weight computes a block of rows per reduction loop, sharing the
weight's loads and dequantization. Checked against the reference interpreter on random
inputs at odd row counts (tails), with f32 and quantized weights, static and symbolic rows."""

from dataclasses import replace

import numpy as np
import pytest

import luminal as lm
import luminal.functional as F
from kernel_cache import use_kernel_cache
from luminal.codegen.cpu import render_kernel
from luminal.compile import build_plan
from luminal.compiler import kernel_ir as K
from luminal.compiler import schedule as S
from luminal.compiler.lower import Lowered, lower
from luminal.compiler.pipeline import graph_passes
from luminal.compiler.search import schedules, select, tuner
from luminal.compiler.search.cost import estimate
from luminal.compiler.search.tuner import Tuner
from luminal.graph import symbolic as sym
from luminal.loaders import quants
from luminal.targets.cpu import SPACE, CpuTarget
from test_loaders import _random_blocks

RNG = np.random.default_rng(11)
_CPU = CpuTarget()


def _product(fmt: str, rows: sym.sint, n: int, k: int) -> lm.Graph:
    """x (rows, k) @ w.T, w (n, k) f32 or block-quantized in ``fmt``."""
    g = lm.Graph(f"jam_{fmt}")
    x = g.input("x", (rows, k))
    if fmt == "f32":
        w = g.weight("w", data=RNG.standard_normal((n, k)).astype(np.float32))
    else:
        raw = _random_blocks(fmt, n, k).reshape(-1)
        w = quants.quantized_weight(g, "w", fmt, raw, (n, k))
    g.output("y", x @ w.transpose(0, 1))
    return g


def _kernel(g: lm.Graph) -> tuple[Lowered, K.Kernel]:
    low = lower(graph_passes(g))
    (kern,) = [k for k in low.kernels if isinstance(k, K.Kernel)]
    return low, kern


def _run(low: Lowered, kern: K.Kernel, sched: K.Schedule, x: np.ndarray, **dims: int) -> np.ndarray:
    plan = build_plan(Lowered(low.buffers, [replace(kern, schedule=sched)], low.dims, low.weights))
    return lm.load(plan.to_bytes()).run({"x": x}, **dims)["y"]


def _check(got: np.ndarray, g: lm.Graph, x: np.ndarray, **dims: int) -> None:
    ref = g.run({"x": x}, **dims)["y"]
    np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-5 * float(np.abs(ref).max()))


@pytest.mark.parametrize("fmt", ["f32", "Q4_1", "Q8_0"])
@pytest.mark.parametrize("rows", [3, 5, 17])
def test_jammed_product_matches_the_interpreter(fmt: str, rows: int) -> None:
    g = _product(fmt, rows, 37, 96)
    low, kern = _kernel(g)
    x = RNG.standard_normal((rows, 96)).astype(np.float32)
    sched = K.Schedule(jam=4, jam_dim=0)
    assert S.apply(kern, sched).schedule == sched  # applies: not dropped
    _check(_run(low, kern, sched, x), g, x)


@pytest.mark.parametrize("jam,split", [(2, -1), (3, -1), (8, -1), (8, 32), (4, 8)])
def test_jam_sizes_and_splits_with_tails(jam: int, split: int) -> None:
    # 17 rows: a full block and a tail for every jam; 3 is not a power of two
    g = _product("Q4_1", 17, 29, 128)
    low, kern = _kernel(g)
    x = RNG.standard_normal((17, 128)).astype(np.float32)
    _check(_run(low, kern, K.Schedule(split=split, jam=jam, jam_dim=0), x), g, x)


@pytest.mark.parametrize("fmt", ["f32", "Q8_0"])
def test_one_plan_serves_every_row_count_of_a_symbolic_dim(fmt: str) -> None:
    g = _product(fmt, sym.dim("seq", 1, 64), 21, 64)
    low, kern = _kernel(g)
    plan = build_plan(
        Lowered(low.buffers, [replace(kern, schedule=K.Schedule(jam=8, jam_dim=0))],
                low.dims, low.weights)
    )  # fmt: skip
    cg = lm.load(plan.to_bytes())
    for rows in (1, 3, 5, 8, 17, 64):
        x = RNG.standard_normal((rows, 64)).astype(np.float32)
        _check(cg.run({"x": x}, seq=rows)["y"], g, x, seq=rows)


def test_a_block_loads_and_dequantizes_the_weight_once() -> None:
    _, kern = _kernel(_product("Q4_1", 16, 32, 128))
    k = S.apply(kern, K.Schedule(jam=4, jam_dim=0))
    assert isinstance(k, K.Kernel)
    src = render_kernel(k, []).source.rsplit("#endif\n", 1)[-1]
    full = src[src.index("if (lm_jr >= 3) {") : src.index("lm_jo += lm_jv;")]
    # one byte load per step for the block's four rows, each row its own sum
    assert full.count("lm_vload_u8(") == 1 and full.count("lm_vsum_f32(") == 4
    plain = render_kernel(S.apply(kern, K.Schedule(jam=0)), [])  # type: ignore[arg-type]
    assert "lm_jn" not in plain.source


def test_the_default_jams_a_dequantized_weight_only() -> None:
    # an f32 weight's product gets the default 2-D block instead (test_schedule_tiles.py)
    for fmt, want in (("Q4_1", S.DEFAULT_JAM), ("Q8_0", S.DEFAULT_JAM),
                      ("f32", S.DEFAULT_BLOCK[0])):  # fmt: skip
        k = S.apply(_kernel(_product(fmt, 5, 8, 64))[1])
        assert k.schedule is not None and k.schedule.jam == want, fmt
        assert k.schedule.jam2 == (S.DEFAULT_BLOCK[1] if fmt == "f32" else 0), fmt
    # one row: nothing to jam
    k = S.apply(_kernel(_product("Q4_1", 1, 8, 64))[1])
    assert k.schedule is not None and k.schedule.jam == 0


def test_jam_dim_is_the_dim_the_reduction_shares_work_across() -> None:
    # a batched product: the batch index reaches both operands, the row index only x
    g = lm.Graph("bmm")
    a = g.input("a", (3, 5, 64))
    b = g.input("b", (3, 64, 7))
    g.output("y", a @ b)
    _, kern = _kernel(g)
    assert S.jam_dim(kern) == 1
    assert S.shared_work(kern, 0) == 0 and S.shared_work(kern, 1) > 0
    # a quantized weight shares its whole dequantization, an f32 one a load
    q = S.shared_work(_kernel(_product("Q4_1", 5, 8, 64))[1], 0)
    f = S.shared_work(_kernel(_product("f32", 5, 8, 64))[1], 0)
    assert q > f >= 1


def test_alternatives_list_jams_only_where_they_apply() -> None:
    _, kern = _kernel(_product("Q8_0", 5, 40, 64))
    jams = [s for s in S.alternatives(kern, SPACE) if s.jam > 1 and s.jam2 <= 1]  # row jams
    assert {s.jam for s in jams} == set(SPACE.jams) and {s.jam_dim for s in jams} == {0}
    assert K.Schedule(jam=0, jam_dim=0) in S.alternatives(kern, SPACE)  # none: against the default
    # no jams in a target space without them (the default: renderers that have none)
    assert not [s for s in S.alternatives(kern) if s.jam > 1]
    # one row, an elementwise kernel, the innermost dim: nothing to jam
    _, one = _kernel(_product("Q8_0", 1, 40, 64))
    assert not [s for s in S.alternatives(one, SPACE) if s.jam > 1]
    g = lm.Graph("ew")
    g.output("y", g.input("x", (4, 300)).exp())
    assert S.alternatives(lower(g).kernels[0], SPACE) == []
    # a jam that does not apply is dropped by apply
    dropped = S.apply(kern, K.Schedule(jam=4, jam_dim=1)).schedule
    assert dropped is not None and dropped.jam == 0


def test_cost_model_counts_shared_work_once_per_block() -> None:
    g = _product("Q4_1", sym.dim("seq", 1, 64), 512, 512)
    low, kern = _kernel(g)

    def cost(sched: K.Schedule, rows: int) -> float:
        return estimate(select.subprogram(low, [replace(kern, schedule=sched)]), {"seq": rows})

    plain, jam4 = K.Schedule(jam=0), K.Schedule(jam=4, jam_dim=0)
    assert cost(jam4, 16) < 0.7 * cost(plain, 16)
    # one row runs the unjammed code: the same estimate
    assert cost(jam4, 1) == pytest.approx(cost(plain, 1))
    # a digest tells the schedules apart
    assert K.fingerprint([replace(kern, schedule=jam4)]) != K.fingerprint(
        [replace(kern, schedule=plain)]
    )


def test_search_keeps_a_jam_and_the_plan_computes_the_same(monkeypatch, tmp_path) -> None:
    use_kernel_cache(monkeypatch, tmp_path)
    monkeypatch.setenv("LUMINAL_SEARCH_CANDIDATES", "64")
    monkeypatch.setenv("LUMINAL_SEARCH_MIN_US", "0")
    tuner.clear_memory_cache()
    g = _product("Q4_1", 6, 64, 128)
    low = lower(graph_passes(g))
    want = "jam=2@0"  # not the default (a jam of 8 generates the default's code)

    def measure(sub, dims):
        k = sub.kernels[0]
        label = k.schedule.label() if k.schedule is not None else "?"
        return 1.0 if label.endswith(want) and label.startswith("split=default") else 2.0

    t = Tuner(measure, "test", _CPU.evaluate, space=SPACE)
    out = schedules.choose_schedules(low, t, _CPU.signature)
    (k,) = [k for k in out.kernels if isinstance(k, K.Kernel)]
    assert k.schedule is not None and k.schedule.jam == 2 and t.stats.rejected == 0
    x = RNG.standard_normal((6, 128)).astype(np.float32)
    got = lm.load(build_plan(out).to_bytes()).run({"x": x})["y"]
    _check(got, g, x)
    tuner.clear_memory_cache()


def test_linear_with_bias_jams_too() -> None:
    # an epilogue outside the reduction (a bias) is computed per element of the block
    g = lm.Graph("lin")
    x = g.input("x", (5, 48))
    w = g.weight("w", data=RNG.standard_normal((11, 48)).astype(np.float32))
    bias = g.weight("b", data=RNG.standard_normal(11).astype(np.float32))
    g.output("y", F.linear(x, w, bias).relu())
    low, kern = _kernel(g)
    assert S.jam_dim(kern) == 0
    xv = RNG.standard_normal((5, 48)).astype(np.float32)
    _check(_run(low, kern, K.Schedule(jam=2, jam_dim=0), xv), g, xv)


@pytest.mark.parametrize("order", [0, 1])
def test_a_middle_dim_jammed_in_either_task_order(order: int) -> None:
    # (batch, rows, n): the rows dim (1) is jammed; its blocks advance like the other indices
    g = lm.Graph("bmm")
    a = g.input("x", (3, 7, 64))
    b = g.weight("w", data=RNG.standard_normal((3, 64, 21)).astype(np.float32))
    g.output("y", a @ b)
    low, kern = _kernel(g)
    assert S.jam_dim(kern) == 1
    xv = RNG.standard_normal((3, 7, 64)).astype(np.float32)
    _check(_run(low, kern, K.Schedule(order=order, jam=4, jam_dim=1), xv), g, xv)
