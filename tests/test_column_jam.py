"""Column blocks of a product whose weight is gathered by the row (a mixture of experts: each
token's row times its expert's matrix): no two rows share a weight load, so neither the row
jam nor the 2-D blocks apply; a block of one row by C columns (``K.Schedule.jam2``, the
CPU's ``columns``) shares the row's load across C weight loads in C vector accumulators.
Checked for the search offering it, its code, and its values against numpy at odd sizes
(a column chunk's rest, a sum's scalar tail, expert indices out of range)."""

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
from luminal.compiler.search import schedules, tuner
from luminal.compiler.search.schedules import column_blocks
from luminal.compiler.search.tuner import Tuner
from luminal.graph import symbolic as sym
from luminal.targets.cpu import SPACE, CpuTarget

RNG = np.random.default_rng(21)
_CPU = CpuTarget()
E, N, KD = 3, 37, 45  # experts, columns (not a multiple of a block), sum (a vector + a tail)


def _gathered(experts: int = E, n: int = N, k: int = KD) -> lm.Graph:
    """y[r, j] = sum_k x[r, k] * w[e[r], j, k]: the experts' weights (E, N, K) gathered by the
    rows' expert ids and read transposed, K contiguous (Mixtral's expert products as
    torch.compile gives them)."""
    g = lm.Graph("gathered_cols")
    rows = lm.dim("rows", 1, 64)
    x, w = g.input("x", (rows, k)), g.input("w", (experts, n, k))
    e = g.input("e", (rows,), lm.i64)
    ws = F.index_select(w, 0, e).permute((0, 2, 1))  # (rows, K, N)
    g.output("y", (x.unsqueeze(-1) * ws).sum_reduce(1))
    return g


def _kernel(g: lm.Graph) -> tuple[Lowered, K.Kernel]:
    low = lower(g)
    (kern,) = [k for k in low.kernels if isinstance(k, K.Kernel)]
    return low, kern


def _inputs(m: int) -> dict[str, np.ndarray]:
    e = RNG.integers(0, E, m).astype(np.int64)
    if m > 2:
        e[1], e[-1] = -1, E  # out of range: zero rows
    return {"x": RNG.standard_normal((m, KD)).astype(np.float32),
            "w": RNG.standard_normal((E, N, KD)).astype(np.float32), "e": e}  # fmt: skip


def _want(inp: dict[str, np.ndarray]) -> np.ndarray:
    e = inp["e"]
    ok = (e >= 0) & (e < E)
    w = np.where(ok[:, None, None], inp["w"][np.clip(e, 0, E - 1)], 0)
    return np.einsum("rk,rnk->rn", inp["x"].astype(np.float64), w.astype(np.float64))


def _run(
    low: Lowered, kern: K.Kernel, sched: K.Schedule, inp: dict[str, np.ndarray], **dims: int
) -> np.ndarray:
    plan = build_plan(Lowered(low.buffers, [replace(kern, schedule=sched)], low.dims, low.weights))
    return lm.load(plan.to_bytes()).run(inp, rows=len(inp["e"]), **dims)["y"]


def test_a_gathered_product_is_offered_column_blocks() -> None:
    _, kern = _kernel(_gathered())
    # no row jam or 2-D block applies: the weight differs per row, so rows share no work
    assert S.shared_work(kern, 0) == 0
    assert not [s for s in S.alternatives(kern, SPACE) if s.jam > 1 or s.jam2 > 1]
    assert SPACE.columns
    got = {(s.jam, s.jam2, s.order) for s in column_blocks(kern, SPACE)}
    assert got == {(0, c, o) for c in SPACE.columns for o in SPACE.orders}
    # a product by an ungathered weight has the 2-D blocks instead; a space without columns
    # (CUDA's, Metal's) offers none
    g = lm.Graph("plain")
    x, w = g.input("x", (lm.dim("rows", 1, 64), KD)), g.input("w", (N, KD))
    g.output("y", x @ w.transpose(0, 1))
    assert column_blocks(_kernel(g)[1], SPACE) == []
    assert column_blocks(kern, replace(SPACE, columns=())) == []


def test_a_column_block_sums_in_vector_accumulators_sharing_the_row() -> None:
    low, kern = _kernel(_gathered())
    src = render_kernel(replace(kern, schedule=K.Schedule(jam=0, jam2=4)), sorted(low.dims)).source
    body = src[src.index(f"void {kern.name}(") :]
    # four vector accumulators, the row's vector loaded once per step and held, the gathered
    # weight read as vectors at the row's clamped expert
    assert "lm_f32v v2 = {0}, v3 = {0}, v4 = {0}, v5 = {0};" in body
    assert body.count("LM_KEEP(") == 1
    assert body.count("lm_vload_f32(&") == 5
    assert "#pragma omp simd" not in body


@pytest.mark.parametrize("order", [0, 1])
@pytest.mark.parametrize("cols", SPACE.columns or (4,))
def test_column_blocks_compute_the_plain_kernels_sums(cols: int, order: int) -> None:
    low, kern = _kernel(_gathered())
    for m in (1, 5, 13):
        inp = _inputs(m)
        want = _want(inp)
        plain = _run(low, kern, K.Schedule(jam=0), inp)
        got = _run(low, kern, K.Schedule(order=order, jam=0, jam2=cols), inp)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        # the same sums as one dot per column, up to their order
        np.testing.assert_allclose(got, plain, rtol=1e-5, atol=1e-5)
        assert not got[inp["e"] < 0].any() and not got[inp["e"] >= E].any()


def test_the_search_keeps_a_column_block_and_the_plan_computes_it(monkeypatch, tmp_path) -> None:
    use_kernel_cache(monkeypatch, tmp_path)
    monkeypatch.setenv("LUMINAL_SEARCH_CANDIDATES", "64")
    monkeypatch.setenv("LUMINAL_SEARCH_MIN_US", "0")
    tuner.clear_memory_cache()
    g = _gathered()
    low = lower(g)
    want = f"order=1,jam2={SPACE.columns[-1]}"

    def measure(sub, dims):
        k = sub.kernels[0]
        label = k.schedule.label() if k.schedule is not None else "?"
        return 1.0 if label == f"split=default,{want}" else 2.0

    t = Tuner(measure, "test", _CPU.evaluate, space=SPACE)
    out = schedules.choose_schedules(low, t, _CPU.signature)
    (k,) = [k for k in out.kernels if isinstance(k, K.Kernel)]
    assert k.schedule is not None and k.schedule.label().endswith(want)
    assert t.stats.rejected == 0
    inp = _inputs(11)
    got = lm.load(build_plan(out).to_bytes()).run(inp, rows=11)["y"]
    np.testing.assert_allclose(got, _want(inp), rtol=1e-4, atol=1e-4)
    tuner.clear_memory_cache()


def test_symbolic_sizes_keep_the_block() -> None:
    # a symbolic column count: the chunk's rest runs in the block's code, unstored past it
    g = lm.Graph("gathered_sym")
    rows, n = lm.dim("rows", 1, 64), sym.dim("n", 1, 64)
    x, w = g.input("x", (rows, KD)), g.input("w", (E, n, KD))
    e = g.input("e", (rows,), lm.i64)
    g.output("y", (x.unsqueeze(-1) * F.index_select(w, 0, e).permute((0, 2, 1))).sum_reduce(1))
    low, kern = _kernel(g)
    assert column_blocks(kern, SPACE)
    inp = _inputs(7)
    got = _run(low, kern, K.Schedule(jam=0, jam2=4), inp, n=N)
    np.testing.assert_allclose(got, _want(inp), rtol=1e-4, atol=1e-4)
