"""The measured schedule search: alternatives, cost-model ranking, caps, cache, checks."""

import json
import os
from dataclasses import replace

import numpy as np
import pytest

import luminal as lm
import luminal.functional as F
import luminal.runtime
from kernel_cache import use_kernel_cache
from luminal.compile import build_plan
from luminal.compiler import kernel_ir as K
from luminal.compiler import schedule as S
from luminal.compiler.lower import Lowered, lower
from luminal.compiler.pipeline import graph_passes
from luminal.compiler.search import schedules, select, tuner
from luminal.compiler.search.tuner import Timing, Tuner, mismatch
from luminal.graph.ops import Op
from luminal.plan.model import PlanError
from luminal.targets.cpu import CpuTarget
from optest import rand

_CPU = CpuTarget()
_evaluate_cpu, _measure_cpu, _signature = _CPU.evaluate, _CPU.measure, _CPU.signature


@pytest.fixture(autouse=True)
def _fresh_cache(tmp_path, monkeypatch):
    use_kernel_cache(monkeypatch, tmp_path)
    tuner.clear_memory_cache()
    yield
    tuner.clear_memory_cache()


def _gemv(layers: int = 1, n: int = 512) -> lm.Graph:
    g = lm.Graph("gemv")
    x = g.input("x", (1, n))
    for i in range(layers):
        w = g.weight(f"w{i}", data=rand(n, n) / np.float32(np.sqrt(n)))
        x = (x.unsqueeze(1) * w.unsqueeze(0)).sum(-1)  # a GEMV row per output element
    g.output("y", x)
    return g


def _fake_tuner(prefer: str | None = None, **kw):
    """A tuner whose 'measurement' is a fixed table (the candidate named ``prefer`` fastest),
    checking with the real CPU runtime."""
    log = []

    def measure(sub, dims):
        k = sub.kernels[0]
        label = k.schedule.label() if k.schedule is not None else "?"
        log.append((label, dims))
        return 1.0 if label == prefer else 2.0 + len(log) * 1e-3

    return Tuner(measure, "test", _evaluate_cpu, **kw), log


def test_alternatives_are_explicit_schedules_that_change_the_loops():
    low = lower(_gemv())
    (k,) = low.kernels
    alts = S.alternatives(k)
    assert alts[0] == K.Schedule()  # the default first
    assert {s.split for s in alts} == {-1, 0, 8, 16, 32}
    for g in (8, 16, 32):
        v = S.apply(k, K.Schedule(split=g)).value
        assert isinstance(v, K.Reduce) and isinstance(v.body, K.Reduce)
        assert (v.extent, v.body.extent) == (512 // g, g)
    # no split: the kernel as lowered; the default leaves a plain sum alone (as before)
    assert S.apply(k, K.Schedule(split=0)).value is k.value
    assert S.apply(k).value is k.value
    # an elementwise kernel has nothing to search
    g = lm.Graph("ew")
    g.output("y", g.input("x", (4, 300)).exp())
    assert S.alternatives(lower(g).kernels[0]) == []


def test_schedule_search_measures_checks_and_caches_through_the_runtime(capfd, monkeypatch):
    monkeypatch.setenv("LUMINAL_DEBUG", "3")
    # executors made at this level profile their steps; keep them off the table printed at exit
    monkeypatch.setattr(luminal.runtime, "_PROFILED", [])
    monkeypatch.setattr(select, "MIN_GEMM_WORK", 1 << 40)  # keep the kernel, not a gemm call
    g = _gemv()
    before = tuner.STATS.measurements
    cg = lm.compile(g)
    first = tuner.STATS.measurements - before
    err = capfd.readouterr().err
    lines = [ln for ln in err.splitlines() if "[schedule]" in ln]
    assert len(lines) == 1 and "considered" in lines[0] and "-> split=" in lines[0]
    assert "kernels measured" in err  # the summary line
    assert first >= 2  # the default and at least one alternative (split=0 renders as default)
    a = rand(1, 512)
    np.testing.assert_allclose(cg.run({"x": a})["y"], g.run({"x": a})["y"], rtol=1e-4,
                               atol=1e-4)  # fmt: skip
    # a second compile, with the in-memory decisions forgotten: answered from disk, nothing
    # measured, the same kernels chosen
    tuner.clear_memory_cache()
    before = tuner.STATS.measurements
    cg2 = lm.compile(_gemv())
    assert tuner.STATS.measurements == before
    assert "cached -> split=" in capfd.readouterr().err
    assert [bytes(k.code) for k in cg2.plan.kernels] == [bytes(k.code) for k in cg.plan.kernels]


def test_identical_layers_share_one_measurement(monkeypatch):
    monkeypatch.setenv("LUMINAL_SEARCH_CANDIDATES", "64")  # every candidate measured
    low = lower(_gemv(layers=3))
    assert len(low.kernels) == 3
    t, log = _fake_tuner("split=16")
    out = schedules.choose_schedules(low, t, _signature)
    per_kernel = len(log)
    # the other two layers take the first one's decision without asking the tuner again
    assert per_kernel >= 2 and t.stats.searched == 1 and t.stats.cached == 0
    assert all(k.schedule == K.Schedule(16) for k in out.kernels)


def test_a_wrong_candidate_is_dropped_by_the_check(capfd, monkeypatch, tmp_path):
    monkeypatch.setenv("LUMINAL_DEBUG", "1")
    monkeypatch.setenv("LUMINAL_SEARCH_CANDIDATES", "64")  # every candidate is measured

    def doubled(k):  # a "schedule" that changes the value: twice the right answer
        return K.Kernel(k.name, k.shape, k.out, K.Alu(Op.MUL, (k.value, K.Const(2.0, k.dtype)),
                        k.dtype), k.dtype, schedule=K.Schedule(split=0))  # fmt: skip

    monkeypatch.setattr(schedules, "EXTRA_CANDIDATES", [doubled])
    low = lower(_gemv())
    log = []

    def measure(sub, dims):
        wrong = any(isinstance(x, K.Const) and x.value == 2.0 for x in K.walk(sub.kernels[0].value))
        log.append(wrong)
        return 0.5 if wrong else 1.0 + len(log) * 1e-3  # the wrong one is fastest

    t = Tuner(measure, "test", _evaluate_cpu)
    (k,) = schedules.choose_schedules(low, t, _signature).kernels
    assert any(log) and t.stats.rejected == 1  # the wrong candidate was measured, then dropped
    assert not any(isinstance(x, K.Const) and x.value == 2.0 for x in K.walk(k.value))
    assert "test:doubled does not match the reference" in capfd.readouterr().err
    # the verdict is cached with the timings
    (path,) = [p for p in os.listdir(tmp_path / "search") if p.endswith(".json")]
    rec = json.loads((tmp_path / "search" / path).read_text())
    verdicts = {c["label"]: c["verdict"] for c in rec["candidates"]}
    assert verdicts["test:doubled"] is False


def test_a_candidate_that_fails_to_run_is_dropped(capfd, monkeypatch):
    """A candidate whose plan the runtime refuses (an operand read past its buffer) is no
    choice: it is dropped and the search goes on, instead of failing the compile."""
    monkeypatch.setenv("LUMINAL_DEBUG", "1")
    monkeypatch.setenv("LUMINAL_SEARCH_CANDIDATES", "64")

    def doubled(k):
        return K.Kernel(k.name, k.shape, k.out, K.Alu(Op.MUL, (k.value, K.Const(2.0, k.dtype)),
                        k.dtype), k.dtype, schedule=K.Schedule(split=0))  # fmt: skip

    monkeypatch.setattr(schedules, "EXTRA_CANDIDATES", [doubled])
    low = lower(_gemv())

    def measure(sub, dims):
        if any(isinstance(x, K.Const) and x.value == 2.0 for x in K.walk(sub.kernels[0].value)):
            raise PlanError("step 0: operand A reaches outside its buffer")
        return 1.0

    t = Tuner(measure, "test", _evaluate_cpu)
    (k,) = schedules.choose_schedules(low, t, _signature).kernels
    assert t.stats.rejected == 1
    assert not any(isinstance(x, K.Const) and x.value == 2.0 for x in K.walk(k.value))
    assert "test:doubled failed to run and is dropped (PlanError" in capfd.readouterr().err
    (rec,) = tuner._MEMORY.values()
    assert {c["label"]: c["verdict"] for c in rec["candidates"]}["test:doubled"] is False


def test_candidate_cap_and_budget_are_honoured(monkeypatch):
    monkeypatch.setenv("LUMINAL_SEARCH_CANDIDATES", "2")
    low = lower(_gemv())
    t, log = _fake_tuner()
    schedules.choose_schedules(low, t, _signature)
    (rec,) = tuner._MEMORY.values()
    measured = [c["label"] for c in rec["candidates"] if c["seconds"] is not None]
    # splits x rows-per-task, as many as render differently; only two measured
    assert len(log) == 2 and len(rec["candidates"]) > 4 and len(measured) == 2
    assert "split=default" in measured  # the default is always measured
    tuner.clear_memory_cache()
    monkeypatch.setenv("LUMINAL_SEARCH_CANDIDATES", "4")
    monkeypatch.setenv("LUMINAL_SEARCH_BUDGET_S", "0")
    monkeypatch.setenv("LUMINAL_CACHE_DIR", os.environ["LUMINAL_CACHE_DIR"] + "/other")
    t, log = _fake_tuner("split=32")
    (k,) = schedules.choose_schedules(low, t, _signature).kernels
    assert log == [] and t.stats.over_budget == 1 and k.schedule is None  # the default
    monkeypatch.setenv("LUMINAL_SEARCH_CANDIDATES", "0")
    with pytest.raises(ValueError, match="LUMINAL_SEARCH_CANDIDATES"):
        Tuner(lambda s, d: 1.0, "test")


def test_a_slow_first_run_is_the_only_run(monkeypatch):
    sub = lower(_gemv())
    monkeypatch.setenv("LUMINAL_SEARCH_MEASURE_MS", "0")
    t = _measure_cpu(sub, {})
    assert isinstance(t, Timing) and t.runs == 1 and t.outputs is not None
    monkeypatch.setenv("LUMINAL_SEARCH_MEASURE_MS", "1e9")
    assert CpuTarget(repeats=3).measure(sub, {}).runs == 3


def test_choice_is_deterministic_given_the_cache(monkeypatch):
    monkeypatch.setenv("LUMINAL_SEARCH_CANDIDATES", "64")  # every candidate measured
    low = lower(_gemv())
    t1, _ = _fake_tuner("split=8")
    (k1,) = schedules.choose_schedules(low, t1, _signature).kernels
    assert k1.schedule == K.Schedule(8)
    tuner.clear_memory_cache()
    t2, log = _fake_tuner("split=32")  # other 'timings' now: the cached choice stands
    (k2,) = schedules.choose_schedules(low, t2, _signature).kernels
    assert log == [] and k2.schedule == k1.schedule


def test_mismatch_rules():
    a = np.array([1.0, np.nan, np.inf, 100.0], np.float32)
    assert mismatch({"y": a}, {"y": a + np.float32(1e-5)}) is None
    assert "NaNs differ" in mismatch({"y": a}, {"y": np.nan_to_num(a)})
    assert "values differ" in mismatch({"y": a}, {"y": a * 2})
    assert "values differ" in mismatch({"y": np.arange(3)}, {"y": np.arange(3) + 1})
    assert "no output" in mismatch({"y": a}, {"z": a})


def test_task_order_alternative_and_its_cost():
    # few rows by a weight larger than a core's cache: the default order re-reads the weight
    # once per row, order 1 once; the cost model ranks order 1 first, and both compute the same
    from luminal.compiler.search.cost import estimate

    g = lm.Graph("few_rows")
    x = g.input("x", (5, 384))
    g.output("y", F.linear(x, g.weight("w", data=np.ones((1152, 384), np.float32))))
    low = lower(g)
    (kern,) = low.kernels
    scheds = S.alternatives(kern)
    assert any(s.order == 1 for s in scheds) and any(s.order == 0 for s in scheds)
    cost = {
        o: estimate(select.subprogram(low, [replace(kern, schedule=K.Schedule(order=o))]), {})
        for o in (0, 1)
    }
    assert cost[1] < cost[0]
    xv = np.random.default_rng(0).standard_normal((5, 384)).astype(np.float32)
    for o in (0, 1):
        k = replace(kern, schedule=K.Schedule(order=o))
        plan = build_plan(Lowered(low.buffers, [k], low.dims, low.weights), "few_rows")
        got = lm.load(plan.to_bytes()).run({"x": xv})["y"]
        np.testing.assert_allclose(got, xv @ np.ones((384, 1152), np.float32), rtol=1e-5)


def test_kernels_too_small_to_pay_for_a_search_keep_their_default(monkeypatch):
    low = lower(_gemv(n=32))  # a 32x32 GEMV: a few microseconds by the cost model
    t, log = _fake_tuner(prefer="split=16")
    (k,) = schedules.choose_schedules(low, t, _signature).kernels
    assert log == [] and k.schedule is None
    monkeypatch.setenv("LUMINAL_SEARCH_MIN_US", "0")
    monkeypatch.setenv("LUMINAL_SEARCH_CANDIDATES", "64")  # every candidate measured
    t, log = _fake_tuner(prefer="split=16")
    (k,) = schedules.choose_schedules(low, t, _signature).kernels
    assert log and k.schedule is not None and k.schedule.label() == "split=16"


def test_racing_runs_a_clear_loser_once():
    """With a racing target, a candidate whose first run is RACE_MARGIN times the fastest so
    far is measured by that run alone; the decision is the same as without racing."""
    low = lower(_gemv())
    calls = []

    def measure(sub, dims, cutoff=None):
        k = sub.kernels[0]
        calls.append((k.schedule.label() if k.schedule is not None else "?", cutoff))
        secs = 0.004 if len(calls) == 2 else 0.5  # the second candidate measured is fastest
        return Timing(secs, 1 if cutoff is not None and secs > cutoff else 5)

    kernels, labels = {}, {}
    for races in (False, True):
        tuner.clear_memory_cache()
        calls.clear()
        t = Tuner(measure, f"race{races}", _evaluate_cpu, races=races)
        (kernels[races],) = schedules.choose_schedules(low, t, _signature).kernels
        labels[races] = [lab for lab, _ in calls]
        cutoffs = [c for _, c in calls]
        assert len(calls) >= 3
        if races:
            assert cutoffs[0] is None
            assert cutoffs[1] == pytest.approx(tuner.RACE_MARGIN * 0.5)
            assert cutoffs[2] == pytest.approx(max(tuner.RACE_MARGIN * 0.004, tuner.RACE_FLOOR_S))
        else:
            assert all(c is None for c in cutoffs)
    assert labels[True] == labels[False]
    assert kernels[True].schedule == kernels[False].schedule
    assert kernels[True].schedule is not None
    assert kernels[True].schedule.label() == labels[True][1]


def test_cpu_measure_stops_at_the_cutoff():
    low = lower(_gemv(n=256))
    dims: dict[str, int] = {}
    assert _measure_cpu(low, dims, cutoff=1e-9).runs == 1
    assert _measure_cpu(low, dims).runs == _CPU.repeats


def test_a_stage_prepares_every_kernels_candidates_in_one_batch():
    g = lm.Graph("two")
    x = g.input("x", (1, 512))
    w0 = g.weight("w0", data=rand(512, 512))
    w1 = g.weight("w1", data=rand(384, 512))
    h = (x.unsqueeze(1) * w0.unsqueeze(0)).sum(-1)
    g.output("y", (h.unsqueeze(1) * w1.unsqueeze(0)).sum(-1))
    batches: list[int] = []
    measured: list[int] = []

    def measure(sub, dims):
        measured.append(id(sub))
        return 1.0

    def prepare(subs, wait=True):
        batches.append((len(subs), wait))

    t = Tuner(measure, "batch", None, prepare=prepare)
    schedules.choose_schedules(lower(g), t, _signature)
    assert t.stats.searched == 2  # two kernels, two decisions ...
    # ... each handed over to compile in the background as it is listed, with its reference
    # (unblocked: the default blocks these products, so the kept candidate is checked
    # against a program of its own), then one waiting call before the first measurement
    assert [w for _, w in batches] == [False, False, True]
    assert sum(n for n, _ in batches) == len(set(measured)) + 2 and batches[-1][0] == 0


@pytest.mark.parametrize("idle", [True, False])
def test_background_compiles_finish_before_a_measurement(monkeypatch, idle):
    """The candidates handed over while a stage lists them compile on a background thread
    where a core is idle (else when the stage waits), never while a measured run is timed;
    the plan still computes what the interpreter does."""
    import threading
    import time

    from luminal import _rt
    from luminal.targets import cpu as cpu_target

    monkeypatch.setattr(cpu_target, "_idle_core", lambda: idle)

    monkeypatch.setattr(select, "MIN_GEMM_WORK", 1 << 40)  # keep generated kernels
    monkeypatch.setattr(luminal.runtime, "_PROFILED", [])
    compiling: list[tuple[float, float, str]] = []
    runs: list[tuple[float, float]] = []
    real_prepare, real_run = _rt.prepare, luminal.runtime.Executor.run

    def prepare(*a, **kw):
        t0 = time.perf_counter()
        try:
            return real_prepare(*a, **kw)
        finally:
            compiling.append((t0, time.perf_counter(), threading.current_thread().name))

    def run(self, *a, **kw):
        t0 = time.perf_counter()
        try:
            return real_run(self, *a, **kw)
        finally:
            runs.append((t0, time.perf_counter()))

    monkeypatch.setattr(_rt, "prepare", prepare)
    monkeypatch.setattr(luminal.runtime.Executor, "run", run)
    g = lm.Graph("three")
    x = g.input("x", (2, 256))
    for i, n in enumerate((384, 256, 320)):
        w = g.weight(f"w{i}", data=rand(n, x.shape[-1]) / np.float32(16))
        x = (x.unsqueeze(1) * w.unsqueeze(0)).sum(-1)
    g.output("y", x)
    cg = lm.compile(g)
    assert compiling and runs
    if not idle:  # a busy machine: nothing compiles beside the caller's Python
        assert all(name == "MainThread" for _, _, name in compiling)
    for a0, a1, _ in compiling:
        assert not any(b0 < a1 and a0 < b1 for b0, b1 in runs)
    a = rand(2, 256)
    np.testing.assert_allclose(cg.run({"x": a})["y"], g.run({"x": a})["y"], rtol=1e-4,
                               atol=1e-4)  # fmt: skip


def test_kernels_no_decision_measures_are_compiled_before_the_plan_loads(tmp_path, monkeypatch):
    """The search hands the kernels it does not measure (an elementwise kernel here) to the
    target to compile in the background while the later stages run: loading the plan then
    compiles nothing, and it computes what the interpreter does."""
    import glob

    monkeypatch.setattr(select, "MIN_GEMM_WORK", 1 << 40)  # keep generated kernels
    g = lm.Graph("tail")
    x = g.input("x", (2, 256))
    w = g.weight("w", data=rand(320, 256) / np.float32(16))
    h = (x.unsqueeze(1) * w.unsqueeze(0)).sum(-1)
    g.output("y", (h.exp() + h.sin()) * h)
    cg = lm.compile(g, cache=False, load=False)
    kernels = glob.glob(str(tmp_path / "cpu-*"))
    a = rand(2, 256)
    got = cg.run({"x": a})["y"]  # loads the plan
    assert sorted(glob.glob(str(tmp_path / "cpu-*"))) == sorted(kernels)
    np.testing.assert_allclose(got, g.run({"x": a})["y"], rtol=1e-4, atol=1e-4)


def test_measured_programs_run_their_schedule():
    # the search times cut-out programs of unscheduled kernels: code generation applies each
    # one's schedule, so what is timed is what the plan runs (a blocked quantized GEMV
    # unsplit is a scalar loop with an index division per element, 10-30x slower)
    from luminal.compiler.pipeline import graph_passes
    from luminal.loaders import quants
    from test_loaders import _random_blocks

    g = lm.Graph("q8")
    x = g.input("x", (3, 64))
    w = quants.quantized_weight(g, "w", "Q8_0", _random_blocks("Q8_0", 24, 64).reshape(-1),
                                (24, 64))  # fmt: skip
    g.output("y", x @ w.transpose(0, 1))
    low = lower(graph_passes(g))
    (kern,) = low.kernels
    for sched in (None, K.Schedule(split=32), K.Schedule(jam=2, jam_dim=0)):
        k = replace(kern, schedule=sched)
        done = S.apply(k)
        assert isinstance(done, K.Kernel) and done.scheduled
        assert S.apply(done) is done  # applied once: a split is not split again
        plan = _CPU.build_plan(select.subprogram(low, [k]), "measure")
        (code,) = {bytes(c.code).decode() for c in plan.kernels}
        assert "lm_vsum_f32" in code  # the split sum's vector form
        assert _signature(k, []) == _signature(done, [])
    with pytest.raises(ValueError, match="applied"):
        S.apply(S.apply(kern), K.Schedule(split=8))


def test_schedule_signatures_are_kept_on_disk(tmp_path, monkeypatch):
    """Telling a kernel's schedules apart renders each one once per code version: a new
    process reads the signatures instead; a damaged file or another code version renders
    them again."""
    import luminal.plan_cache
    import luminal.targets.cpu as tc

    (kern,) = lower(_gemv()).kernels
    ks = [replace(kern, schedule=s) for s in (None, K.Schedule(split=8), K.Schedule(split=32))]
    tc._SIGNATURE_FILES.clear()
    first = [_signature(k, []) for k in ks]
    assert len(set(first)) == 3
    rendered: list[str] = []
    real = tc.render
    monkeypatch.setattr(tc, "render", lambda k, names: rendered.append(k.name) or real(k, names))

    def again() -> list:
        tc._SIGNATURE_FILES.clear()  # as a new process
        return [_signature(k, []) for k in ks]

    assert again() == first and rendered == []
    (path,) = (tmp_path / "search").glob("signatures-*.txt")
    path.write_text("torn\n")
    assert again() == first and len(rendered) == 3
    assert again() == first and len(rendered) == 3  # written back
    monkeypatch.setattr(luminal.plan_cache, "_CODE_ID", "another-version")
    assert again() == first and len(rendered) == 6
    assert len(list((tmp_path / "search").glob("signatures-*.txt"))) == 2


def test_measured_slots_spread_over_distinct_structures_among_ties():
    # a 2-D block default tied with its chunk and order variants, two other blocks a little
    # dearer (within the margin), one far dearer: each block and the other task order get a
    # slot before a chunk variant of the default
    block = lambda r, c, order=0, chunk=0: ((0, r, c), order, -1, chunk)  # noqa: E731
    groups = [block(3, 3), block(3, 3, chunk=8), block(3, 3, chunk=32), block(3, 3, order=1),
              block(4, 2), block(2, 4), block(8, 1)]  # fmt: skip
    costs = [1.0, 1.0, 1.0, 1.0, 1.02, 1.02, 2.0]
    assert tuner.spread_order(costs, groups, 0, 4) == [0, 4, 5, 3]
    # past the margin, cost decides before structure: the far dearer block comes last
    assert tuner.spread_order(costs, groups, 0, 7) == [0, 4, 5, 3, 1, 2, 6]
    # candidates without a group are each their own (a library call's): cost order
    t = Tuner(lambda s, d: 1.0, "test", max_candidates=3)
    cands = [tuner.Candidate(f"c{i}", None, c) for i, c in enumerate([3.0, 1.0, 2.0, 1.0])]
    assert t._measured(cands, 0) == [0, 1, 3]
    # with groups the tuner spreads the same way
    cands = [tuner.Candidate(str(i), None, c, group=g)
             for i, (c, g) in enumerate(zip(costs, groups, strict=True))]  # fmt: skip
    assert t._measured(cands, 0) == [0, 4, 5]


def test_a_schedule_search_measures_the_blocks_the_model_nearly_ties(monkeypatch):
    # x(32,128) @ w(128,512): the default 3x3 block, its chunk and order variants score the
    # same; the 4x2 and 2x4 blocks 2-3% more. The 3 slots past the default go to both blocks
    # and the other order, not to chunk variants the model cannot tell from the default
    monkeypatch.setenv("LUMINAL_SEARCH_CANDIDATES", "4")
    g = lm.Graph("mm")
    x = g.input("x", (32, 128))
    w = g.weight("w", data=rand(128, 512))
    g.output("y", x @ w)
    space = replace(S.ScheduleSpace(), jams=(2, 4, 8), blocks=((4, 2), (2, 4)))
    t, log = _fake_tuner(space=space)
    low = lower(graph_passes(g))  # the weight transposed: the default is a 3x3 block
    schedules.choose_schedules(low, t, _signature)
    labels = [label for label, _ in log]
    assert sorted(labels) == ["split=default", "split=default,jam=2@0,jam2=4",
                              "split=default,jam=4@0,jam2=2", "split=default,order=1"]  # fmt: skip


@pytest.mark.parametrize("k,fits", [(576, True), (1536, False)])
def test_a_jam_whose_rows_leave_the_l1_is_estimated_as_half_of_it(k, fits):
    # Q4_1 by 32 rows: 8 rows of k f32 activations within JAM_ROW_BYTES (576: 18 KiB) make a
    # jam of 8 cheaper than 4; past it (1536: 48 KiB) they tie, and the search measures both
    from luminal.compiler.search.cost import estimate
    from luminal.targets.cpu import COST
    from test_schedule_qblocks import _product

    low = lower(graph_passes(_product("Q4_1", 32, 576, k)))
    (kern,) = [s for s in low.kernels if isinstance(s, K.Kernel)]
    jammed = lambda j: replace(kern, schedule=K.Schedule(-1, 0, 0, j, 0))  # noqa: E731
    cost = {j: estimate(select.subprogram(low, [jammed(j)]), {}, COST) for j in (2, 4, 8)}
    assert cost[2] > cost[4]
    assert (cost[8] < cost[4]) if fits else (cost[8] == cost[4])
