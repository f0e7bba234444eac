"""compiler/fold.py: weight-only subgraphs become precomputed weights; everything that depends
on inputs or dims stays, and the folded graph computes the same values."""

from __future__ import annotations

import numpy as np
import pytest

import luminal as lm
from luminal.compiler.fold import FOLD_SCALE_RATIO, fold_scales, fold_weights, foldable_nodes
from luminal.functional import linear
from luminal.graph.ops import Leaf, Op
from luminal.loaders import quants
from test_loaders import _random_blocks

RNG = np.random.default_rng(0)


def _q4_1_blocks(rows: int, cols: int) -> np.ndarray:
    """Random Q4_1 blocks (f16 scale and minimum kept finite)."""
    nb = rows * cols // 32
    raw = RNG.integers(0, 256, size=(nb, 20), dtype=np.uint8)
    for off in (0, 2):
        raw[:, off : off + 2] = (
            RNG.uniform(-1, 1, nb).astype(np.float16).view(np.uint8).reshape(nb, 2)
        )
    return raw


def _ops(g: lm.Graph) -> set:
    return {n.op for n in g.toposort()}


def test_quantized_matmul_folds_to_an_f32_weight() -> None:
    raw = _q4_1_blocks(24, 64)
    g = lm.Graph("q")
    x = g.input("x", (lm.dim("seq", 1, 16), 64))
    w = quants.quantized_weight(g, "proj", "Q4_1", raw, (24, 64))
    g.output("y", linear(x, w).add(1.0))
    folded = fold_weights(g)
    assert folded is not g and folded.name == "q"
    assert "proj#folded" in folded.inputs and folded.inputs["proj#folded"].arg[1]
    assert not any("#u8" in n or "#f16" in n for n in folded.inputs)  # the packed bytes are gone
    assert Op.MOD not in _ops(folded) and Op.CAST not in _ops(folded)  # so is the dequant chain
    np.testing.assert_array_equal(
        folded.weights["proj#folded"].reshape(24, 64), quants.dequantize("Q4_1", raw, (24, 64))
    )
    xs = RNG.standard_normal((5, 64)).astype(np.float32)
    np.testing.assert_allclose(folded.run({"x": xs})["y"], g.run({"x": xs})["y"], rtol=1e-6)


def test_kept_weights_stay_packed() -> None:
    g = lm.Graph("k")
    x = g.input("x", (2, 64))
    a = quants.quantized_weight(g, "a", "Q4_1", _q4_1_blocks(8, 64), (8, 64))
    b = quants.quantized_weight(g, "b", "Q4_1", _q4_1_blocks(8, 64), (8, 64))
    g.output("y", linear(x, a).add(linear(x, b)))
    folded = fold_weights(g, keep=["b"])
    assert "a#folded" in folded.inputs and "b#folded" not in folded.inputs
    assert "b#u8" in folded.inputs and "a#u8" not in folded.inputs
    xs = RNG.standard_normal((2, 64)).astype(np.float32)
    np.testing.assert_allclose(folded.run({"x": xs})["y"], g.run({"x": xs})["y"], rtol=1e-5)
    assert fold_weights(g, keep=["a", "b"]) is g


def test_f16_cast_folds_and_shared_expressions_fold_once() -> None:
    g = lm.Graph("h")
    x = g.input("x", (3, 8))
    w16 = RNG.standard_normal((8, 8)).astype(np.float16)
    w = g.weight("w", data=w16).float().mul(0.5)  # one expression, read by two consumers
    g.output("a", x.matmul(w))
    g.output("b", x.add(w.slice(0, 0, 3)))
    folded = fold_weights(g)
    assert [n for n in folded.inputs if n.endswith("#folded")] == ["w#folded"]
    np.testing.assert_array_equal(folded.weights["w#folded"], w16.astype(np.float32) * 0.5)
    assert list(folded.outputs) == ["a", "b"]
    xs = RNG.standard_normal((3, 8)).astype(np.float32)
    ref, got = g.run({"x": xs}), folded.run({"x": xs})
    for k in ("a", "b"):
        np.testing.assert_array_equal(got[k], ref[k])


def test_what_depends_on_inputs_or_dims_is_not_folded() -> None:
    g = lm.Graph("d")
    pos = lm.dim("pos", 0, 7)
    seq = lm.dim("seq", 1, 8)
    table = g.weight("table", data=RNG.standard_normal((16, 4)).astype(np.float32))
    scale = g.weight("scale", data=RNG.standard_normal(4).astype(np.float32))
    x = g.input("x", (seq, 4))
    rows = table.slice(0, pos, seq).mul(2.0)  # reads the weight through a view that names dims
    g.output("y", x.add(rows).mul(scale.exp()))  # exp(scale) is weight-only: folded
    fold, frontier = foldable_nodes(g)
    assert [n.op for n in frontier] == [Op.EXP2]
    folded = fold_weights(g)
    assert set(folded.inputs) == {"table", "scale#folded", "x"}
    xs = RNG.standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_allclose(
        folded.run({"x": xs}, pos=2)["y"], g.run({"x": xs}, pos=2)["y"], rtol=1e-6
    )


def test_nothing_to_fold_returns_the_graph_and_dataless_weights_stay() -> None:
    g = lm.Graph("n")
    x = g.input("x", (4,))
    g.output("y", x.mul(g.weight("w", (4,)).exp()))  # no data yet: cannot be evaluated
    assert fold_weights(g) is g
    g2 = lm.Graph("iota")
    g2.output("y", g2.input("x", (4,)).add(g2.arange(4).float()))  # constants only
    assert fold_weights(g2) is g2


def test_in_place_outputs_and_input_order_survive() -> None:
    g = lm.Graph("s")
    cache = g.input("cache", (6, 4))
    x = g.input("x", (2, 4))
    w = g.weight("w", data=RNG.standard_normal((4, 4)).astype(np.float16)).float()
    idx = g.input("idx", (2,), lm.i32)
    new = lm.Tensor(g.add_op(Op.SCATTER, [cache.edge, idx.edge, x.matmul(w).edge]))
    g.output("cache_new", new, updates="cache")
    folded = fold_weights(g)
    assert folded.state == {"cache_new": "cache"}
    assert [n for n in folded.inputs if not folded.inputs[n].arg[1]] == ["cache", "x", "idx"]
    feed = {
        "cache": np.zeros((6, 4), np.float32),
        "x": RNG.standard_normal((2, 4)).astype(np.float32),
        "idx": np.asarray([4, 1], np.int32),
    }
    np.testing.assert_allclose(folded.run(feed)["cache_new"], g.run(feed)["cache_new"], rtol=1e-6)
    assert all(n.op is not Leaf.INPUT or n.arg[0] != "w" for n in folded.toposort())


def test_progress_reports_the_folded_size() -> None:
    g = lm.Graph("p")
    w = g.weight("w", data=np.ones((256, 256), np.float16)).float()
    g.output("y", g.input("x", (2, 256)).matmul(w))
    lines: list[str] = []
    fold_weights(g, progress=lines.append)
    assert len(lines) == 1 and "1 weight expressions" in lines[0] and "0 MiB" in lines[0]


@pytest.mark.parametrize("fmt", ["Q4_0", "Q8_0"])
def test_folded_values_match_the_interpreted_expression(fmt: str) -> None:
    f = quants.FORMATS[fmt]
    raw = RNG.integers(0, 256, size=(4 * 64 // f.block, f.type_size), dtype=np.uint8)
    raw[:, 0:2] = RNG.uniform(-1, 1, len(raw)).astype(np.float16).view(np.uint8).reshape(-1, 2)
    g = lm.Graph("v")
    g.output(
        "y", g.input("x", (2, 64)).matmul(quants.quantized_weight(g, "w", fmt, raw, (4, 64)).T)
    )
    folded = fold_weights(g)
    np.testing.assert_array_equal(
        folded.weights["w#folded"].reshape(4, 64), quants.dequantize(fmt, raw, (4, 64))
    )


# --------------------------------------------------------------------------- fold_scales
def _gemv_graph(fmt: str, raw: np.ndarray, rows: int, cols: int) -> lm.Graph:
    g = lm.Graph("s")
    x = g.input("x", (lm.dim("seq", 1, 8), cols))
    g.output("y", x.matmul(quants.quantized_weight(g, "w", fmt, raw, (rows, cols)).T))
    return g


@pytest.mark.parametrize(
    ("fmt", "rows", "cols", "shapes", "packed"),
    [
        ("Q4_0", 12, 96, [(36,)], [(36, 16)]),
        # the minimum; the scale times each nibble's 1/16^h
        ("Q4_1", 12, 96, [(36,), (36, 2)], [(36, 16)]),
        ("Q8_0", 12, 96, [(36,)], []),  # its quants are 32 of 34 bytes: read in place
        ("Q4_K", 3, 512, [(6, 4, 2), (6, 4, 2)], [(6, 4, 32)]),
        ("Q6_K", 3, 512, [(6, 2, 2, 2, 2)], [(6, 2, 2, 2, 16), (6, 2, 2, 16)]),
    ],
)
def test_block_scales_fold_compactly_and_compute_the_same(fmt, rows, cols, shapes, packed) -> None:
    raw = _random_blocks(fmt, rows, cols)
    g = _gemv_graph(fmt, raw, rows, cols)
    folded = fold_scales(g)
    scales = sorted(
        (np.asarray(v).shape for k, v in folded.weights.items() if "#scale" in k), key=len
    )
    assert scales == sorted(shapes, key=len)
    # a block's quants, read without its scales, are stored contiguously; once every field is
    # folded or repacked the packed original is not part of the plan
    reads = sorted((v.shape for k, v in folded.weights.items() if "#packed" in k), key=len)
    assert reads == sorted(packed, key=len)
    assert all(folded.weights[k].dtype == np.uint8 for k in folded.weights if "#packed" in k)
    assert (f"w#{'i8' if fmt == 'Q8_0' else 'u8'}" in folded.weights) == (not packed)
    assert all(folded.weights[k].dtype == np.float32 for k in folded.weights if "#scale" in k)
    # the packed bytes stay: each fold adds a fraction of them, never the dequantized weight
    assert all(
        v.nbytes <= FOLD_SCALE_RATIO * raw.nbytes
        for k, v in folded.weights.items()
        if "#scale" in k
    )
    xs = RNG.standard_normal((5, cols)).astype(np.float32)
    ref = xs @ quants.dequantize(fmt, raw, (rows, cols)).T
    np.testing.assert_allclose(folded.run({"x": xs})["y"], g.run({"x": xs})["y"], rtol=1e-6)
    got = lm.compile(g).run({"x": xs})["y"]  # compile folds them itself
    np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-5 * np.abs(ref).max())


def test_full_casts_and_dataless_weights_do_not_fold_as_scales() -> None:
    g = lm.Graph("f")
    w = g.weight("w", data=RNG.standard_normal((8, 8)).astype(np.float16)).float()
    s = g.weight("s", (8,)).float().reshape(1, 8).expand(8, 8)  # no data
    g.output("y", g.input("x", (2, 8)).matmul(w.mul(s)))
    assert fold_scales(g) is g  # a full f16 -> f32 cast would double the weight


def test_scale_fold_reports_progress() -> None:
    g = _gemv_graph("Q8_0", _random_blocks("Q8_0", 4, 64), 4, 64)
    lines: list[str] = []
    fold_scales(g, progress=lines.append)
    assert len(lines) == 1 and "folded 1 block scales and repacked 0" in lines[0]


def test_batch_norm_scale_folds_and_cheap_full_size_values_do_not() -> None:
    """gamma / sqrt(var + eps) (a transcendental value no larger than what it reads) becomes
    one weight; a plain product of two equal-size weights stays computed."""
    rng = np.random.default_rng(3)
    g = lm.Graph("bn")
    x = g.input("x", (2, 7, 5, 3))
    var = g.weight("var", data=rng.random(7).astype(np.float32) + 0.5)
    gam = g.weight("gam", data=rng.random(7).astype(np.float32))
    mean = g.weight("mean", data=rng.random(7).astype(np.float32))
    scale = (gam / (var + 1e-5).sqrt()).reshape(1, 7, 1, 1)
    g.output("y", (x - mean.reshape(1, 7, 1, 1)) * scale + (gam * mean).reshape(1, 7, 1, 1))
    out = fold_scales(g)
    assert [w for w in out.weights if "#scale" in w] == ["gam#scale"]
    assert not any(n.op is Op.SQRT for n in out.nodes)
    assert any(n.op is Op.MUL for n in out.nodes)
    xv = rng.standard_normal((2, 7, 5, 3)).astype(np.float32)
    np.testing.assert_allclose(out.run({"x": xv})["y"], g.run({"x": xv})["y"], rtol=1e-6)


def test_a_scalar_weight_chain_folds_to_a_scalar() -> None:
    """A 0-d weight-only value (an attention scale computed from a stored 0-d tensor, as
    DeBERTa's sqrt(head_dim * factor)) folds and keeps its shape: a scalar, not a 1-vector."""
    g = lm.Graph("s")
    x = g.input("x", (3, 5))
    d = g.weight("d", data=np.array(24.0, dtype=np.float32))
    g.output("y", x / (d * 3.0).sqrt())
    out = fold_scales(g)
    assert out is not g and not any(n.op is Op.SQRT for n in out.nodes)
    xv = RNG.standard_normal((3, 5)).astype(np.float32)
    np.testing.assert_allclose(out.run({"x": xv})["y"], g.run({"x": xv})["y"], rtol=1e-6)
    c = lm.compile(g, search=False)
    np.testing.assert_allclose(c.run({"x": xv})["y"], xv / np.sqrt(72.0), rtol=1e-6)
