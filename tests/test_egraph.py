"""The e-graph pass (compiler/search/egraph.py) and its rule files.

Every rule fires on a small graph built from primitives, and the extracted graph matches the
reference interpreter on random inputs at odd sizes. Unsound-looking rewrites (float x*0,
float x+0, a constant read with padding) must not happen; caps, determinism, rule-file
errors and the pass's place in ``compile`` are checked here too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable

import numpy as np
import pytest

import luminal as lm
from luminal import flags
from luminal.compiler import pipeline
from luminal.compiler.search import egraph as E
from luminal.compiler.search import rules as R
from luminal.graph import dtypes as dt
from luminal.graph.ops import Leaf, Op
from luminal.tensor import Tensor

RNG = np.random.default_rng(7)


def _c(x: Tensor, v: float | int, dtype: dt.DType | None = None) -> Tensor:
    """A scalar constant broadcast to ``x``'s shape."""
    return x.graph.constant(v, dtype or x.dtype).expand(*x.shape)


def _red(op: Op, x: Tensor, axis: int) -> Tensor:
    return x._op(op, arg=axis)


def _fold(op: Op, *vals: float | int, dtype: dt.DType = dt.f32) -> Callable[[Tensor], Tensor]:
    """x * op(constants...): the folded constant must equal what the interpreter computes."""

    def build(x: Tensor) -> Tensor:
        cs = [x.graph.constant(v, dtype) for v in vals]
        r = cs[0]._op(op, *cs[1:])
        return x.mul(r.cast(x.dtype).expand(*x.shape))

    return build


F, INT = dt.f32, dt.i32
# rule -> (build from inputs, input shapes, dtype); sizes are odd on purpose
CASES: dict[str, tuple[Callable[..., Tensor], list[tuple[int, ...]], dt.DType]] = {
    "mul-one": (lambda x: x.mul(_c(x, 1.0)).exp2(), [(3, 50)], F),
    "mul-zero-int": (lambda x: x.mul(_c(x, 0)).add(x), [(7, 5)], INT),
    "add-zero-int": (lambda x: x.add(_c(x, 0)).mul(x), [(7, 5)], INT),
    "add-negzero": (lambda x: x.add(_c(x, -0.0)).sin(), [(3, 50)], F),
    "log2-exp2": (lambda x: x.exp2().log2().mul(x), [(783,)], F),
    "exp2-mul": (lambda a, b: a.exp2().mul(b.exp2()), [(3, 50), (3, 50)], F),
    "recip-recip": (lambda x: x.reciprocal().reciprocal().sin(), [(50, 3)], F),
    "mul-const-assoc": (lambda x: x.mul(_c(x, 3.0)).mul(_c(x, -0.5)), [(783,)], F),
    "add-const-assoc-int": (lambda x: x.add(_c(x, 3)).add(_c(x, -11)), [(3, 50)], INT),
    "distribute-int": (lambda a, b, c: a.mul(b).add(a.mul(c)), [(7, 5)] * 3, INT),
    "distribute-const": (lambda x: x.mul(_c(x, 3.0)).add(x.mul(_c(x, 0.25))), [(50,)], F),
    "fold-exp2": (_fold(Op.EXP2, 3.5), [(3, 50)], F),
    "fold-log2": (_fold(Op.LOG2, 10.0), [(3, 50)], F),
    "fold-sin": (_fold(Op.SIN, 0.7), [(3, 50)], F),
    "fold-sqrt": (_fold(Op.SQRT, 2.0), [(3, 50)], F),
    "fold-recip": (_fold(Op.RECIP, 3.0), [(3, 50)], F),
    "fold-cast": (lambda x: x.mul(x.graph.constant(7, INT).cast(F).expand(*x.shape)), [(50,)], F),
    "fold-add": (_fold(Op.ADD, 0.1, 0.2), [(3, 50)], F),
    "fold-mul": (_fold(Op.MUL, 0.1, 3.0), [(3, 50)], F),
    "fold-mod": (_fold(Op.MOD, 7, 3, dtype=INT), [(3, 50)], F),
    "fold-lt": (_fold(Op.LESS_THAN, 2.0, 3.0), [(3, 50)], F),
    # the larger axis (50) is reduced first after the swap: a smaller intermediate
    "sum-swap-lt": (lambda x: _red(Op.SUM_REDUCE, _red(Op.SUM_REDUCE, x, 2), 1), [(3, 50, 7)], F),
    "sum-swap-ge": (lambda x: _red(Op.SUM_REDUCE, _red(Op.SUM_REDUCE, x, 1), 1), [(3, 7, 50)], F),
    "max-swap-lt": (lambda x: _red(Op.MAX_REDUCE, _red(Op.MAX_REDUCE, x, 2), 1), [(3, 50, 7)], F),
    "max-swap-ge": (lambda x: _red(Op.MAX_REDUCE, _red(Op.MAX_REDUCE, x, 1), 1), [(3, 7, 50)], F),
    "sum-scale": (lambda x: _red(Op.SUM_REDUCE, x.mul(_c(x, 0.125)), 1), [(5, 783)], F),
    "max-scale": (lambda x: _red(Op.MAX_REDUCE, x.mul(_c(x, 1.5)), 0), [(783, 3)], F),
    "max-shift": (lambda x: _red(Op.MAX_REDUCE, x.add(_c(x, -2.5)), 1), [(3, 783)], F),
    # x * 2^k overflows to +-inf for some elements and x * 0 * inf is NaN for all: the
    # comparisons stay false for every special value too
    "lt-neginf": (lambda x: _specials(x).lt(_c(x, -np.inf)).cast(F).add(x), [(3, 50)], F),
    "posinf-lt": (lambda x: _c(x, np.inf).lt(_specials(x)).cast(F).add(x), [(3, 50)], F),
}


def _specials(x: Tensor) -> Tensor:
    """``x`` with overflowed (+-inf) and NaN elements mixed in."""
    big = x.mul(_c(x, 2.0**127)).mul(_c(x, 4.0))
    return big.where(x.lt(_c(x, 1.0)), big.mul(_c(x, 0.0)).mul(big))


def _random(shape: tuple[int, ...], d: dt.DType) -> np.ndarray:
    if d.is_float:
        return RNG.standard_normal(shape).astype(d.np_type)
    return RNG.integers(-1000, 1000, shape).astype(d.np_type)


def _graph(build: Callable[..., Tensor], shapes: list[tuple[int, ...]], d: dt.DType) -> lm.Graph:
    g = lm.Graph("egraph_case")
    xs = [g.input(f"x{i}", s, d) for i, s in enumerate(shapes)]
    g.output("y", build(*xs))
    return g


def _check(g: lm.Graph, g2: lm.Graph, inputs: dict[str, np.ndarray]) -> None:
    want, got = g.run(inputs), g2.run(inputs)
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape
        np.testing.assert_allclose(got[k], want[k], rtol=2e-6, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("name", sorted(CASES))
def test_rule_fires_and_matches_interpreter(name: str) -> None:
    build, shapes, d = CASES[name]
    g = _graph(build, shapes, d)
    g2, st = E.simplify(g)
    assert st.fired.get(name), f"{name} did not fire: {st}"
    assert g2 is not g and st.cost_after < st.cost_before, st
    g2.verify()
    _check(g, g2, {f"x{i}": _random(s, d) for i, s in enumerate(shapes)})


def test_every_rule_has_a_case() -> None:
    assert sorted(r.name for r in R.DEFAULT) == sorted(CASES)


def test_examples_simplify_to_their_closed_form() -> None:
    g = _graph(lambda x: x.mul(_c(x, -1.0)).mul(_c(x, -1.0)).exp2().log2(), [(5,)], F)
    g2, _ = E.simplify(g)
    assert [n.op for n in g2.toposort()] == [Leaf.INPUT, Leaf.OUTPUT]  # -(-x) then log2(exp2)
    g = _graph(lambda x: x.mul(_fold(Op.ADD, 2.0, 3.0)(x)), [(5,)], F)
    consts = [n.arg for n in E.simplify(g)[0].nodes if n.op is Leaf.CONSTANT]
    assert consts == [5.0]


def test_float_times_zero_is_not_rewritten() -> None:
    g = _graph(lambda x: x.mul(_c(x, 0.0)), [(6,)], F)
    g2, st = E.simplify(g)
    assert "mul-zero-int" not in st.fired and g2 is g
    x = np.array([1.0, -2.0, np.inf, -np.inf, np.nan, 0.0], np.float32)
    y = E.simplify(g)[0].run({"x0": x})["y"]
    assert np.isnan(y[2:5]).all() and (y[[0, 1, 5]] == 0).all()


def test_float_plus_positive_zero_keeps_the_sign_rule() -> None:
    g = _graph(lambda x: x.add(_c(x, 0.0)).reciprocal(), [(2,)], F)
    g2, st = E.simplify(g)
    assert not st.fired and g2 is g
    y = g2.run({"x0": np.array([-0.0, 1.0], np.float32)})["y"]
    assert y[0] == np.inf  # -0.0 + 0.0 is +0.0: 1/x sees it


def test_unsound_premises_block_rules() -> None:
    # max commutes with a positive scale only, and never for wrapping integers
    for build, d in [
        (lambda x: _red(Op.MAX_REDUCE, x.mul(_c(x, -2.0)), 0), F),
        (lambda x: _red(Op.MAX_REDUCE, x.mul(_c(x, 2)), 0), INT),
        (lambda x: _red(Op.MAX_REDUCE, x.add(_c(x, 2)), 0), INT),
    ]:
        g = _graph(build, [(9, 3)], d)
        g2, st = E.simplify(g)
        assert not {"max-scale", "max-shift"} & set(st.fired), st
        _check(g, g2, {"x0": _random((9, 3), d)})
    # x*1 + x*-1 would become x*0: -0 instead of +0 for negative x
    g = _graph(lambda x: x.mul(_c(x, 1.0)).add(x.mul(_c(x, -1.0))), [(4,)], F)
    assert "distribute-const" not in E.simplify(g)[1].fired


def test_padded_constant_is_not_a_constant() -> None:
    # ones(5) padded to 7 reads 0 at the end: x * it is not x
    def build(x: Tensor) -> Tensor:
        ones = x.graph.constant(1.0, F).expand(5).pad_dim(0, 0, 2)
        return x.mul(ones)

    g = _graph(build, [(7,)], F)
    g2, st = E.simplify(g)
    assert "mul-one" not in st.fired
    _check(g, g2, {"x0": _random((7,), F)})


def test_views_are_respected() -> None:
    # exp2(a) read transposed is not the e-class exp2(a): the rule does not compose views
    def build(a: Tensor, b: Tensor) -> Tensor:
        return a.exp2().permute(1, 0).mul(b.exp2())

    g = _graph(build, [(3, 5), (5, 3)], F)
    g2, st = E.simplify(g)
    assert "exp2-mul" not in st.fired
    _check(g, g2, {"x0": _random((3, 5), F), "x1": _random((5, 3), F)})
    # a variable keeps its own view: exp2(x^T) * exp2(y) -> exp2(x^T + y)
    g = _graph(lambda a, b: a.permute(1, 0).exp2().mul(b.exp2()), [(3, 5), (5, 3)], F)
    g2, st = E.simplify(g)
    assert st.fired.get("exp2-mul")
    _check(g, g2, {"x0": _random((3, 5), F), "x1": _random((5, 3), F)})


def test_symbolic_shapes() -> None:
    g = lm.Graph("sym")
    seq = lm.dim("seq", 1, 64)
    x = g.input("x", (seq, 7))
    g.output("y", _red(Op.SUM_REDUCE, x.mul(_c(x, 3.0)).mul(_c(x, 0.5)), 0))
    g2, st = E.simplify(g)
    assert st.fired.get("sum-scale") and st.fired.get("mul-const-assoc")
    for n in (1, 13, 64):
        _check(g, g2, {"x": _random((n, 7), F)})


def _chain(n: int) -> lm.Graph:
    g = lm.Graph("chain")
    x = g.input("x", (13, 5))
    y = x
    for k in range(n):
        y = y.mul(_c(y, 1.0 + k / 8)).mul(_c(y, 1.0 / (1.0 + k / 8))).add(_c(y, 0.5))
    g.output("y", y.exp2().log2())
    return g


@pytest.mark.parametrize(
    "limits, stop",
    [(E.Limits(iters=1), "iteration cap"), (E.Limits(nodes=10), "node cap"),
     (E.Limits(seconds=0.0), "time cap")],
)  # fmt: skip
def test_saturation_respects_caps(limits: E.Limits, stop: str) -> None:
    g = _chain(12)
    full = E.simplify(g)[1]
    assert full.stop == "saturated" and full.iterations > 1
    g2, st = E.simplify(g, limits=limits)
    assert st.stop.startswith(stop), st
    assert st.iterations <= max(1, limits.iters if stop == "iteration cap" else 1)
    _check(g, g2, {"x": _random((13, 5), F)})


def test_extraction_is_deterministic_in_process() -> None:
    reprs = []
    for _ in range(2):
        g = _chain(6)
        g2, _ = E.simplify(g)
        reprs.append([repr(n) for n in g2.toposort()])
    assert reprs[0] == reprs[1]


_SCRIPT = textwrap.dedent(
    """
    import luminal as lm
    from luminal.compiler.search import egraph as E
    g = lm.Graph("d")
    a, b = g.input("a", (3, 50, 7)), g.input("b", (3, 50, 7))
    y = a.exp2().mul(b.exp2()).mul(g.constant(2.0).expand(3, 50, 7))
    y = y._op(lm.graph.ops.Op.SUM_REDUCE, arg=2)._op(lm.graph.ops.Op.SUM_REDUCE, arg=1)
    g.output("y", y)
    print([repr(n) for n in E.simplify(g)[0].toposort()])
    """
)


def test_extraction_is_deterministic_across_hash_seeds() -> None:
    outs = []
    for seed in ("0", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        r = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True,
                           text=True, check=True)  # fmt: skip
        outs.append(r.stdout)
    assert outs[0] == outs[1] and "EXP2" in outs[0]


@pytest.mark.parametrize(
    "text, line, what",
    [
        ("(rule a (mul ?x (const 1)) ?x)", 1, "expected (rule NAME"),
        ("(rule a\n  (mul ?x (const 1)) -> ?x)", 2, "expected '=>'"),
        ("(rule a (mul ?x ?y) => ?x)\n(rule b\n  (frob ?x) => ?x)", 3, "unknown op 'frob'"),
        ("(rule a (mul ?x ?y) => ?z)", 1, "?z is not bound"),
        ("(rule a (exp2 ?x ?y) => ?x)", 1, "exp2 takes 1 arguments"),
        ("(rule a (mul ?x (const 1)) => ?x\n", 1, "never closed"),
        ("(rule a (mul ?x ?y) => ?x :if (pos ?x))", 1, "unknown premise 'pos'"),
        ("(rule a (sum ?x ?x) => ?x)", 1, "both as value and as operand"),
        ("(rule a (mul ?x ?y) => ?x)\n(rule a (mul ?x ?y) => ?y)", 2, "defined twice"),
        ("; comment\n)", 2, "unbalanced"),
    ],
)
def test_rule_syntax_errors_name_file_and_line(text: str, line: int, what: str) -> None:
    with pytest.raises(R.RuleSyntaxError) as e:
        R.parse(text, "broken.rules")
    assert str(e.value).startswith(f"broken.rules:{line}:") and what in str(e.value), e.value


def test_rule_directory_with_a_bad_file(tmp_path) -> None:
    (tmp_path / "a.rules").write_text("(rule ok (mul ?x (const 1)) => ?x)\n")
    (tmp_path / "b.rules").write_text("; fine\n\n(rule bad (mul ?x ?y) => (const (pow ?x)))\n")
    with pytest.raises(R.RuleSyntaxError, match=r"^b\.rules:3: unknown function 'pow'"):
        R.load(str(tmp_path))
    (tmp_path / "b.rules").write_text("(rule ok (add ?x (const 0)) => ?x)\n")
    with pytest.raises(R.RuleSyntaxError, match=r"^b\.rules:1: rule 'ok' is already defined"):
        R.load(str(tmp_path))


def test_ill_typed_rule_is_an_error_naming_it() -> None:
    bad = R.parse("(rule lt-is-x (lt ?x ?y) => ?x)", "bad.rules")
    g = _graph(lambda a, b: a.lt(b).cast(F), [(4,), (4,)], F)
    with pytest.raises(E.RuleError, match="bad.rules:1: rule lt-is-x"):
        E.simplify(g, rules=bad)


def test_pass_list_flag_and_debug_output(monkeypatch, capsys) -> None:
    names = [s.name for s in pipeline.STAGES]
    assert names[: names.index("lower")] == [
        "act_quant",
        "fold_scales",
        "siblings",
        "egraph",
        "stage",
        "bf16",
    ]
    g = CASES["log2-exp2"][0]
    graph = _graph(g, [(9,)], F)
    monkeypatch.setenv(flags.EGRAPH.name, "0")
    assert pipeline.graph_passes(graph) is graph
    monkeypatch.setenv(flags.EGRAPH.name, "1")
    monkeypatch.setenv(flags.DEBUG.name, "3")
    out = pipeline.graph_passes(graph)
    err = capsys.readouterr().err
    assert out is not graph and "e-graph:" in err and "classes" in err and "log2-exp2 x1" in err
    assert "LUMINAL_EGRAPH" in flags.table()


def _runtime() -> bool:
    try:
        from luminal import runtime  # noqa: F401
    except Exception:
        return False
    return True


@pytest.mark.skipif(not _runtime(), reason="the C++ runtime is not built")
def test_compiled_plan_of_rewritten_graph_matches_interpreter(monkeypatch) -> None:
    g = lm.Graph("egraph_compile")
    a, b = g.input("a", (3, 50, 7)), g.input("b", (3, 50, 7))
    y = a.exp2().mul(b.exp2()).mul(_c(a, 0.5))
    g.output("s", _red(Op.SUM_REDUCE, _red(Op.SUM_REDUCE, y, 2), 1))
    g.output("m", _red(Op.MAX_REDUCE, a.add(_c(a, 1.5)), 1))
    inputs = {"a": _random((3, 50, 7), F), "b": _random((3, 50, 7), F)}
    want = g.run(inputs)
    for on in ("1", "0"):
        monkeypatch.setenv(flags.EGRAPH.name, on)
        got = lm.compile(g).run(inputs)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5)


class _ShapeWeights:
    """SmolLM2-135M's weight shapes, without data: the graph is built, never run."""

    def __init__(self, c: object) -> None:
        self.c = c

    def has(self, name: str) -> bool:
        return not name.startswith(("output.", "rope_freqs")) and not name.endswith(".bias")

    def shape(self, name: str) -> tuple[int, ...]:
        c = self.c
        h, kv = c.hidden_size, c.n_kv_heads * c.head_dim  # type: ignore[attr-defined]
        ff, v = c.intermediate_size, c.vocab_size  # type: ignore[attr-defined]
        table = {"token_embd": (v, h), "attn_q": (h, h), "attn_k": (kv, h), "attn_v": (kv, h),
                 "attn_output": (h, h), "ffn_gate": (ff, h), "ffn_up": (ff, h),
                 "ffn_down": (h, ff)}  # fmt: skip
        key = name.split(".")[-2]
        return table.get(key, (h,))

    def get(self, g: lm.Graph, name: str) -> Tensor:
        return Tensor(g.inputs[name]) if name in g.inputs else g.weight(name, self.shape(name))

    def rows(self, g: lm.Graph, name: str, idx: Tensor) -> Tensor:
        from luminal.functional import embedding

        return embedding(idx, self.get(g, name))


def test_smollm2_sized_graph_pass_time() -> None:
    """Measured, not asserted: the pass on a 30-layer SmolLM2-135M graph (print with -s)."""
    from luminal.models.llama import Llama, LlamaConfig

    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, n_layers=30,
                      n_heads=9, n_kv_heads=3, head_dim=64, rope_theta=100000.0,
                      context_length=2048)  # fmt: skip
    g = Llama(cfg, _ShapeWeights(cfg), max_context=2048).build()  # type: ignore[arg-type]
    t = time.perf_counter()
    g2, st = E.simplify(g)
    secs = time.perf_counter() - t
    print(f"\nSmolLM2-sized graph: {len(g.nodes)} -> {len(g2.nodes)} nodes, {secs:.3f} s; {st}")
    assert st.stop == "saturated" and st.cost_after <= st.cost_before
    g2.verify()
    assert list(g2.inputs) == list(g.inputs) and list(g2.outputs) == list(g.outputs)
