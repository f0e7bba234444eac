"""Register blocks of products by block-quantized weights (``K.Schedule.jam`` rows, and
``jam2`` columns from ``ScheduleSpace.qblocks``): each weight block is dequantized once for
the block's rows, each activation vector loaded once for its columns, one named vector
accumulator (or a few: ``ACC_CHAINS``) per element. Checked against the reference interpreter
at odd row counts and sizes (every tail of rows, columns and weight blocks), one plan per
schedule serving every row count."""

import re
from dataclasses import replace

import numpy as np
import pytest

import luminal as lm
from kernel_cache import use_kernel_cache
from luminal.codegen.cpu import render_kernel
from luminal.codegen.cpu.jam import ACC_CHAINS, QBLOCKS, qblock_fits, vector_registers
from luminal.compile import build_plan
from luminal.compiler import kernel_ir as K
from luminal.compiler import schedule as S
from luminal.compiler.lower import Lowered, lower
from luminal.compiler.pipeline import graph_passes
from luminal.compiler.search import schedules, tuner
from luminal.compiler.search.tuner import Tuner
from luminal.compiler.target import ScheduleSpace
from luminal.graph import symbolic as sym
from luminal.loaders import quants
from luminal.targets.cpu import SPACE, CpuTarget
from test_loaders import _random_blocks

RNG = np.random.default_rng(17)
ROWS = (1, 3, 5, 6, 7, 17, 33)


def _product(fmt: str, rows: sym.sint, n: int, k: int) -> lm.Graph:
    g = lm.Graph(f"qblocks_{fmt}")
    x = g.input("x", (rows, k))
    w = quants.quantized_weight(g, "w", fmt, _random_blocks(fmt, n, k).reshape(-1), (n, k))
    g.output("y", x @ w.transpose(0, 1))
    return g


def _kernel(g: lm.Graph) -> tuple[Lowered, K.Kernel]:
    low = lower(graph_passes(g))
    (kern,) = [k for k in low.kernels if isinstance(k, K.Kernel)]
    return low, kern


def _check(got: np.ndarray, g: lm.Graph, x: np.ndarray, **dims: int) -> None:
    ref = g.run({"x": x}, **dims)["y"]
    np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-5 * float(np.abs(ref).max()))


def _block(rows: int, cols: int, order: int = 0, split: int = -1) -> K.Schedule:
    return K.Schedule(split, 0, order, rows if rows > 1 else 0, 0, cols if cols > 1 else 0)


# every block the CPU offers anywhere (the registers decide which on a machine), the row
# jams (the named accumulators, unrolled where a block has few rows), both task orders
SCHEDULES = [
    *(_block(r, c) for r, c in QBLOCKS),
    _block(4, 2, 1),
    _block(1, 3),
    _block(3, 3, 0, 32),
    _block(8, 1),
    _block(8, 1, 1),
    _block(2, 1),
]


@pytest.mark.parametrize("fmt", ["Q4_1", "Q8_0", "Q4_0"])
@pytest.mark.parametrize("sched", SCHEDULES, ids=lambda s: s.label())
def test_blocks_match_the_interpreter_at_odd_row_counts(fmt: str, sched: K.Schedule) -> None:
    # 37 weight rows leave a tail in every task's chunk of columns, k = 160 five weight blocks
    # (an odd count of split halves); rows 1..33 every tail of a block's rows
    seq = sym.dim("seq", 1, 40)
    g = _product(fmt, seq, 37, 160)
    low, kern = _kernel(g)
    applied = S.apply(kern, sched)
    assert isinstance(applied, K.Kernel) and applied.schedule == sched  # applies: not dropped
    cg = lm.load(build_plan(replace(low, kernels=[replace(kern, schedule=sched)])).to_bytes())
    for r in ROWS:
        x = RNG.standard_normal((r, 160)).astype(np.float32)
        _check(cg.run({"x": x}, seq=r)["y"], g, x, seq=r)


def _full_step(src: str, rows: int) -> str:
    """The vector step of the C of a full block of ``rows`` rows (its first inner loop)."""
    full = src[src.index(f"if (lm_jr >= {rows - rows // 4}) {{") : src.index("lm_jo += lm_jv;")]
    step = full[full.index("+= LM_VL) {") :]
    return step[: step.index("\n          }")]


def test_a_block_dequantizes_each_column_once_and_loads_each_row_once() -> None:
    _, kern = _kernel(_product("Q8_0", 9, 16, 64))
    k = S.apply(kern, _block(4, 2))
    assert isinstance(k, K.Kernel)
    src = render_kernel(k, []).source.rsplit("#endif\n", 1)[-1]
    step = _full_step(src, 4)
    # two weight rows' bytes, four activation rows, eight products into named accumulators
    assert step.count("lm_vload_i8(") == 2 and step.count("lm_vload_f32(") == 4
    adds = [ln.strip() for ln in step.splitlines() if " += " in ln]
    assert len(adds) == 8 and all(re.fullmatch(r"v\d+ \+= v\d+;", a) for a in adds)
    # four pairs of products share a weight vector and two a row vector: loads held once
    assert step.count("LM_KEEP(") == 4


def test_few_rows_unroll_into_more_accumulator_chains() -> None:
    _, kern = _kernel(_product("Q8_0", 9, 16, 128))
    src = render_kernel(S.apply(kern, _block(2, 1)), []).source  # type: ignore[arg-type]
    block = src[src.index("if (lm_jr >= 2) {") : src.index("lm_jo += lm_jv;")]
    # Q8_0's sum has one addend: 2 rows x 4 unrolled steps fill ACC_CHAINS chains
    assert ACC_CHAINS == 8 and "+= 4) {" in block and block.count("lm_vsum_f32(") == 2
    assert block.count(" = {0}") == 8


def test_the_quantized_register_rule() -> None:
    # accumulators + per column its dequantized vector and scale + three within the registers
    assert qblock_fits(4, 2, 16) and not qblock_fits(5, 2, 16) and not qblock_fits(3, 3, 16)
    assert not qblock_fits(2, 4, 16) and qblock_fits(8, 2, 32) and qblock_fits(4, 4, 32)
    assert SPACE.qblocks == tuple(b for b in QBLOCKS if qblock_fits(*b, vector_registers()))


def test_alternatives_offer_quantized_products_the_quantized_blocks() -> None:
    _, q = _kernel(_product("Q4_1", 8, 64, 128))
    space = ScheduleSpace(jams=(2, 4), blocks=((3, 3),), qblocks=((4, 2), (1, 2)))
    got = {(s.jam, s.jam2, s.order) for s in S.alternatives(q, space) if s.jam2 > 1}
    assert got == {(4, 2, 0), (4, 2, 1), (0, 2, 0), (0, 2, 1)}
    # in each split of the weight's blocks (Q8_0's 32 is not the default)
    splits = {s.split for s in S.alternatives(q, space) if s.jam2 > 1}
    assert splits == {-1, *space.splits}
    # none where the target offers none
    assert not [s for s in S.alternatives(q, replace(space, qblocks=())) if s.jam2 > 1]


def test_rows_longer_than_a_jam_are_offered_no_blocks_of_fewer_rows_than_the_default() -> None:
    # the default is DEFAULT_QBLOCK; jams and blocks of fewer rows differ from it only at
    # row counts the search does not measure at
    _, q = _kernel(_product("Q4_1", sym.dim("batch", 1, 64), 64, 128))
    assert (S.apply(q).schedule.jam, S.apply(q).schedule.jam2) == S.DEFAULT_QBLOCK  # type: ignore[union-attr]
    space = ScheduleSpace(jams=(2, 4, 8), qblocks=((4, 2), (1, 2), S.DEFAULT_QBLOCK))
    alts = S.alternatives(q, space)
    assert {(s.jam, s.jam2) for s in alts} == {(-1, 0), (0, 0), S.DEFAULT_QBLOCK}
    assert {s.order for s in alts} == {0, 1} and {s.split for s in alts} == {-1, 0, *space.splits}


def test_search_keeps_a_quantized_block_and_the_plan_computes_the_same(
    monkeypatch, tmp_path
) -> None:
    use_kernel_cache(monkeypatch, tmp_path)
    monkeypatch.setenv("LUMINAL_SEARCH_CANDIDATES", "64")
    monkeypatch.setenv("LUMINAL_SEARCH_MIN_US", "0")
    tuner.clear_memory_cache()
    g = _product("Q4_1", 7, 40, 96)
    low = lower(graph_passes(g))
    cpu = CpuTarget()

    def measure(sub, dims):
        s = sub.kernels[0].schedule
        return 1.0 if s is not None and (s.jam, s.jam2) == (4, 2) else 2.0

    t = Tuner(measure, "test", cpu.evaluate, space=ScheduleSpace(jams=(4,), qblocks=((4, 2),)))
    out = schedules.choose_schedules(low, t, cpu.signature)
    (k,) = [k for k in out.kernels if isinstance(k, K.Kernel)]
    # the tuner checked the block against the unscheduled kernel before keeping it
    assert k.schedule is not None and (k.schedule.jam, k.schedule.jam2) == (4, 2)
    assert t.stats.rejected == 0 and t.stats.checks >= 1
    x = RNG.standard_normal((7, 96)).astype(np.float32)
    _check(lm.load(build_plan(out).to_bytes()).run({"x": x})["y"], g, x)
    tuner.clear_memory_cache()


def test_gpu_targets_ignore_the_cpu_blocks() -> None:
    from luminal.codegen.cuda.kernel import render_kernel as cuda_kernel
    from luminal.codegen.metal.kernel import render_kernel as metal_kernel

    _, kern = _kernel(_product("Q4_1", 9, 16, 64))
    plain = S.apply(kern, K.Schedule(jam=0))
    assert isinstance(plain, K.Kernel)
    for sched in (_block(4, 2), _block(8, 1), K.Schedule()):
        blocked = S.apply(kern, sched)
        assert isinstance(blocked, K.Kernel)
        assert cuda_kernel(blocked, []).source == cuda_kernel(plain, []).source
        assert metal_kernel(blocked, []).source == metal_kernel(plain, []).source


def test_the_default_jam_halves_where_its_rows_leave_the_l1_cache() -> None:
    # eight f32 rows of k = 576 (18 KiB) fit JAM_ROW_BYTES; of k = 1536 or 4096 they do not
    for k, want in ((576, S.DEFAULT_JAM), (1536, S.DEFAULT_JAM // 2), (4096, S.DEFAULT_JAM // 2)):
        _, kern = _kernel(_product("Q4_1", 8, 8, k))
        sched = S.apply(kern).schedule
        assert sched is not None and sched.jam == want and S.default_jam(kern, 0) == want, k
        # more rows than a jam: the default block, whose few rows run in the same jams
        _, kern = _kernel(_product("Q4_1", 20, 8, k))
        sched = S.apply(kern).schedule
        assert sched is not None and (sched.jam, sched.jam2) == S.DEFAULT_QBLOCK, k
        assert S.default_jam(kern, 0) == want, k
    assert S.DEFAULT_JAM * 576 * 4 <= S.JAM_ROW_BYTES < S.DEFAULT_JAM * 1536 * 4


def test_the_rest_of_the_rows_runs_in_few_blocks() -> None:
    # a jam of 8: 7 or 6 rows run as one block of 8, 3 as one of 4 (each weight block
    # dequantized once), the rows past the rest clamped to the last one and not stored
    _, kern = _kernel(_product("Q4_1", 7, 16, 64))
    src = render_kernel(S.apply(kern, _block(8, 1)), []).source  # type: ignore[arg-type]
    heads = re.findall(r"if \(lm_jr >= (\d+)\) \{", src)
    assert heads == ["6", "3", "2", "1"]
    eight = src[src.index("if (lm_jr >= 6) {") : src.index("if (lm_jr >= 3) {")]
    assert "const int64_t i0j7 = lm_jo + lm_min(7, lm_jv - 1);" in eight
    assert eight.count("if (7 < lm_jv) {") == 1 and "if (0 < lm_jv)" not in eight
    # a block of 2 runs only when 2 rows are left: plain rows and stores
    two = src[src.index("if (lm_jr >= 2) {") : src.index("if (lm_jr >= 1) {")]
    assert "const int64_t i0j1 = lm_jo + 1;" in two and "< lm_jv)" not in two


@pytest.mark.parametrize("sched", [_block(8, 1), _block(8, 1, 1), _block(4, 1)], ids=str)
def test_a_costly_epilogue_runs_along_the_columns(sched: K.Schedule) -> None:
    # a SiLU of a product times another input (a gated MLP's up projection): the block's sums
    # are staged and the epilogue runs as a loop along the columns, per row
    seq = sym.dim("seq", 1, 40)
    g = lm.Graph("gated")
    x = g.input("x", (seq, 96))
    gate = g.input("gate", (seq, 45))
    raw = _random_blocks("Q4_1", 45, 96).reshape(-1)
    w = quants.quantized_weight(g, "w", "Q4_1", raw, (45, 96))
    g.output("y", gate * (gate * -1.0).exp().add(1.0).reciprocal() * (x @ w.transpose(0, 1)))
    low, kern = _kernel(g)
    k = S.apply(kern, sched)
    assert isinstance(k, K.Kernel) and "lm_red[" in render_kernel(k, ["seq"]).source
    cg = lm.load(build_plan(replace(low, kernels=[replace(kern, schedule=sched)])).to_bytes())
    for r in ROWS:
        xv = RNG.standard_normal((r, 96)).astype(np.float32)
        gv = RNG.standard_normal((r, 45)).astype(np.float32)
        ref = g.run({"x": xv, "gate": gv}, seq=r)["y"]
        got = cg.run({"x": xv, "gate": gv}, seq=r)["y"]
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))
