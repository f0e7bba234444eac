"""Adjacent symbolic dims read as one index merged into one loop (compiler/collapse.py): the
kernels that can be merged are, the ones that read a dim alone are not, and compiled plans
agree with the interpreter at odd sizes, one-sized dims included."""

import numpy as np
import pytest

import luminal as lm
import luminal.functional as F
from kernel_cache import use_kernel_cache
from luminal.compiler import kernel_ir as K
from luminal.compiler.collapse import collapse
from luminal.compiler.lower import lower
from luminal.compiler.pipeline import graph_passes
from luminal.graph import symbolic as sym

RNG = np.random.default_rng(5)


def _kernels(g: lm.Graph) -> list[K.Kernel]:
    return [k for k in lower(graph_passes(g)).kernels if isinstance(k, K.Kernel)]


def _graph() -> lm.Graph:
    """A batch of sequences: a product with a position-indexed add, then a row norm."""
    g = lm.Graph("rows")
    batch, seq = sym.dim("batch", 1, 16), sym.dim("seq", 1, 40)
    x = g.input("x", (batch, seq, 24))
    pos = g.weight("pos", data=RNG.standard_normal((40, 24)).astype(np.float32))
    w = g.weight("w", data=RNG.standard_normal((13, 24)).astype(np.float32))
    h = x + pos.slice(0, 0, seq).unsqueeze(0)
    y = h @ w.transpose(0, 1)
    y = y / (y * y).sum(-1, keepdim=True).add(1.0).sqrt()
    g.output("y", y)
    return g


def test_rows_read_as_one_index_merge_and_dims_read_alone_do_not():
    b, s = sym.dim("batch", 1, 16), sym.dim("seq", 1, 40)
    ks = _kernels(_graph())
    merged = [collapse(k) for k in ks]
    # the product with the position add fused in reads seq alone (the position row): kept;
    # the norm reads rows only: merged
    assert [m.shape for m in merged] == [(b, s, 13), (sym.mul(b, s), 13)]
    for m in merged:
        m.verify()


@pytest.mark.parametrize("switch", ["1", "0"])
def test_plans_agree_with_the_interpreter_at_odd_sizes(switch, monkeypatch, tmp_path):
    monkeypatch.setenv("LUMINAL_COLLAPSE", switch)
    use_kernel_cache(monkeypatch, tmp_path)
    g = _graph()
    ex = lm.compile(g)
    for b, s in ((1, 1), (1, 17), (3, 1), (5, 7), (16, 40)):
        x = RNG.standard_normal((b, s, 24)).astype(np.float32)
        np.testing.assert_allclose(ex.run({"x": x})["y"], g.run({"x": x})["y"],
                                   rtol=1e-4, atol=1e-5)  # fmt: skip


def test_static_dims_and_an_iota_of_one_dim_are_kept():
    g = lm.Graph("iota")
    batch, seq = sym.dim("batch", 1, 8), sym.dim("seq", 1, 8)
    x = g.input("x", (batch, seq, 4))
    c = g.input("c", (3, 5, 4))
    g.output("y", x * F.arange(g, seq).cast(lm.f32).reshape(1, seq, 1))
    g.output("z", c * 2.0)
    for k in _kernels(g):
        m = collapse(k)
        if k.shape[0] == 3:
            assert m.shape == k.shape  # known sizes: scheduled as they are
        if any(isinstance(v, K.IndexVal) for v in K.walk(k.value)):
            assert m.shape == k.shape
    ex = lm.compile(g)
    xv = RNG.standard_normal((2, 5, 4)).astype(np.float32)
    cv = RNG.standard_normal((3, 5, 4)).astype(np.float32)
    got, ref = ex.run({"x": xv, "c": cv}), g.run({"x": xv, "c": cv})
    for name in ("y", "z"):
        np.testing.assert_allclose(got[name], ref[name], rtol=1e-6)
