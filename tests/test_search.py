"""Fusion and library-call choices: what comes out of lowering and the measured search."""

import numpy as np
import pytest

import luminal as lm
import luminal.functional as F
from kernel_cache import use_kernel_cache
from luminal.compile import build_plan
from luminal.compiler import kernel_ir as K
from luminal.compiler.lower import lower
from luminal.compiler.search import select
from luminal.compiler.search.gemm import match_gemm
from optest import rand

SEQ = lm.dim("seq", 1, 4096)


@pytest.mark.parametrize(
    "name,fn",
    [
        ("softmax", lambda x: x.softmax(-1)),
        ("layer_norm", lambda x: F.layer_norm(x, (96,))),
        ("rms_norm", lambda x: F.rms_norm(x, (96,))),
        ("log_softmax", lambda x: x.log_softmax(-1)),
    ],
)
def test_normalizations_fuse_to_at_most_two_kernels(name, fn):
    g = lm.Graph(name)
    x = g.input("x", (SEQ, 96))
    g.output("y", fn(x))
    assert len(lower(g).kernels) <= 2
    cg = lm.compile(g)
    for s in (1, 7, 300):
        a = rand(s, 96)
        np.testing.assert_allclose(
            cg.run({"x": a})["y"], g.run({"x": a})["y"], rtol=1e-4, atol=1e-5
        )


def _mm_graph(bias: bool) -> lm.Graph:
    g = lm.Graph("mm")
    x = g.input("x", (SEQ, 64))
    w = g.weight("w", data=rand(48, 64))
    # broadcast multiply + sum, written out by hand: no matmul op anywhere
    y = (x.unsqueeze(1) * w.unsqueeze(0)).sum(-1)
    if bias:
        y = (y + g.weight("b", data=rand(48))).relu()
    g.output("y", y)
    return g


def test_candidates_are_measured_at_the_callers_typical_dims(tmp_path, monkeypatch):
    # a torch.compile call traced at seq 24 is tuned there (and at seq's smallest), not at the
    # default budget; the value is clamped to the dim's range, and dims without one share it
    use_kernel_cache(monkeypatch, tmp_path)
    low = lower(_mm_graph(False))
    default = select.representative_dims(low)["seq"]
    sizes = []

    def measure(sub, dims):
        sizes.append(dims["seq"])
        return 1.0

    token = select.TYPICAL_DIMS.set({"seq": 24})
    try:
        assert select.representative_dims(low) == {"seq": 24}
        select.choose_library_calls(low, measure, "typical")
    finally:
        select.TYPICAL_DIMS.reset(token)
    assert sizes and set(sizes) == {24, 1} and default != 24
    token = select.TYPICAL_DIMS.set({"seq": 10**9, "other": 3})
    try:
        assert select.representative_dims(low) == {"seq": 4096}
    finally:
        select.TYPICAL_DIMS.reset(token)
    g = _mm_graph(False)
    cg = lm.compile(g, typical_dims={"seq": 24, "unused": 5}, cache=False)
    a = rand(24, 64)
    np.testing.assert_allclose(cg.run({"x": a})["y"], g.run({"x": a})["y"], rtol=1e-4, atol=1e-4)


def test_measurements_see_how_much_of_the_program_passes_between_runs(tmp_path, monkeypatch):
    # a step of a program that fits the caches is timed on inputs the rest of the program has
    # passed over (a few copies, or none), one of a larger program on inputs none of it holds;
    # decisions of the first kind are cached apart
    from luminal.compiler.search.tuner import PROGRAM_BYTES, Tuner
    from luminal.targets import cpu

    use_kernel_cache(monkeypatch, tmp_path)
    llc = 4 << 20
    monkeypatch.setattr(cpu, "_last_level_cache", lambda: llc)
    target = cpu.CpuTarget()
    inputs = {"a": np.zeros(1 << 16, np.float32)}  # 256 KB
    size = inputs["a"].nbytes
    seen = {}
    for program in (None, size, 3 * size, 100 * llc):
        token = PROGRAM_BYTES.set(program)
        try:
            ring = target._ring(inputs)
            seen[program] = (0 if ring is None else len(ring.sets), target.measure_context())
        finally:
            PROGRAM_BYTES.reset(token)
    assert seen[None] == (1 + 2 * llc // size, "")
    assert seen[100 * llc] == seen[None]
    assert seen[size] == (0, "program<=262144")
    assert seen[3 * size] == (3, "program<=1048576")

    programs = []
    real = cpu.CpuTarget.measure

    def measure(self, low, dims, cutoff=None):
        programs.append(PROGRAM_BYTES.get())
        return real(self, low, dims, cutoff)

    monkeypatch.setattr(cpu.CpuTarget, "measure", measure)
    g = _mm_graph(True)
    lm.compile(g, typical_dims={"seq": 20}, cache=False)
    want = (20 * 64 + 48 * 64 + 48 + 20 * 48) * 4  # x, w, b, relu(x @ w.T + b) at seq 20
    # one size for the whole compile: a decision the fusion stage takes again is cached once
    assert len(set(programs)) == 1 and want <= programs[0] <= 2 * want

    keys = []
    for context in ("", "program<=4096"):
        t = Tuner(lambda sub, dims: 1.0, "ctx", context=lambda c=context: c)
        low = lower(_mm_graph(False))
        keys.append(t._cached("gemm", {"seq": 4}, low, [])[0])
    assert keys[0] != keys[1]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("prefer", ["gemm", "generated", "order=1"])
def test_sum_of_products_becomes_gemm_or_kernel_by_measurement(bias, prefer, tmp_path, monkeypatch):
    use_kernel_cache(monkeypatch, tmp_path)
    g = _mm_graph(bias)
    low = lower(g)
    assert match_gemm(low.kernels[0], len(low.buffers)) is not None
    calls = []

    sizes = []

    def measure(sub, dims):
        has_lib = any(isinstance(s, K.LibCall) for s in sub.kernels)
        calls.append(has_lib)
        sizes.append(dims["seq"])
        if has_lib:
            return 1.0 if prefer == "gemm" else 3.0
        order = sub.kernels[0].schedule.order if sub.kernels[0].schedule else 0
        return 1.0 if prefer == ("order=1" if order else "generated") else 2.0

    chosen = select.choose_library_calls(low, measure, "test")
    # all measured, in the cost model's order: the library call ranks first, then the
    # generated kernel in its two task orders; each at the representative size and at the
    # dim's smallest (the plan serves both)
    assert calls == [True, True, False, False, False, False]
    assert sizes == [select.representative_dims(low)["seq"], 1] * 3
    libs = [s for s in chosen.kernels if isinstance(s, K.LibCall)]
    assert len(libs) == (1 if prefer == "gemm" else 0)
    if prefer != "gemm":
        (k,) = chosen.kernels
        assert (k.schedule.order if k.schedule else 0) == (prefer == "order=1")
    if prefer == "gemm":
        assert libs[0].func == "gemm" and libs[0].fields["trans_b"] == 1
    plan = build_plan(chosen, "mm")
    ex = lm.load(plan.to_bytes())
    for s in (1, 7, 300):
        a = rand(s, 64)
        np.testing.assert_allclose(
            ex.run({"x": a})["y"], g.run({"x": a})["y"], rtol=1e-4, atol=1e-4
        )
    # a second search of the same graph is answered from the cache: nothing is measured
    calls.clear()
    select.choose_library_calls(lower(_mm_graph(bias)), measure, "test")
    assert calls == []


def test_gemm_premises_reject_padded_and_integer_operands():
    g = lm.Graph("nogemm")
    x = g.input("x", (5, 8), lm.i32)
    w = g.input("w", (3, 8), lm.i32)
    g.output("y", (x.unsqueeze(1) * w.unsqueeze(0)).sum(-1))
    low = lower(g)
    assert match_gemm(low.kernels[0], len(low.buffers)) is None
    g2 = lm.Graph("padded")
    x2 = g2.input("x", (5, 8))
    w2 = g2.input("w", (3, 6))
    wp = F.pad(w2, (1, 1))  # reads of padding give 0: not a plain strided operand
    g2.output("y", (x2.unsqueeze(1) * wp.unsqueeze(0)).sum(-1))
    low2 = lower(g2)
    assert match_gemm(low2.kernels[0], len(low2.buffers)) is None


def test_batched_matmul_gemm_matches():
    g = lm.Graph("bmm")
    a = g.input("a", (3, SEQ, 16))
    b = g.input("b", (3, 16, 24))
    g.output("y", a @ b)
    low = lower(g)
    alt = match_gemm(low.kernels[0], len(low.buffers))
    assert alt is not None and alt.call.fields["trans_b"] == 0
    chosen = select.choose_library_calls(
        low, lambda sub, d: 1.0 if any(isinstance(s, K.LibCall) for s in sub.kernels) else 2.0, "t"
    )
    ex = lm.load(build_plan(chosen, "bmm").to_bytes())
    for s in (1, 33):
        ia, ib = rand(3, s, 16), rand(3, 16, 24)
        np.testing.assert_allclose(ex.run({"a": ia, "b": ib})["y"], ia @ ib, rtol=1e-4, atol=1e-4)


def test_sum_of_batched_products_is_not_a_gemm_over_an_outer_loop():
    """sum over heads of per-head products: the e-graph may put the head sum around the inner
    one in a single kernel; a gemm call cannot take the outer loop's variable as an offset."""
    rng = np.random.default_rng(3)
    g = lm.Graph("heads")
    seq = lm.dim("seq", 1, 64)
    o = g.input("o", (3, seq, 64))
    w = g.input("w", (3, 64, 40))
    g.output("y", o.matmul(w).sum_reduce([0]))
    ov = rng.standard_normal((3, 33, 64)).astype(np.float32)
    wv = rng.standard_normal((3, 64, 40)).astype(np.float32)
    y = lm.compile(g).run({"o": ov, "w": wv})["y"]
    np.testing.assert_allclose(y, np.einsum("hsk,hkn->sn", ov, wv), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("bias", [False, True])
def test_a_range_whose_ends_want_other_programs_is_split(bias, tmp_path, monkeypatch):
    use_kernel_cache(monkeypatch, tmp_path)
    g = _mm_graph(bias)
    low = lower(g)

    def measure(sub, dims):
        n = dims["seq"]
        if any(isinstance(s, K.LibCall) for s in sub.kernels):
            return 50e-6 + 0.1e-6 * n  # a fixed cost (say, a weight copy), cheap rows
        return 2e-6 * n  # a generated kernel that redoes its weight work per row

    chosen = select.choose_library_calls(low, measure, "test")
    # the lines cross at n = 50 / 1.9 = 26.3: the generated kernel up to 26, the call after
    gens = [s for s in chosen.kernels if isinstance(s, K.Kernel) and s.when == (("seq",), 1, 26)]
    libs = [s for s in chosen.kernels if isinstance(s, K.LibCall)]
    assert len(gens) == 1 and gens[0].name == low.kernels[0].name
    assert [c.when for c in libs] == [(("seq",), 27, 4096)]
    assert all(s.when is not None for s in chosen.kernels)
    plan = build_plan(chosen, "mm")
    assert " when " in plan.describe()
    ex = lm.load(plan.to_bytes())
    for s in (1, 26, 27, 300):
        a = rand(s, 64)
        np.testing.assert_allclose(
            ex.run({"x": a})["y"], g.run({"x": a})["y"], rtol=1e-4, atol=1e-4
        )
    # a split plan is a variant of by_dim like any other: its conditions and the variant's hold
    merged = lm.plan.by_dim([plan, plan], "seq", [1, 100])
    ex = lm.load(merged.to_bytes())
    for s in (1, 27, 99, 100, 150):
        a = rand(s, 64)
        np.testing.assert_allclose(
            ex.run({"x": a})["y"], g.run({"x": a})["y"], rtol=1e-4, atol=1e-4
        )


def test_a_range_of_two_free_dims_is_split_on_their_product(tmp_path, monkeypatch):
    """batch x seq rows: which program wins follows the rows, so the parts are ranges of the
    product (a batch of sentences, one long sentence), not of one dim."""
    use_kernel_cache(monkeypatch, tmp_path)
    g = lm.Graph("bmm")
    batch, seq = lm.dim("batch", 1, 64), lm.dim("seq", 1, 128)
    x = g.input("x", (batch, seq, 64))
    w = g.weight("w", data=rand(48, 64))
    g.output("y", (x.unsqueeze(2) * w.unsqueeze(0).unsqueeze(0)).sum(-1))
    low = lower(g)
    sizes: list[tuple[int, int]] = []

    def measure(sub, dims):
        sizes.append((dims["batch"], dims["seq"]))
        n = dims["batch"] * dims["seq"]
        if any(isinstance(s, K.LibCall) for s in sub.kernels):
            return 50e-6 + 0.1e-6 * n
        return 2e-6 * n

    chosen = select.choose_library_calls(low, measure, "test")
    gens = [s for s in chosen.kernels if isinstance(s, K.Kernel) and s.when is not None]
    libs = [s for s in chosen.kernels if isinstance(s, K.LibCall)]
    assert [s.when for s in gens] == [(("batch", "seq"), 1, 26)]
    assert [c.when for c in libs] == [(("batch", "seq"), 27, 64 * 128)]
    # measured at the two ends of the whole range only: 1 x 1 and 16 x 16 rows
    assert set(sizes) == {(1, 1), (16, 16)}
    ex = lm.load(build_plan(chosen, "bmm").to_bytes())
    for b, s_ in ((1, 1), (2, 13), (3, 9), (1, 27), (5, 40)):
        a = rand(b, s_, 64)
        np.testing.assert_allclose(
            ex.run({"x": a})["y"], g.run({"x": a})["y"], rtol=1e-4, atol=1e-4
        )


def test_split_parts_keeping_generated_kernels_of_other_orders_get_their_own_names(
    tmp_path, monkeypatch
):
    use_kernel_cache(monkeypatch, tmp_path)
    g = _mm_graph(False)
    low = lower(g)

    def measure(sub, dims):
        n = dims["seq"]
        if any(isinstance(s, K.LibCall) for s in sub.kernels):
            return 1.0  # never chosen
        order = sub.kernels[0].schedule.order if sub.kernels[0].schedule else 0
        return 2e-6 * n if order == 0 else 50e-6 + 0.1e-6 * n  # orders cross at 26.3

    chosen = select.choose_library_calls(low, measure, "test")
    names = [k.name for k in chosen.kernels]
    assert len(chosen.kernels) == 2 and len(set(names)) == 2
    orders = [k.schedule.order if k.schedule else 0 for k in chosen.kernels]
    assert orders == [0, 1]
    ex = lm.load(build_plan(chosen, "mm").to_bytes())  # distinct code, distinct entry points
    for s in (1, 26, 27, 300):
        a = rand(s, 64)
        np.testing.assert_allclose(
            ex.run({"x": a})["y"], g.run({"x": a})["y"], rtol=1e-4, atol=1e-4
        )


def test_library_calls_of_a_program_are_prepared_together_and_renumbered(tmp_path, monkeypatch):
    """Every kernel's candidates are prepared in one batch, numbered as if every call were
    kept; a kept call's buffers follow the program's, and the program computes the same."""
    from luminal.compiler.search.tuner import Tuner
    from luminal.targets.cpu import CpuTarget

    use_kernel_cache(monkeypatch, tmp_path)
    g = lm.Graph("two_mm")
    x = g.input("x", (SEQ, 64))
    w0, w1 = g.weight("w0", data=rand(48, 64)), g.weight("w1", data=rand(40, 48))
    h = (x.permute((1, 0)).unsqueeze(2) * w0.permute((1, 0)).unsqueeze(1)).sum(0).exp()
    g.output("y", ((h.unsqueeze(1) * w1.unsqueeze(0)).sum(-1) * 0.01).exp())
    low = lower(g)
    batches = []
    first = low.kernels[0].name

    def measure(sub, dims):  # the first kernel (a product buffer) stays generated
        has_lib = any(isinstance(s, K.LibCall) for s in sub.kernels)
        mine = any(s.name.startswith(first) for s in sub.kernels)
        return (2.0 if mine else 1.0) if has_lib else 1.5

    def prepare(subs, wait=True):
        batches.append((subs, wait))

    tuner = Tuner(measure, "renumber", CpuTarget().evaluate, prepare=prepare)
    dims = select.representative_dims(low)
    assert all(select._options(low, k, list(low.buffers), tuner, dims).extra for k in low.kernels)
    chosen = select.choose_library_calls(low, tuner)
    # each decision handed over as it is listed, then one waiting call before measuring
    assert [w for _, w in batches] == [False, False, True]
    assert isinstance(chosen.kernels[0], K.Kernel)
    assert any(isinstance(s, K.LibCall) for s in chosen.kernels[1:])
    for prefer_first in (False, True):  # and when both take the library (no renumbering)
        if prefer_first:
            first = "none"
            tuner = Tuner(measure, "renumber2", CpuTarget().evaluate)
            chosen = select.choose_library_calls(low, tuner)
            assert not any(isinstance(s, K.Kernel) and s.name == low.kernels[0].name
                           for s in chosen.kernels)  # fmt: skip
        assert [b.id for b in chosen.buffers] == list(range(len(chosen.buffers)))
        ex = lm.runtime.Executor(build_plan(chosen, "cpu"))
        a = rand(5, 64) * np.float32(0.05)
        np.testing.assert_allclose(ex.run({"x": a}, {"seq": 5})["y"], g.run({"x": a})["y"],
                                   rtol=1e-4, atol=1e-4)  # fmt: skip


@pytest.mark.parametrize(
    "fmt,rows,n,k,first",
    [
        ("Q4_1", 32, 1536, 576, "generated"),
        ("Q4_1", 1, 576, 576, "generated"),
        ("f32", 128, 768, 768, "gemm"),
    ],
)
def test_the_cpu_cost_model_ranks_products_as_they_measured(fmt, rows, n, k, first):
    # a product by a quantized weight measured 3-14x faster generated than as a dequantized
    # copy and a GEMM (SmolLM2's shapes), an f32 product of BERT's size 1.2-1.5x slower than
    # the GEMM (targets/cpu.py: reduce_speedup): the measured-first candidate ranks first
    from luminal.compiler.pipeline import graph_passes
    from luminal.compiler.search.tuner import Tuner
    from luminal.targets.cpu import COST
    from test_search_rules import _product

    low = lower(graph_passes(_product(fmt, rows, n, k)))
    t = Tuner(lambda s, d: 1.0, "test", cost=COST)
    dims = select.representative_dims(low)
    buffers = list(low.buffers)
    (choice,) = [c for s in low.kernels if (c := select._options(low, s, buffers, t, dims))]
    cands = select._candidates(low, buffers + choice.extra, choice, t, dims)
    assert any("gemm" in c.label for c in cands)
    assert min(cands, key=lambda c: c.cost).label == first


@pytest.mark.parametrize("typical", [False, True])
def test_the_smallest_sizes_weigh_by_the_time_they_add_at_the_callers_typical_dims(
    typical, tmp_path, monkeypatch
):
    """Candidate "a" runs 1.25x faster at the representative sizes and 2x slower at the
    range's smallest, where both take microseconds. Without typical dims from the caller
    the minimax by ratio keeps "b"; at the caller's typical dims "a" loses 5 us there
    against 250 us won where the graph runs, and is kept."""
    from dataclasses import replace

    from luminal.compiler.search.tuner import TYPICAL_DIMS, Candidate, Tuner

    use_kernel_cache(monkeypatch, tmp_path)
    low = lower(_mm_graph(False))
    subs = {"a": replace(low), "b": replace(low)}
    seen = []

    def measure(sub, dims):
        label = "a" if sub is subs["a"] else "b"
        seen.append(dims["seq"])
        if dims["seq"] == 1:
            return {"a": 10e-6, "b": 5e-6}[label]
        return {"a": 1000e-6, "b": 1250e-6}[label]

    token = TYPICAL_DIMS.set({"seq": 24} if typical else {})
    try:
        tuner = Tuner(measure, f"test-{typical}")
        cands = [Candidate("b", subs["b"], 1.0), Candidate("a", subs["a"], 1.0)]
        dims = select.representative_dims(low)
        got = tuner.choose("mm", "test", dims, subs["b"], cands)
    finally:
        TYPICAL_DIMS.reset(token)
    assert 1 in seen, "the smallest sizes were not measured"
    assert got.label == ("a" if typical else "b")


def _gather_depth(v: K.Value) -> int:
    """The deepest nest of gathers in a value tree."""
    memo: dict[int, int] = {}

    def depth(x: K.Value) -> int:
        if id(x) not in memo:
            below = max(map(depth, _children(x)), default=0)
            memo[id(x)] = int(isinstance(x, K.Gather)) + below
        return memo[id(x)]

    return depth(v)


def _children(x: K.Value) -> list[K.Value]:
    if isinstance(x, K.Alu):
        return list(x.srcs)
    if isinstance(x, K.Cast):
        return [x.src]
    if isinstance(x, K.Masked):
        return [x.value]
    if isinstance(x, K.Reduce):
        return [x.body]
    if isinstance(x, K.Gather):
        return [x.body, x.row]
    if isinstance(x, K.SoftmaxSum):
        return [x.score, x.weight]
    return []


def test_a_chain_of_gathers_is_stored_every_few_steps():
    # each step reads the previous one's rows through an index (a recurrence writing one
    # tensor step by step): inlined whole, every gather renamed the tree below it and the
    # compile grew with the square of the steps
    from luminal.compiler.lower import GATHER_NEST_MAX

    g = lm.Graph("chain")
    x = g.input("x", (5, 3))
    idx = g.tensor(np.array([4, 0, 3, 1, 2], dtype=np.int64))
    y = x
    for t in range(13):
        y = F.index_select(y * 0.5 + float(t), 0, idx).exp().log()
    g.output("y", y)
    low = lower(g)
    assert max(_gather_depth(k.value) for k in low.kernels) == GATHER_NEST_MAX
    a = rand(5, 3)
    np.testing.assert_allclose(lm.compile(g).run({"x": a})["y"], g.run({"x": a})["y"], rtol=1e-5)
