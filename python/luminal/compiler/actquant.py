"""Activation quantization: a graph pass that gives products by block-quantized weights
llama.cpp's int8-activation numerics (opt-in: ``LUMINAL_ACT_QUANT=q8``).

llama.cpp multiplies a Q4_0 / Q4_1 / Q8_0 weight by an activation quantized per block of 32
along the summed axis (``quantize_row_q8_0`` / ``q8_1``): ``d = amax / 127`` stored as f16,
``q = roundf(x / d)`` (``x * (1/d)``, half away from zero; ``d == 0`` gives ``q = 0``), and
sums integer products. The pass writes that as graph expressions: the activation ``x`` of each
such product becomes ``f16(d) * q``, its fake quantization, so the reference interpreter
defines the result and every program the search may run (a generated kernel, an integer-dot
library call that reads the codes back from it exactly) computes the same value up to f32
summation order.

Which products qualify is told by a tag: the loader that builds a block-quantized weight's
expression (``loaders/quants.py``) tags the node holding the dequantized blocks with its
format and block size (``quants.block_tag``). Weights of 256-value blocks (K-quants) keep f32
activations: llama.cpp quantizes those per 256 with other rounding rules (``q8_K``).
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np

from .. import flags
from ..graph import dtypes as dt
from ..graph import symbolic as sym
from ..graph.graph import Graph, Node
from ..graph.ops import Leaf, Op
from ..graph.view import View, idx_vars
from ..loaders.quants import block_tag, tagged_graph
from ..tensor import Tensor
from .products import sum_products

G = TypeVar("G", bound=Graph)

MODES = ("", "q8")
Q8_BLOCK = 32


def mode() -> str:
    """``LUMINAL_ACT_QUANT``, checked."""
    return flags.ACT_QUANT.choice(
        MODES, "q8 quantizes activations, empty leaves them f32 (an activation quantization)"
    )


def fake_quant_q8(x: Tensor) -> Tensor:
    """``x`` (f32, last axis a multiple of 32) quantized to int8 per block of 32 along its last
    axis and dequantized: ``f16(d) * roundf(x * (1/d))`` with ``d = amax / 127`` (0 where
    ``d`` is 0 or subnormal), ggml's ``quantize_row_q8_0_ref``, in exact f32 steps."""
    *lead, k = x.shape
    if not isinstance(k, int) or k % Q8_BLOCK:
        raise ValueError(f"q8 activations need a summed axis of a multiple of 32, not {k}")
    g = x.graph
    xb = x.reshape(*lead, k // Q8_BLOCK, Q8_BLOCK)
    # |x| as the larger of x and -x: a sign from an IOTA, not a constant table (a weight,
    # which the search's measurements would fill with random values)
    h = Tensor(g.add_op(Op.IOTA, [], arg=idx_vars((2, 1))[0], shape=(2, 1), dtype=dt.i32))
    sign = h.cast(dt.f32).mul(-2.0).add(1.0)
    amax = xb.unsqueeze(-2).mul(sign).max_reduce(-1).max_reduce(-1, keepdim=True)
    # amax / 127 correctly rounded: in f64 the product by 1/127 is within far less than half
    # an f32 ulp of the quotient, which is never that close to an f32 rounding midpoint
    d = amax.cast(dt.f64).mul(g.constant(1.0 / 127.0, dt.f64)).cast(dt.f32)
    # d == 0, and d subnormal: ggml's 1/d overflows there (inf codes), while f16(d) is 0, so
    # the block is 0 either way; here without the inf
    zero = d.lt(float(np.finfo(np.float32).tiny)).cast(dt.f32)
    inv = d.add(zero).reciprocal().mul(zero.mul(-1.0).add(1.0))
    y = xb.mul(inv)
    frac = y.fmod(1.0)  # exact, with y's sign
    trunc = y.add(frac.mul(-1.0))
    # roundf: away from zero from a fraction of one half on
    q = trunc.add(_lt(-0.5, frac)).add(_lt(frac, 0.5).mul(-1.0))
    dh = d.cast(dt.f16).cast(dt.f32)
    return q.mul(dh).reshape(*lead, k)


def _lt(a: float | Tensor, b: float | Tensor) -> Tensor:
    if isinstance(a, Tensor):
        return a.lt(b).cast(dt.f32)
    assert isinstance(b, Tensor)
    return b.graph.constant(a).expand(b.shape).lt(b).cast(dt.f32)


def _block_operand(graph: Graph, c: Node, axis: int) -> int | None:
    """The position in the multiply ``c`` (summed over ``axis``) of a tagged weight operand
    whose blocks of 32 run along the summed axis, or None."""
    k = f"_i{axis}"
    ext = c.shape[axis]
    if not isinstance(ext, int) or ext % Q8_BLOCK:
        return None
    for j, (s, v) in enumerate(c.srcs):
        tag = block_tag(graph, s)
        if tag is None or tag.block != Q8_BLOCK:
            continue
        # the weight's flat index moves by one along k, and k's blocks start at multiples of
        # 32: element k of a row is element k % 32 of its block k // 32
        at0 = sym.substitute(v.index, {k: 0})
        if sym.add(sym.substitute(v.index, {k: 1}), sym.mul(at0, -1)) != 1:
            continue
        if sym.mod(at0, Q8_BLOCK) != 0 or v.valid != 1:
            continue
        return j
    return None


def quantize_activations(graph: G) -> G:
    """A copy of ``graph`` in which the activation operand of every product by a tagged
    32-block weight (``SUM_REDUCE`` of a ``MUL``) is its q8 fake quantization along the summed
    axis; ``graph`` itself when ``LUMINAL_ACT_QUANT`` is empty or nothing qualifies."""
    if mode() != "q8" or not tagged_graph(graph):
        return graph
    found: dict[int, tuple[int, int]] = {}  # multiply id -> (activation position, summed axis)
    for r, c in sum_products(graph):
        j = _block_operand(graph, c, r.arg)
        if j is None:
            continue
        x = c.srcs[1 - j][0]
        if x.dtype is not dt.f32 or (x.op is Leaf.INPUT and x.arg[1]):
            continue  # a weight by a weight: not an activation
        found[c.id] = (1 - j, r.arg)
    if not found:
        return graph

    def sources(g: Graph, n: Node, srcs: list[tuple[Node, View]]) -> list[tuple[Node, View]]:
        if n.id in found:
            j, axis = found[n.id]
            srcs[j] = _quantized_operand(Tensor(srcs[j][0], srcs[j][1]), axis)
        return srcs

    g = graph.rebuilt(sources)
    g.verify()
    return g


def _quantized_operand(x: Tensor, axis: int) -> tuple[Node, View]:
    """The multiply's operand ``x`` (its view of the activation, in the multiply's shape)
    fake-quantized along ``axis``: computed once over the axes it varies along (not once per
    weight row it is broadcast to), then read back broadcast."""
    used = sym.var_names(x.layout.index) | sym.var_names(x.layout.valid)
    shape = x.shape
    t = x
    for a in range(len(shape)):
        if a != axis and f"_i{a}" not in used and shape[a] != 1:
            t = t.slice(a, 0, 1)
    order = [a for a in range(len(shape)) if a != axis] + [axis]
    inverse = [order.index(a) for a in range(len(shape))]
    q = fake_quant_q8(t.permute(order)).permute(inverse).expand(shape)
    return q.edge
