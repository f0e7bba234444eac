"""Panel blocks of products by block-quantized weights (``jam.qblock_panel``,
``codegen/cpu/panel.py``): a block of more rows than the registers hold dequantizes each
column block's weight once into an f32 panel, then runs every row of the task over it in
register blocks. Checked against the reference interpreter at odd row counts and sizes (the
panel's row tails of 4, 2 and 1, its last columns, the row jams of few rows, tasks past the
first block of rows), one plan per schedule serving every row count."""

import re
from dataclasses import replace

import numpy as np
import pytest

import luminal as lm
from luminal.codegen.cpu import panel, render_kernel
from luminal.codegen.cpu.jam import PANEL_ROWS, qblock_fits, qblock_panel
from luminal.compile import build_plan
from luminal.compiler import kernel_ir as K
from luminal.compiler import schedule as S
from luminal.graph import symbolic as sym
from luminal.loaders import quants
from test_loaders import _random_blocks
from test_schedule_qblocks import _block, _check, _kernel, _product

RNG = np.random.default_rng(23)
# 1-8: row jams; 9-15: the panel's row blocks of 4 with every tail; 33, 40: a second task
ROWS = (1, 2, 3, 5, 6, 7, 8, 9, 10, 11, 15, 17, 33, 40)
PANELS = [_block(16, 2), _block(PANEL_ROWS, 2), _block(PANEL_ROWS, 4), _block(PANEL_ROWS, 2, 1),
          _block(PANEL_ROWS, 2, 0, 32)]  # fmt: skip


def _source(k: K.Kernel, sched: K.Schedule) -> str:
    applied = S.apply(k, sched)
    assert isinstance(applied, K.Kernel)
    return render_kernel(applied, ["seq"]).source.rsplit("#endif\n", 1)[-1]


@pytest.mark.parametrize("fmt", ["Q4_1", "Q8_0", "Q4_0"])
@pytest.mark.parametrize("sched", PANELS, ids=lambda s: s.label())
def test_panels_match_the_interpreter_at_odd_sizes(fmt: str, sched: K.Schedule) -> None:
    # 37 weight rows: a column tail in a task's chunk; k = 160: five weight blocks
    seq = sym.dim("seq", 1, 40)
    g = _product(fmt, seq, 37, 160)
    low, kern = _kernel(g)
    assert "lm_pw0" in _source(kern, sched)  # the panel form, not a fallback
    cg = lm.load(build_plan(replace(low, kernels=[replace(kern, schedule=sched)])).to_bytes())
    for r in ROWS:
        x = RNG.standard_normal((r, 160)).astype(np.float32)
        _check(cg.run({"x": x}, seq=r)["y"], g, x, seq=r)


@pytest.mark.parametrize("n", [38, 39])
def test_a_panels_last_columns_at_every_rest(n: int) -> None:
    # chunks of 16 columns end in 6 or 7: a block of 4 columns then one of 2 or 3, each past
    # the last column clamped to it and not stored
    seq = sym.dim("seq", 1, 40)
    g = _product("Q4_1", seq, n, 64)
    low, kern = _kernel(g)
    sched = _block(PANEL_ROWS, 4)
    cg = lm.load(build_plan(replace(low, kernels=[replace(kern, schedule=sched)])).to_bytes())
    for r in (9, 14, 33):
        x = RNG.standard_normal((r, 64)).astype(np.float32)
        _check(cg.run({"x": x}, seq=r)["y"], g, x, seq=r)


def test_a_panel_dequantizes_each_weight_block_once_per_task() -> None:
    _, kern = _kernel(_product("Q8_0", sym.dim("seq", 1, 64), 16, 64))
    src = _source(kern, _block(PANEL_ROWS, 2))
    body = src[src.index(f"if (lm_jr >= {panel.PANEL_MIN_ROWS}) {{") : src.index("} else {")]
    fill = body[: body.index("int64_t lm_jo = lm_j0")]
    rows = body[body.index("for (; lm_jr >= 4;") : body.index("if (lm_jr & 2) {")]
    # the fill: two weight rows' bytes widened and stored, nothing of the rows read
    assert fill.count("lm_vload_i8(") == 2 and fill.count("lm_vstore_f32(") == 2
    assert "lm_vload_f32(" not in fill and fill.count("__builtin_prefetch(") == 2
    # a block of 4 rows by 2 columns: two panel vectors, four row vectors, eight products
    # into named accumulators, no dequantization
    step = rows[rows.index("+= LM_VL) {") :]
    assert "lm_vload_i8(" not in step and step.count("lm_vload_f32(&lm_pw0[") == 2
    assert step.count("lm_vload_f32(&b1[") == 4
    adds = [ln.strip() for ln in step.splitlines() if " += " in ln and "LM_VL" not in ln]
    assert len(adds) == 8 and all(re.fullmatch(r"v\d+ \+= v\d+;", a) for a in adds)


def test_a_panels_loops_are_one_copy_for_every_column_and_row_count() -> None:
    # one fill of the block's columns, those past the chunk's last clamped to it; the
    # register blocks of 4 rows, then of 2 and 1, each a loop over the panel's columns in
    # blocks of 2, a block past the chunk's last column computing that column again, unstored
    _, kern = _kernel(_product("Q4_1", sym.dim("seq", 1, 64), 37, 64))
    src = _source(kern, _block(PANEL_ROWS, 4))
    body = src[src.index(f"if (lm_jr >= {panel.PANEL_MIN_ROWS}) {{") : src.index("} else {")]
    assert body.count("for (int64_t i1 = ") == 1
    assert "const int64_t i1j3 = i1 + lm_min(3, lm_cv - 1);" in body
    assert body.count("lm_vstore_f32(&lm_pw0[3][") == 2  # a Q4_1 byte: two nibbles
    assert re.findall(r"for \(; lm_jr[^;]*;|if \(lm_jr & \d\)", body) == [
        "for (; lm_jr >= 4;", "if (lm_jr & 2)", "if (lm_jr & 1)"
    ]  # fmt: skip
    assert body.count("for (int64_t lm_b = 0; lm_b < lm_cv; lm_b += 2) {") == 3
    assert body.count("const int64_t lm_s1 = lm_min(lm_b + 1, lm_cv - 1);") == 3
    assert body.count("if (lm_b + 1 < lm_cv) {") == 4 + 2 + 1  # the blocks of 4, 2, 1 rows


def test_few_rows_run_as_row_jams_a_column_at_a_time() -> None:
    _, kern = _kernel(_product("Q4_1", sym.dim("seq", 1, 64), 16, 64))
    src = _source(kern, _block(PANEL_ROWS, 2))
    few = src[src.index("} else {") :]
    # the default jam of 8 (6-8 rows clamped to one block), then 4, 2, 1
    assert S.default_jam(kern, 0) == 8
    assert re.findall(r"(while|if) \(lm_jr >= (\d+)\) \{", few) == [
        ("while", "6"), ("if", "3"), ("if", "2"), ("if", "1")
    ]  # fmt: skip
    # one column per step (a block of columns streamed a large weight 2x slower at 1 row)
    assert "const int64_t i1j0 = i1;" in few and "i1j1" not in few


def test_a_panel_too_large_for_its_budget_runs_row_jams(monkeypatch) -> None:
    # a panel of 2 x 160 floats and 4 rows of 160 floats: 3840 bytes
    seq = sym.dim("seq", 1, 40)
    g = _product("Q4_1", seq, 21, 160)
    low, kern = _kernel(g)
    sched = _block(PANEL_ROWS, 2)
    monkeypatch.setattr(panel, "PANEL_BYTES", 3840)
    assert "lm_pw0" in _source(kern, sched)
    monkeypatch.setattr(panel, "PANEL_BYTES", 3839)
    src = _source(kern, sched)
    assert "lm_pw0" not in src and "while (lm_jr >= 6) {" in src
    cg = lm.load(build_plan(replace(low, kernels=[replace(kern, schedule=sched)])).to_bytes())
    for r in (1, 6, 9, 33):
        x = RNG.standard_normal((r, 160)).astype(np.float32)
        _check(cg.run({"x": x}, seq=r)["y"], g, x, seq=r)


def test_a_panel_per_product_under_a_costly_epilogue() -> None:
    # two products by weights of two formats in one kernel, one under an exp: each its own
    # panel, their sums staged and the epilogue run along the columns
    seq = sym.dim("seq", 1, 40)
    g = lm.Graph("two")
    x, z = g.input("x", (seq, 96)), g.input("z", (seq, 64))
    w1 = quants.quantized_weight(g, "w1", "Q4_1", _random_blocks("Q4_1", 45, 96).reshape(-1),
                                 (45, 96))  # fmt: skip
    w2 = quants.quantized_weight(g, "w2", "Q8_0", _random_blocks("Q8_0", 45, 64).reshape(-1),
                                 (45, 64))  # fmt: skip
    g.output("y", (x @ w1.transpose(0, 1)) * (z @ w2.transpose(0, 1) * 1e-3).exp())
    low, kern = _kernel(g)
    sched = _block(PANEL_ROWS, 2)
    src = _source(kern, sched)
    assert "lm_pw0" in src and "lm_pw1" in src and "lm_red[1][lm_r][" in src
    cg = lm.load(build_plan(replace(low, kernels=[replace(kern, schedule=sched)])).to_bytes())
    for r in ROWS:
        xv = RNG.standard_normal((r, 96)).astype(np.float32)
        zv = RNG.standard_normal((r, 64)).astype(np.float32)
        ref = g.run({"x": xv, "z": zv}, seq=r)["y"]
        got = cg.run({"x": xv, "z": zv}, seq=r)["y"]
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))


def test_the_panel_rule() -> None:
    # a block whose accumulators and dequantization do not fit 16 registers, of 9+ rows
    assert qblock_panel(PANEL_ROWS, 2, 16) and qblock_panel(9, 2, 16)
    assert not qblock_panel(8, 2, 16) and not qblock_panel(3, 3, 16)
    assert not qblock_panel(9, 1, 32)  # AVX-512's registers hold it
    # offered where the register block over the panel fits, at PANEL_ROWS rows
    assert qblock_fits(PANEL_ROWS, 2, 16) and qblock_fits(PANEL_ROWS, 4, 16)
    assert not qblock_fits(8, 2, 16) and not qblock_fits(5, 2, 16)
