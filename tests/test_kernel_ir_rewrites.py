"""Rewrites of kernel IR value trees keep them DAGs: a subtree shared by several parents (also
under different reductions) is rewritten once, and a subtree a rewrite does not change is
returned as it is. Without this a model's value trees grow exponentially under repeated
rewrites (cut-outs, schedules, code generation)."""

import numpy as np

from luminal.compiler import kernel_ir as K
from luminal.compiler.search.select import cut_value
from luminal.graph import dtypes as dt
from luminal.graph import symbolic as sym
from luminal.graph.ops import Op

F32 = dt.f32


def _tree():
    """sum_r x[i*8 + r] * y[r]  +  max_r x[i*8 + r] * y[r]: one product under two reductions."""
    i = sym.var("_i0", 0, 3, 4)
    r = sym.var("r", 0, 7, 8)
    prod = K.Alu(Op.MUL, (K.Load(0, sym.add(sym.mul(i, 8), r), 1, F32), K.Load(1, r, 1, F32)), F32)
    total = K.Reduce(Op.SUM_REDUCE, r, 8, prod, F32)
    peak = K.Reduce(Op.MAX_REDUCE, r, 8, prod, F32)
    return i, K.Alu(Op.ADD, (total, peak), F32)


def test_substitute_rewrites_a_subtree_shared_by_two_reductions_once():
    i, v = _tree()
    out = K.substitute(v, {"_i0": sym.add(i, 1)})
    total, peak = out.srcs
    assert total.body is peak.body  # still one product
    load = total.body.srcs[0]
    assert sym.evaluate(load.index, {"_i0": 0, "r": 2}) == 10  # (0 + 1) * 8 + 2


def test_substitute_keeps_what_it_does_not_change():
    i, v = _tree()
    assert K.substitute(v, {"_i1": 5}) is v
    out = K.substitute(v, {"_i0": sym.add(i, 1)})
    # y[r] reads no _i0: the same object under the new product
    assert out.srcs[0].body.srcs[1] is v.srcs[0].body.srcs[1]
    # the reduction variable is hidden from the mapping inside its reduction
    assert K.substitute(v, {"r": 0}) is v


def test_remap_buffers_keeps_sharing_and_unchanged_trees():
    _, v = _tree()
    out = K.remap_buffers(v, {0: 5, 1: 1})
    assert out.srcs[0].body is out.srcs[1].body
    assert out.srcs[0].body.srcs[0].buf == 5 and out.srcs[0].body.srcs[1] is v.srcs[0].body.srcs[1]
    assert K.remap_buffers(v, {0: 0, 1: 1}) is v


def test_cut_value_is_kept_per_tree_and_buffer_map():
    _, v = _tree()
    a = cut_value(v, {0: 1, 1: 0})
    assert cut_value(v, {0: 1, 1: 0}) is a
    b = cut_value(v, {0: 0, 1: 1})
    assert b is not a and b != a
    # an equal tree built again is another object: its own entry, an equal value
    _, w = _tree()
    assert cut_value(w, {0: 1, 1: 0}) == a


def test_fingerprint_is_kept_on_nodes_and_follows_the_fields():
    _, v = _tree()
    fp = K.fingerprint([K.Kernel("k", (4,), 2, v, F32)])
    assert K.fingerprint([K.Kernel("k", (4,), 2, v, F32)]) == fp
    _, w = _tree()  # an equal tree built again digests the same
    assert K.fingerprint([K.Kernel("k", (4,), 2, w, F32)]) == fp
    other = K.remap_buffers(v, {0: 1, 1: 0})
    assert K.fingerprint([K.Kernel("k", (4,), 2, other, F32)]) != fp
    assert np.all([isinstance(x.__dict__.get("_fp"), str) for x in K.walk(v)])
