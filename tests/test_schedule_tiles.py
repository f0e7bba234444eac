"""2-D register blocks (``K.Schedule.jam`` x ``jam2``): a product computes a block of rows by
columns per reduction loop, each row's loads shared by the block's columns and each column's
by its rows. Checked against the reference interpreter at odd sizes (every tail of rows,
columns and the vector loop), static and symbolic, with epilogues and quantized weights."""

from dataclasses import replace

import numpy as np
import pytest

import luminal as lm
import luminal.functional as F
from luminal.codegen.cpu import render_kernel
from luminal.codegen.cpu.jam import block_fits
from luminal.compile import build_plan
from luminal.compiler import kernel_ir as K
from luminal.compiler import schedule as S
from luminal.compiler.lower import Lowered, lower
from luminal.compiler.pipeline import graph_passes
from luminal.compiler.search import select
from luminal.compiler.search.cost import estimate
from luminal.compiler.target import ScheduleSpace
from luminal.graph import symbolic as sym
from luminal.loaders import quants
from luminal.targets.cpu import SPACE
from test_loaders import _random_blocks

RNG = np.random.default_rng(21)


def _product(fmt: str, rows: sym.sint, n: int, k: sym.sint) -> lm.Graph:
    """x (rows, k) @ w.T, w (n, k): an f32 weight, a block-quantized one, or (``k``
    symbolic) a second input."""
    g = lm.Graph(f"tiles_{fmt}")
    x = g.input("x", (rows, k))
    if isinstance(k, sym.Expr):
        w = g.input("w", (n, k))
    elif fmt == "f32":
        w = g.weight("w", data=RNG.standard_normal((n, k)).astype(np.float32))
    else:
        w = quants.quantized_weight(g, "w", fmt, _random_blocks(fmt, n, k).reshape(-1), (n, k))
    g.output("y", x @ w.transpose(0, 1))
    return g


def _kernel(g: lm.Graph) -> tuple[Lowered, K.Kernel]:
    low = lower(graph_passes(g))
    (kern,) = [k for k in low.kernels if isinstance(k, K.Kernel)]
    return low, kern


def _plan(low: Lowered, kern: K.Kernel, sched: K.Schedule) -> lm.CompiledGraph:
    steps = [replace(kern, schedule=sched)]
    return lm.load(build_plan(Lowered(low.buffers, steps, low.dims, low.weights)).to_bytes())


def _check(got: np.ndarray, g: lm.Graph, inputs: dict[str, np.ndarray], **dims: int) -> None:
    ref = g.run(inputs, **dims)["y"]
    np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-5 * float(np.abs(ref).max()))


def _block(rows: int, cols: int, order: int = 0, split: int = -1) -> K.Schedule:
    return K.Schedule(split, 0, order, rows if rows > 1 else 0, 0, cols)


# every full block and tail: 1-8 rows by 2-4 columns; 23 rows leave 3, 2 or 7 of each block
# size, 37 columns leave a tail in every task's chunk, k = 45 leaves 5 lanes of the vector loop
@pytest.mark.parametrize("rows,cols", [(1, 2), (1, 3), (2, 2), (3, 3), (4, 2), (2, 4),
                                       (4, 3), (8, 3)])  # fmt: skip
def test_blocks_with_every_tail_match_the_interpreter(rows: int, cols: int) -> None:
    g = _product("f32", 23, 37, 45)
    low, kern = _kernel(g)
    sched = _block(rows, cols)
    assert S.apply(kern, sched).schedule == sched  # applies: not dropped
    x = RNG.standard_normal((23, 45)).astype(np.float32)
    _check(_plan(low, kern, sched).run({"x": x})["y"], g, {"x": x})


@pytest.mark.parametrize("order", [0, 1])
def test_symbolic_rows_and_reduction_one_plan_serves_every_size(order: int) -> None:
    seq, kd = sym.dim("seq", 1, 40), sym.dim("kd", 1, 80)
    g = _product("f32", seq, 19, kd)
    low, kern = _kernel(g)
    cg = _plan(low, kern, _block(4, 3, order))
    for r, kk in ((1, 1), (3, 7), (5, 8), (17, 33), (40, 80)):
        x = RNG.standard_normal((r, kk)).astype(np.float32)
        w = RNG.standard_normal((19, kk)).astype(np.float32)
        _check(cg.run({"x": x, "w": w}, seq=r, kd=kk)["y"], g, {"x": x, "w": w}, seq=r, kd=kk)


@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_1"])
@pytest.mark.parametrize("rows,cols,split", [(2, 2, -1), (3, 3, -1), (4, 2, 32), (1, 3, -1)])
def test_quantized_weights_dequantized_in_the_block(
    fmt: str, rows: int, cols: int, split: int
) -> None:
    g = _product(fmt, 7, 29, 64)
    low, kern = _kernel(g)
    x = RNG.standard_normal((7, 64)).astype(np.float32)
    _check(_plan(low, kern, _block(rows, cols, 0, split)).run({"x": x})["y"], g, {"x": x})


def test_an_epilogue_runs_per_element_of_the_block() -> None:
    g = lm.Graph("lin")
    x = g.input("x", (11, 40))
    w = g.weight("w", data=RNG.standard_normal((13, 40)).astype(np.float32))
    bias = g.weight("b", data=RNG.standard_normal(13).astype(np.float32))
    g.output("y", F.linear(x, w, bias).relu() * 0.5 + 1.0)
    low, kern = _kernel(g)
    xv = RNG.standard_normal((11, 40)).astype(np.float32)
    for sched in (_block(3, 3), _block(1, 4), _block(4, 2, 1)):
        assert S.apply(kern, sched).schedule == sched
        _check(_plan(low, kern, sched).run({"x": xv})["y"], g, {"x": xv})


def test_a_batched_product_and_a_single_row_of_outputs() -> None:
    # (batch, rows, n): rows (dim 1) by columns; the weight's rows differ per batch
    g = lm.Graph("bmm")
    a = g.input("x", (3, 5, 24))
    b = g.weight("w", data=RNG.standard_normal((3, 24, 10)).astype(np.float32))
    g.output("y", a @ b)
    low, kern = _kernel(g)
    assert S.jam_dim(kern) == 1
    xv = RNG.standard_normal((3, 5, 24)).astype(np.float32)
    sched = K.Schedule(jam=2, jam_dim=1, jam2=3)
    _check(_plan(low, kern, sched).run({"x": xv})["y"], g, {"x": xv})
    # a one-dim output (a GEMV): only its columns are blocked
    g1 = lm.Graph("gemv")
    v = g1.input("x", (48,))
    m = g1.weight("w", data=RNG.standard_normal((21, 48)).astype(np.float32))
    g1.output("y", (m * v).sum(1))
    low1, k1 = _kernel(g1)
    xv1 = RNG.standard_normal(48).astype(np.float32)
    sched1 = K.Schedule(jam=0, jam2=4)
    assert S.apply(k1, sched1).schedule == sched1
    _check(_plan(low1, k1, sched1).run({"x": xv1})["y"], g1, {"x": xv1})


def test_the_schedule_shows_in_the_printed_kernel() -> None:
    _, kern = _kernel(_product("f32", 9, 16, 32))
    k = S.apply(kern, _block(4, 3))
    assert isinstance(k, K.Kernel) and k.schedule is not None
    assert k.schedule.label() == "split=default,jam=4@0,jam2=3"
    src = render_kernel(k, []).source.rsplit("#endif\n", 1)[-1]
    assert "/* block 4x3 of dims 0, 1 */" in src
    # a full block: four row loads and three weight loads per step, twelve accumulators
    full = src[src.index("if (lm_jr >= 3) {") : src.index("lm_jo += lm_jv;")]
    step = full[full.index("+= LM_VL) {") :]
    step = step[: step.index("}")]
    assert step.count("lm_vload_f32(") == 7 and step.count(" += ") == 12
    # digests tell the schedules apart
    assert K.fingerprint([k]) != K.fingerprint([S.apply(kern, _block(4, 1))])  # type: ignore[list-item]


def test_blocks_that_do_not_apply_are_dropped() -> None:
    # an elementwise kernel has no reduction to block
    g = lm.Graph("ew")
    g.output("y", g.input("x", (4, 300)).exp())
    ew = lower(g).kernels[0]
    assert isinstance(ew, K.Kernel)
    out = S.apply(ew, K.Schedule(jam2=3)).schedule
    assert out is not None and out.jam2 == 0
    # a row sum: its reduction does not run per element of the innermost dim
    g2 = lm.Graph("rowsum")
    g2.output("y", g2.input("x", (6, 50)).sum(1))
    rs = lower(g2).kernels[0]
    assert isinstance(rs, K.Kernel) and not S.jam2_applies(rs)


def test_the_default_blocks_vector_products_only() -> None:
    rows, cols = S.DEFAULT_BLOCK
    k = S.apply(_kernel(_product("f32", 9, 16, 32))[1]).schedule
    assert k is not None and (k.jam, k.jam2) == (rows, cols)
    # a weight read with a stride along the sum ([in, out], GPT-2's, when the graph passes
    # do not store it transposed) stays unblocked
    g = lm.Graph("strided")
    x = g.input("x", (9, 32))
    w = g.weight("w", data=RNG.standard_normal((32, 16)).astype(np.float32))
    g.output("y", x @ w)
    (strided,) = lower(g).kernels
    assert isinstance(strided, K.Kernel)
    s = S.apply(strided).schedule
    assert s is not None and s.jam2 == 0
    # an explicit split, or no jam, leaves the sums as they are
    for sched in (K.Schedule(split=16), K.Schedule(jam=0)):
        got = S.apply(_kernel(_product("f32", 9, 16, 32))[1], sched).schedule
        assert got is not None and got.jam2 == 0


def test_alternatives_offer_each_kind_of_product_its_blocks() -> None:
    _, kern = _kernel(_product("f32", 32, 64, 128))
    blocks = {(s.jam, s.jam2, s.order) for s in S.alternatives(kern, SPACE) if s.jam2 > 1}
    want = {(r if r > 1 else 0, c, o) for r, c in SPACE.blocks for o in SPACE.orders}
    assert SPACE.blocks and blocks == want
    # a quantized product's split sums get the blocks that fit their dequantization
    _, q = _kernel(_product("Q4_1", 8, 64, 128))
    qb = {(s.jam, s.jam2, s.order) for s in S.alternatives(q, SPACE) if s.jam2 > 1}
    assert SPACE.qblocks and qb == {(r, c, o) for r, c in SPACE.qblocks for o in SPACE.orders}
    # a space without blocks (targets whose renderers have no jams) offers none
    assert not [s for s in S.alternatives(kern, ScheduleSpace()) if s.jam2 > 1]


def test_the_register_rule() -> None:
    # accumulators + one step's row and column vectors + one spare within the registers
    assert block_fits(3, 3, 16) and block_fits(4, 2, 16) and block_fits(2, 4, 16)
    assert not block_fits(4, 3, 16) and not block_fits(8, 2, 16)
    assert block_fits(4, 4, 32) and block_fits(8, 2, 32) and not block_fits(8, 4, 32)


def test_cost_model_counts_each_operand_once_per_block() -> None:
    g = _product("f32", sym.dim("seq", 1, 256), 384, 128)
    low, kern = _kernel(g)

    def cost(sched: K.Schedule, rows: int) -> float:
        return estimate(select.subprogram(low, [replace(kern, schedule=sched)]), {"seq": rows})

    plain, jam4, b33 = K.Schedule(jam=0), K.Schedule(jam=4, jam_dim=0), _block(3, 3)
    assert cost(b33, 128) < cost(jam4, 128) < cost(plain, 128)
    # one row by blocks of columns still shares the row's loads
    assert cost(_block(1, 4), 1) < cost(plain, 1)


def test_targets_without_jams_render_the_same_kernel() -> None:
    from luminal.codegen.cuda.kernel import render_kernel as cuda_kernel
    from luminal.codegen.metal.kernel import render_kernel as metal_kernel

    _, kern = _kernel(_product("f32", 9, 16, 32))
    blocked = S.apply(kern, _block(3, 3))
    plain = S.apply(kern, K.Schedule(jam=0))
    assert isinstance(blocked, K.Kernel) and isinstance(plain, K.Kernel)
    assert cuda_kernel(blocked, []).source == cuda_kernel(plain, []).source
    assert metal_kernel(blocked, []).source == metal_kernel(plain, []).source
