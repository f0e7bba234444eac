"""The online-softmax rewrite: a softmax-weighted sum becomes one pass over the keys.

Naive attention, as the primitives spell it::

    S = scores (any expression; a QK^T sum, scaled, plus a mask)     (.., L, S)
    M = max_j S                                                       (.., L)
    E = exp2(c*S - c*M)          (c > 0; any arrangement of adds and constant multiplies)
    P = E * recip(sum_j E)
    O = sum_j P[.., i, j] * V[.., j, v]                               (.., L, Ev)

is O = SoftmaxSum_j(score = c*S, weight = V): with m = max_j c*S_j,
sum_j 2^(c*S_j - m) V_j / sum_j 2^(c*S_j - m), the identity online softmax (flash attention)
rests on. The rule's premises: every intermediate (M, E, the sum, its reciprocal, P, the
product) feeds only the next step of the pattern; E, S and P share one index space (identity
edges); M and the sum are read back broadcast over the key axis; c is a positive constant.
Then nothing of size L x S needs storing: the scores are recomputed inside the one pass.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..graph import symbolic as sym
from ..graph.graph import Node
from ..graph.ops import COMMUTATIVE, Leaf, Op
from ..graph.view import View

# relative difference of two scales that are one f32 constant rounded differently (2^-23)
F32_EPS = 2.0**-23


@dataclass
class SoftmaxSumMatch:
    out: Node  # O: the SUM_REDUCE
    product: Node  # P * V
    p: Node  # the normalized weights
    p_view: View  # how the product reads P
    value: Node  # V
    value_view: View  # how the product reads V
    score: Node  # S
    scale: float  # c
    absorbed: frozenset[int]  # nodes replaced by the rewrite (never materialized)


def _identity(view: View, shape: tuple) -> bool:
    return view.valid == 1 and view == View.contiguous(shape)


def _same_elements(view: View, src: Node) -> bool:
    """``view`` reads ``src`` element for element (a reshape such as keepdim's trailing 1)."""
    return view.valid == 1 and view.index == View.contiguous(src.shape).index


def _row_broadcast(view: View, src: Node, shape: tuple) -> bool:
    """``view`` reads ``src`` (one value per row: shape (.., L) or (.., L, 1)) at index
    (.., i, j) of ``shape`` as src[.., i], for every j."""
    rows = tuple(shape[:-1])
    if view.valid != 1 or tuple(view.shape) != tuple(shape):
        return False
    if tuple(src.shape) not in (rows, (*rows, 1)):
        return False
    return view.index == View.contiguous(rows).index


def _const_value(n: Node, view: View) -> float | None:
    if n.op is Leaf.CONSTANT and view.valid == 1 and not isinstance(n.arg, sym.Expr):
        return float(n.arg)
    return None


def _linear(
    n: Node, consumers: dict[int, list[Node]], chain: set[int]
) -> dict[tuple[int, View], float] | None:
    """``n`` as sum(coef * (node, view)) through ADD and multiplication by constants; the
    nodes walked through are added to ``chain``. None when it is anything else."""
    if n.op is Op.ADD:
        out: dict[tuple[int, View], float] = {}
        for s, v in n.srcs:
            if s.op in COMMUTATIVE and _identity(v, n.shape) and len(consumers[s.id]) == 1:
                sub = _linear(s, consumers, chain)
                if sub is None:
                    return None
            else:
                sub = _scaled_leaf(s, v, consumers, chain)
            for k, c in sub.items():
                out[k] = out.get(k, 0.0) + c
        chain.add(n.id)
        return out
    if n.op is Op.MUL:
        (a, va), (b, vb) = n.srcs
        for (x, vx), (cn, vc) in (((a, va), (b, vb)), ((b, vb), (a, va))):
            factor = _const_value(cn, vc)
            if factor is None:
                continue
            if x.op in COMMUTATIVE and _identity(vx, n.shape) and len(consumers[x.id]) == 1:
                sub = _linear(x, consumers, chain)
                if sub is None:
                    return None
            else:
                sub = _scaled_leaf(x, vx, consumers, chain)
            chain.add(n.id)
            return {key: coef * factor for key, coef in sub.items()}
    return None


def _scaled_leaf(
    n: Node, view: View, consumers: dict[int, list[Node]], chain: set[int]
) -> dict[tuple[int, View], float]:
    """The term ``n`` read through ``view``, with multiplications by constants peeled off:
    ``c * x`` read through a view is ``c`` times ``x`` read through it (``x`` read whole by
    ``n``), so a scale the e-graph moved under a broadcast (``c * max(S)`` broadcast over the
    keys) still leaves ``max(S)`` as the term."""
    factor = 1.0
    while n.op is Op.MUL and len(consumers[n.id]) == 1:
        (a, va), (b, vb) = n.srcs
        for (x, vx), (cn, vc) in (((a, va), (b, vb)), ((b, vb), (a, va))):
            c = _const_value(cn, vc)
            if c is not None and _identity(vx, n.shape):
                chain.add(n.id)
                factor *= c
                n = x
                break
        else:
            break
    return {(n.id, view): factor}


def _other(n: Node, node: Node) -> tuple[Node, View] | None:
    (a, va), (b, vb) = n.srcs
    if a is node:
        return b, vb
    if b is node:
        return a, va
    return None


def match_softmax_sums(
    order: list[Node], consumers: dict[int, list[Node]]
) -> list[SoftmaxSumMatch]:
    """Every softmax-weighted sum in ``order`` (a toposorted node list) the rule applies to."""
    nodes = {n.id: n for n in order}
    found: list[SoftmaxSumMatch] = []
    for o in order:
        m = _match(o, nodes, consumers)
        if m is not None:
            found.append(m)
    return found


def _only(consumers: dict[int, list[Node]], n: Node, allowed: set[int]) -> bool:
    return all(c.id in allowed for c in consumers[n.id])


def _match(
    o: Node, nodes: dict[int, Node], consumers: dict[int, list[Node]]
) -> SoftmaxSumMatch | None:
    if o.op is not Op.SUM_REDUCE or not o.dtype.is_float:
        return None
    prod, pv = o.srcs[0]
    axis = o.arg
    if prod.op is not Op.MUL or not _identity(pv, prod.shape) or axis != len(prod.shape) - 1:
        return None
    if len(consumers[prod.id]) != 1:
        return None
    for (p, p_view), (val, val_view) in (tuple(prod.srcs), tuple(reversed(prod.srcs))):
        hit = _match_weights(p, p_view, nodes, consumers)
        if hit is None:
            continue
        score, scale, absorbed = hit
        return SoftmaxSumMatch(o, prod, p, p_view, val, val_view, score, scale,
                               frozenset(absorbed | {prod.id}))  # fmt: skip
    return None


def _match_weights(
    p: Node, p_view: View, nodes: dict[int, Node], consumers: dict[int, list[Node]]
) -> tuple[Node, float, set[int]] | None:
    """P = E * recip(sum_j E), E = exp2(c*S - c*M), M = max_j S, read by the product with the
    key axis as the product's reduced (last) axis."""
    if p.op is not Op.MUL or not p.dtype.is_float or len(consumers[p.id]) != 1:
        return None
    # the product (.., i, v, j) must read P[.., i, j]: P's key axis is the reduced one
    n = len(p.shape)
    want = View.contiguous(p.shape).index
    want = sym.substitute(want, {f"_i{n - 1}": sym.index_var(n, p.shape[-1])}, {})
    if p_view.valid != 1 or p_view.index != want:
        return None
    shape = p.shape
    for (e, ve), (r, vr) in (tuple(p.srcs), tuple(reversed(p.srcs))):
        if e.op is not Op.EXP2 or not _identity(ve, shape) or r.op is not Op.RECIP:
            continue
        ((lsum, vl),) = r.srcs
        if not _row_broadcast(vr, r, shape) or lsum.op is not Op.SUM_REDUCE:
            continue
        if (
            lsum.arg != len(shape) - 1
            or not _identity(lsum.srcs[0][1], shape)
            or lsum.srcs[0][0] is not e
        ):
            continue
        if not _same_elements(vl, lsum) or {c.id for c in consumers[e.id]} != {lsum.id, p.id}:
            continue
        if len(consumers[lsum.id]) != 1 or len(consumers[r.id]) != 1:
            continue
        ((z, vz),) = e.srcs
        if not _identity(vz, shape) or len(consumers[z.id]) != 1:
            continue
        chain: set[int] = set()
        lin = _linear(z, consumers, chain)
        if lin is None or len(lin) != 2:
            continue
        terms = list(lin.items())
        for ((s_id, vs), cs), ((m_id, vm), cm) in (terms, terms[::-1]):
            s_node, m_node = nodes[s_id], nodes[m_id]
            if m_node.op is not Op.MAX_REDUCE:
                continue
            # the scale of the max may be the f32 rounding of the scores' (the e-graph's
            # max-scale rule folds constants in f32): equal to f32 precision
            if not (cs > 0 and abs(cm + cs) <= F32_EPS * cs and _identity(vs, shape)):
                continue
            if m_node.arg != len(shape) - 1 or m_node.srcs[0][0] is not s_node:
                continue
            if not _identity(m_node.srcs[0][1], shape) or not _row_broadcast(vm, m_node, shape):
                continue
            absorbed = chain | {p.id, e.id, r.id, lsum.id, m_node.id}
            if not _only(consumers, m_node, chain) or not _only(
                consumers, s_node, chain | {m_node.id}
            ):
                continue
            return s_node, cs, absorbed
    return None
