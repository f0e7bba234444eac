"""Equality saturation over the primitive graph (DESIGN.md §4).

An e-graph holds many equivalent programs at once: e-classes (sets of equal tensors, merged
with union-find) of e-nodes (an op, its attribute and its children). ``simplify(graph)``
loads a graph, applies the rules of ``rules/*.rules`` until nothing changes or a cap is hit,
extracts the cheapest program by a cost model and rebuilds a Graph from it.

Views. Each child of an e-node is an (e-class, view) pair and the view is part of the e-node's
identity: two e-nodes are equal only if they read equal classes through equal views. A rule
never invents or composes views. A pattern's inner op matches only through an *identity* edge
(contiguous, no padding, same shape); a pattern variable keeps whatever view it was read
through and the replacement reads it through that same view; a replacement that is a bare
variable applies only when that variable's edge is an identity. So rewrites happen inside
elementwise chains and across reductions in the coordinates the pattern was written in, and
every view in the result was in the input.

Constants. A graph CONSTANT is a 0-d scalar read through broadcasting views. Here a constant
read at shape S is a CONST e-node in a class of shape S (the edge keeps only the padding,
``valid``); so folding ``2 + 3`` at shape S gives a class equal to the root's, and the export
turns it back into one 0-d constant read through a broadcast view.

Cost model (``node_cost``; symbolic dims are costed at ``COST_DIM`` clamped into their
range): every op costs 1 (fewer nodes win ties) plus its flops, ``numel * FLOPS[op]``
(transcendentals 16, recip/sqrt/mod 4, others 1; a reduction counts its input). Elementwise
ops are assumed to fuse into their consumers; reductions, gathers and scatters start a kernel
(``LAUNCH``) and write their output (``BYTE`` per byte). Constants and inputs cost 0.
Extraction picks, per class, the node minimizing its cost plus its children's classes'
costs (each distinct child once); the whole pass keeps the input graph when the extracted
DAG is not cheaper than the input's.

Bounds (``Limits``): iterations (default 8), e-nodes (default max(20000, 3x the input's)),
seconds (default 1.0); the pass stops at whichever comes first and extracts from what it has.
Everything iterates in insertion or id order, so results are deterministic.
"""

from __future__ import annotations

import heapq
import math
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...graph import dtypes as dt
from ...graph import symbolic as sym
from ...graph.dtypes import DType
from ...graph.graph import Graph, Node, infer
from ...graph.interp import eval_node
from ...graph.ops import REDUCE, UNARY, Leaf, Op
from ...graph.symbolic import sint
from ...graph.view import View
from . import rules as R

ENode = tuple  # (op, arg, dtype code, kids); kids = (class, view id, class, view id, ...)
Subst = dict[str, tuple]  # var -> (0, class, view id) operand | (1, value, dtype) value

_DT = {d.code: d for d in dt.ALL}
FLOPS = {Op.EXP2: 16, Op.LOG2: 16, Op.SIN: 16, Op.SQRT: 4, Op.RECIP: 4, Op.MOD: 4}
LAUNCH = 4000.0
BYTE = 1.0
COST_DIM = 256


@dataclass(frozen=True)
class Limits:
    iters: int = 8
    nodes: int = 0  # 0: max(20000, 3 x the input's e-nodes)
    seconds: float = 1.0


@dataclass
class Stats:
    classes: int = 0
    nodes: int = 0
    iterations: int = 0
    stop: str = "saturated"
    fired: dict[str, int] = field(default_factory=dict)
    cost_before: float = 0.0
    cost_after: float = 0.0
    seconds: float = 0.0

    def __str__(self) -> str:
        fired = ", ".join(f"{k} x{v}" for k, v in self.fired.items()) or "none"
        return (f"e-graph: {self.classes} classes, {self.nodes} nodes, {self.iterations} "
                f"iterations ({self.stop}), cost {self.cost_before:.4g} -> "
                f"{self.cost_after:.4g}, {1e3 * self.seconds:.1f} ms; rules fired: "
                f"{fired}")  # fmt: skip


class RuleError(ValueError):
    """A rule built an ill-typed replacement: a bug in the rule, named with its file:line."""


class _Skip(Exception):
    """This match cannot be rewritten (a value did not fold, a view is not an identity)."""


@dataclass
class EClass:
    dtype: DType
    shape: tuple[sint, ...]
    nodes: list[ENode]
    parents: list[tuple[ENode, int]]


class _Typed:
    """Stands in for a Node when asking ``graph.infer`` to type an e-node."""

    __slots__ = ("dtype",)

    def __init__(self, d: DType) -> None:
        self.dtype = d


def _const_key(value: Any, d: DType) -> Any:
    # floats by bit pattern: 0.0 == -0.0 and nan != nan must not merge or split classes
    return float(value).hex() if d.is_float and not isinstance(value, sym.Expr) else value


def _const_value(key: Any, d: DType) -> Any:
    return float.fromhex(key) if isinstance(key, str) else key


class EGraph:
    def __init__(self, dims: dict[str, sym.Expr] | None = None) -> None:
        self.uf: list[int] = []
        self.classes: dict[int, EClass] = {}
        self.memo: dict[ENode, int] = {}
        self.by_op: dict[Any, dict[int, None]] = {}
        self.pending: list[int] = []
        self.views: list[View] = []
        self._vids: dict[View, int] = {}
        self._contig: list[bool] = []
        self._valid1: list[bool] = []
        self.env = {k: min(max(d.lo, COST_DIM), d.hi) for k, d in (dims or {}).items()}
        self._numel: dict[tuple, float] = {}

    # ------------------------------------------------------------------ core structure
    def view_id(self, v: View) -> int:
        k = self._vids.get(v)
        if k is None:
            k = self._vids[v] = len(self.views)
            self.views.append(v)
            self._valid1.append(v.valid == 1)
            self._contig.append(v.is_contiguous())
        return k

    def identity(self, shape: tuple[sint, ...]) -> int:
        return self.view_id(View.contiguous(shape))

    def find(self, c: int) -> int:
        uf = self.uf
        while uf[c] != c:
            uf[c] = uf[uf[c]]
            c = uf[c]
        return c

    def canon(self, n: ENode) -> ENode:
        kids = n[3]
        if not kids:
            return n
        find = self.find
        return (n[0], n[1], n[2], tuple(find(k) if i % 2 == 0 else k for i, k in enumerate(kids)))

    def add(self, op: Any, arg: Any, d: DType, shape: tuple[sint, ...], kids: tuple) -> int:
        n = self.canon((op, arg, d.code, kids))
        hit = self.memo.get(n)
        if hit is not None:
            return self.find(hit)
        c = len(self.uf)
        self.uf.append(c)
        self.classes[c] = EClass(d, shape, [n], [])
        self.memo[n] = c
        self.by_op.setdefault(op, {})[c] = None
        for k in n[3][::2]:
            self.classes[k].parents.append((n, c))
        return c

    def union(self, a: int, b: int) -> bool:
        a, b = self.find(a), self.find(b)
        if a == b:
            return False
        ca, cb = self.classes[a], self.classes[b]
        if ca.dtype is not cb.dtype or ca.shape != cb.shape:
            raise RuleError(
                f"cannot merge {ca.dtype.name}{ca.shape} with {cb.dtype.name}{cb.shape}"
            )
        if len(ca.parents) < len(cb.parents):
            a, b, ca, cb = b, a, cb, ca
        self.uf[b] = a
        ca.nodes += cb.nodes
        ca.parents += cb.parents
        for n in cb.nodes:
            self.by_op.setdefault(n[0], {})[a] = None
        del self.classes[b]
        self.pending.append(a)
        return True

    def rebuild(self) -> None:
        """Restore congruence: parents of merged classes that became equal are merged."""
        while self.pending:
            todo = dict.fromkeys(self.find(c) for c in self.pending)
            self.pending = []
            for c in todo:
                self._repair(self.find(c))
        for cl in self.classes.values():
            cl.nodes = list(dict.fromkeys(self.canon(n) for n in cl.nodes))

    def _repair(self, c: int) -> None:
        cl = self.classes[c]
        olds = cl.parents[:]  # unions below may append to (or move) this list
        for pn, pc in olds:
            self.memo.pop(pn, None)
            self.memo[self.canon(pn)] = self.find(pc)
        seen: dict[ENode, int] = {}
        for pn, pc in olds:
            pn = self.canon(pn)
            other = seen.get(pn)
            if other is not None:
                self.union(pc, other)
            seen[pn] = self.find(pc)
        if self.find(c) == c:  # else its parents moved to the root, which is pending
            cl.parents = list(seen.items()) + cl.parents[len(olds) :]

    def num_nodes(self) -> int:
        return sum(len(cl.nodes) for cl in self.classes.values())

    # ------------------------------------------------------------------ matching
    def _is_identity(self, vid: int, c: int) -> bool:
        return self._contig[vid] and self.views[vid].shape == self.classes[c].shape

    def _match_operand(self, p: R.Pattern, c: int, vid: int, s: Subst) -> Iterator[Subst]:
        if isinstance(p, R.PVar):
            b = s.get(p.name)
            if b is None:
                yield {**s, p.name: (0, c, vid)}
            elif self.find(b[1]) == self.find(c) and b[2] == vid:
                yield s
            return
        c = self.find(c)
        if isinstance(p, R.PConst):
            if not self._valid1[vid]:
                return
            cl = self.classes[c]
            for n in cl.nodes:
                if n[0] is Leaf.CONSTANT:
                    yield from self._bind(p.value, _const_value(n[1][0], cl.dtype), cl.dtype, s)
            return
        if self._is_identity(vid, c):
            yield from self._match_class(p, c, s)

    def _bind(self, pv: Any, value: Any, d: DType | None, s: Subst) -> Iterator[Subst]:
        if isinstance(pv, R.VVar):
            b = s.get(pv.name)
            if b is None:
                yield {**s, pv.name: (1, value, d)}
            elif _same_value(b[1], value):
                yield s
        elif not isinstance(value, sym.Expr) and not isinstance(value, DType) and value == pv:
            yield s
        elif isinstance(value, DType) and value is pv:
            yield s

    def _match_class(self, p: R.POp, c: int, s: Subst) -> Iterator[Subst]:
        for n in self.classes[c].nodes:
            if n[0] is p.op:
                yield from self._match_node(p, n, s)

    def _match_node(self, p: R.POp, n: ENode, s: Subst) -> Iterator[Subst]:
        subs: Iterator[Subst] = iter((s,))
        if p.attr is not None:
            subs = self._bind(p.attr, _DT[n[1]] if p.op is Op.CAST else n[1], None, s)
        kids = n[3]
        for s1 in subs:
            if len(p.kids) == 1:
                yield from self._match_operand(p.kids[0], kids[0], kids[1], s1)
                continue
            # commutative ops match either way round instead of storing both orders
            swap = p.op in R.COMMUTATIVE and kids[:2] != kids[2:]
            orders = [(0, 2), (2, 0)] if swap else [(0, 2)]
            for i, j in orders:
                for s2 in self._match_operand(p.kids[0], kids[i], kids[i + 1], s1):
                    yield from self._match_operand(p.kids[1], kids[j], kids[j + 1], s2)

    # ------------------------------------------------------------------ rewriting
    def _value(self, v: Any, s: Subst) -> tuple[Any, DType | None]:
        if isinstance(v, R.VVar):
            b = s[v.name]
            return (b[1], b[2]) if b[0] == 1 else (None, self.classes[self.find(b[1])].dtype)
        if not isinstance(v, R.VCall):
            return v, None
        args = [self._value(a, s) for a in v.args]
        if v.fn in R.ARITH:
            xs = [a[0] for a in args]
            if any(isinstance(x, (sym.Expr, DType)) for x in xs):
                raise _Skip
            if v.fn == "neg":
                return -xs[0], None
            a, b = xs
            r = a + b if v.fn == "+" else a - b if v.fn == "-" else a * b if v.fn == "*" else a / b
            return r, None
        return _fold(R.FOLD[v.fn][0], args)

    def _premise(self, p: R.VCall, s: Subst) -> bool:
        try:
            vals = [self._value(a, s) for a in p.args]
        except _Skip:
            return False
        x, d = vals[0]
        fn = p.fn
        if fn in ("float", "int"):
            return d is not None and (d.is_float if fn == "float" else d.is_int or d is dt.bool_)
        if fn == "num":
            return isinstance(x, (int, float))  # not symbolic
        if fn == "finite":
            return isinstance(x, sym.Expr) or (isinstance(x, (int, float)) and math.isfinite(x))
        if fn == "negzero":
            return isinstance(x, float) and x == 0.0 and math.copysign(1.0, x) < 0
        if fn in ("posinf", "neginf"):
            return isinstance(x, float) and x == (math.inf if fn == "posinf" else -math.inf)
        y = vals[1][0]
        try:
            return bool({"=": x == y, "!=": x != y, "<": x < y, "<=": x <= y, ">": x > y,
                         ">=": x >= y}[fn])  # fmt: skip
        except TypeError:  # a symbolic value has no known order
            return False

    def _type(self, p: R.Pattern, s: Subst) -> tuple[DType, tuple[sint, ...]] | None:
        """Bottom-up (dtype, shape) of a replacement, where its variables decide it."""
        if isinstance(p, R.PVar):
            b = s[p.name]
            return self.classes[self.find(b[1])].dtype, self.views[b[2]].shape
        if isinstance(p, R.PConst):
            return None
        kts = [self._type(k, s) for k in p.kids]
        known = [t for t in kts if t is not None]
        if not known:
            return None
        d0, sh = known[0]
        if p.op in REDUCE:
            ax = self._value(p.attr, s)[0]
            return d0, sh[:ax] + sh[ax + 1 :]
        if p.op is Op.CAST:
            return self._value(p.attr, s)[0], sh
        return (dt.bool_ if p.op is Op.LESS_THAN else d0), sh

    def _build(self, rule: R.Rule, p: R.Pattern, want: tuple[DType, tuple] | None,
               s: Subst) -> tuple[int, int]:  # fmt: skip
        """Instantiate a replacement; returns its operand (class, view id)."""
        if isinstance(p, R.PVar):
            b = s[p.name]
            return b[1], b[2]
        if isinstance(p, R.PConst):
            if want is None:
                raise RuleError(f"{rule.where}: rule {rule.name}: a constant's type is unknown")
            value = _to_dtype(self._value(p.value, s)[0], want[0])
            c = self.add(Leaf.CONSTANT, (_const_key(value, want[0]), want[1]), want[0], want[1], ())
            return c, self.identity(want[1])
        kw: list[tuple[DType, tuple] | None]
        if p.op in UNARY:
            kw = [want]
        elif p.op in REDUCE:
            kw = [self._type(p.kids[0], s)]
        elif p.op is Op.CAST:
            kt = self._type(p.kids[0], s)
            kw = [None if kt is None or want is None else (kt[0], want[1])]
        else:
            kts = [self._type(k, s) for k in p.kids]
            known = next((t for t in kts if t is not None), None)
            d = known[0] if known else want[0] if want and p.op is not Op.LESS_THAN else None
            sh = want[1] if want else known[1] if known else None
            kw = [None if d is None or sh is None else (d, sh)] * 2
        kids = [self._build(rule, k, w, s) for k, w in zip(p.kids, kw)]
        arg = None if p.attr is None else self._value(p.attr, s)[0]
        srcs = [(_Typed(self.classes[self.find(c)].dtype), self.views[v]) for c, v in kids]
        try:
            d, shape = infer(p.op, srcs, arg)  # type: ignore[arg-type]
        except (TypeError, ValueError) as e:
            raise RuleError(f"{rule.where}: rule {rule.name} builds an ill-typed node: {e}") from e
        if p.op is Op.CAST:
            arg = d.code
        flat = tuple(x for k in kids for x in k)
        return self.add(p.op, arg, d, tuple(shape), flat), self.identity(tuple(shape))

    def apply(self, rule: R.Rule, c: int, s: Subst) -> bool:
        if not all(self._premise(p, s) for p in rule.premises):
            return False
        cl = self.classes[self.find(c)]
        try:
            nc, vid = self._build(rule, rule.rhs, (cl.dtype, cl.shape), s)
        except _Skip:
            return False
        if not self._is_identity(vid, self.find(nc)):
            return False  # a bare variable read through a real view: not a class of its own
        got = self.classes[self.find(nc)]
        if got.dtype is not cl.dtype or got.shape != cl.shape:
            raise RuleError(f"{rule.where}: rule {rule.name} turns {cl.dtype.name}{cl.shape} "
                            f"into {got.dtype.name}{got.shape}")  # fmt: skip
        return self.union(c, nc)

    def saturate(self, rules: list[R.Rule], limits: Limits, stats: Stats) -> None:
        t0 = time.perf_counter()
        cap = limits.nodes or max(20000, 3 * len(self.memo))
        for it in range(limits.iters):
            matches: list[tuple[R.Rule, int, Subst]] = []
            for rule in rules:
                cands = dict.fromkeys(self.find(c) for c in self.by_op.get(rule.lhs.op, {}))
                for c in cands:
                    for s in self._match_class(rule.lhs, c, {}):
                        matches.append((rule, c, s))
            changed = False
            stats.iterations = it + 1
            for rule, c, s in matches:
                if self.apply(rule, c, s):
                    stats.fired[rule.name] = stats.fired.get(rule.name, 0) + 1
                    changed = True
                if len(self.memo) > cap:
                    stats.stop = f"node cap {cap}"
                    break
            self.rebuild()
            if stats.stop != "saturated":
                return
            if not changed:
                return
            if time.perf_counter() - t0 > limits.seconds:
                stats.stop = f"time cap {limits.seconds} s"
                return
        else:
            stats.stop = f"iteration cap {limits.iters}"

    # ------------------------------------------------------------------ cost and extraction
    def numel(self, shape: tuple[sint, ...]) -> float:
        hit = self._numel.get(shape)
        if hit is None:
            hit = float(np.prod([float(sym.evaluate(x, self.env)) for x in shape]))
            self._numel[shape] = hit
        return hit

    def node_cost(self, n: ENode, c: int) -> float:
        op = n[0]
        if isinstance(op, Leaf):
            return 0.0
        cl = self.classes[c]
        out = self.numel(cl.shape)
        if op in REDUCE:
            return 1.0 + LAUNCH + self.numel(self.views[n[3][1]].shape) + out * cl.dtype.bits / 8
        if op in (Op.GATHER, Op.SCATTER):
            return 1.0 + LAUNCH + out * (1 + cl.dtype.bits / 8 * BYTE)
        return 1.0 + out * FLOPS.get(op, 1)

    def extract(self) -> dict[int, ENode]:
        """The cheapest node of every class reachable from leaves (a Dijkstra-style pass:
        a class's cost is final when popped, since a node costs more than each child)."""
        occ: list[tuple[int, ENode, tuple[int, ...]]] = []
        users: dict[int, list[int]] = {}
        left: list[int] = []
        heap: list[tuple[float, int]] = []
        for c, cl in self.classes.items():
            for n in cl.nodes:
                k = len(occ)
                kids = tuple(dict.fromkeys(n[3][::2]))
                occ.append((c, n, kids))
                left.append(len(kids))
                for kc in kids:
                    users.setdefault(kc, []).append(k)
                if not kids:
                    heapq.heappush(heap, (self.node_cost(n, c), k))
        best: dict[int, ENode] = {}
        cost: dict[int, float] = {}
        while heap:
            w, k = heapq.heappop(heap)
            c, n, _ = occ[k]
            if c in best:
                continue
            best[c], cost[c] = n, w
            for k2 in users.get(c, ()):
                left[k2] -= 1
                if left[k2] == 0:
                    c2, n2, kids2 = occ[k2]
                    if c2 not in best:
                        w2 = self.node_cost(n2, c2) + sum(cost[x] for x in kids2)
                        heapq.heappush(heap, (w2, k2))
        return best

    def dag_cost(self, choice: dict[int, ENode], roots: list[int]) -> float:
        seen: dict[int, None] = {}
        stack = [self.find(r) for r in roots]
        total = 0.0
        while stack:
            c = stack.pop()
            if c in seen:
                continue
            seen[c] = None
            n = choice[c]
            total += self.node_cost(n, c)
            stack.extend(self.find(k) for k in n[3][::2])
        return total


def _same_value(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a.hex() == b.hex()
    return type(a) is type(b) and a == b if not isinstance(a, sym.Expr) else a is b


def _to_dtype(value: Any, d: DType) -> Any:
    """A Python constant of dtype ``d`` (rounded as the interpreter rounds constants)."""
    if isinstance(value, sym.Expr):
        if d.is_float:
            raise _Skip
        return value
    if isinstance(value, DType) or value is None:
        raise _Skip
    try:
        with np.errstate(all="ignore"):
            if d.is_float:
                return float(np.asarray(value, dtype=np.float64).astype(d.np_type))
            if d is dt.bool_:
                return bool(value)
            if isinstance(value, float) and not value.is_integer():
                raise _Skip
            return int(dt.np_cast(np.asarray(int(value), dtype=np.int64), d))
    except (OverflowError, ValueError) as e:
        raise _Skip from e


def _fold(op: Op, args: list[tuple[Any, DType | None]]) -> tuple[Any, DType]:
    """``op`` applied to constants exactly as the reference interpreter computes it."""
    g = Graph("fold")
    srcs = []
    attr = None
    for v, d in args:
        if op is Op.CAST and attr is None:
            attr = v
            continue
        if d is None or isinstance(v, sym.Expr):
            raise _Skip
        n = g.add_constant(v, d)
        srcs.append((n, View.contiguous(())))
    try:
        node = g.add_op(op, srcs, arg=attr)
        vals = [eval_node(s, [], {}) for s, _ in srcs]
        out = eval_node(node, vals, {})
    except (TypeError, ValueError, ArithmeticError) as e:
        raise _Skip from e
    d = node.dtype
    a = np.asarray(out)
    r = float(a.astype(np.float64)) if d.is_float else bool(a) if d is dt.bool_ else int(a)
    return r, d


# ----------------------------------------------------------------------------- graph <-> e-graph
def from_graph(graph: Graph) -> tuple[EGraph, list[tuple[str, int, int]], dict[int, ENode]]:
    """The e-graph of ``graph``'s live nodes, its outputs as (name, class, view id), and the
    input graph's own choice of node per class (to cost it)."""
    eg = EGraph(graph.dims())
    cls: dict[int, int] = {}
    orig: dict[int, ENode] = {}

    def edge(s: Node, v: View) -> tuple[int, int]:
        if s.op is Leaf.CONSTANT:
            c = eg.add(Leaf.CONSTANT, (_const_key(s.arg, s.dtype), v.shape), s.dtype, v.shape, ())
            orig[c] = eg.classes[c].nodes[0]
            return c, eg.view_id(View(v.shape, View.contiguous(v.shape).index, v.valid))
        return cls[s.id], eg.view_id(v)

    outs: list[tuple[str, int, int]] = []
    for n in graph.toposort():
        if n.op is Leaf.CONSTANT:
            continue
        kids = tuple(x for s, v in n.srcs for x in edge(s, v))
        if n.op is Leaf.OUTPUT:
            outs.append((n.arg, kids[0], kids[1]))
            continue
        arg: Any = n.arg
        if n.op is Op.CAST:
            arg = n.dtype.code
        elif n.op is Op.IOTA:
            arg = (n.arg, n.shape)
        c = eg.add(n.op, arg, n.dtype, n.shape, kids)
        cls[n.id] = c
        orig.setdefault(c, eg.classes[c].nodes[0])
    order = {name: i for i, name in enumerate(graph.outputs)}
    outs.sort(key=lambda o: order[o[0]])
    return eg, outs, orig


def to_graph(eg: EGraph, graph: Graph, outs: list[tuple[str, int, int]],
             choice: dict[int, ENode]) -> Graph:  # fmt: skip
    """A new graph (same class, name, inputs, weights and outputs) built from ``choice``."""
    g = type(graph)(graph.name)
    g.weights = dict(graph.weights)
    for name, inp in graph.inputs.items():
        g.add_input(name, inp.shape, inp.dtype, weight=inp.arg[1])
    built: dict[int, Node] = {}

    def src(c: int, vid: int) -> tuple[Node, View]:
        c = eg.find(c)
        n, v = choice[c], eg.views[vid]
        if n[0] is Leaf.CONSTANT:
            d = eg.classes[c].dtype
            return g.add_constant(_const_value(n[1][0], d), d), View(v.shape, 0, v.valid)
        return built[c], v

    stack = [eg.find(c) for _, c, _ in outs]
    while stack:  # iterative post-order: model graphs are deeper than Python's recursion limit
        c = stack[-1]
        if c in built:
            stack.pop()
            continue
        n = choice[c]
        todo = [k for k in (eg.find(x) for x in n[3][::2])
                if k not in built and choice[k][0] is not Leaf.CONSTANT]  # fmt: skip
        if todo:
            stack.extend(todo)
            continue
        stack.pop()
        op, arg, d, kids = n[0], n[1], _DT[n[2]], n[3]
        if op is Leaf.INPUT:
            built[c] = g.inputs[arg[0]]
        elif op is Leaf.CONSTANT:
            continue
        elif op is Op.IOTA:
            built[c] = g.add_op(op, [], arg=arg[0], shape=arg[1], dtype=d)
        else:
            srcs = [src(kids[i], kids[i + 1]) for i in range(0, len(kids), 2)]
            built[c] = g.add_op(op, srcs, arg=d if op is Op.CAST else arg)
    for name, c, vid in outs:
        g.add_output(name, src(c, vid))
    return g


def simplify(graph: Graph, rules: list[R.Rule] | None = None, limits: Limits | None = None,
             verbose: bool = False) -> tuple[Graph, Stats]:  # fmt: skip
    """Saturate ``graph``'s e-graph with ``rules`` (default: every rule file) and extract the
    cheapest equivalent graph; the input graph itself when nothing cheaper was found."""
    t0 = time.perf_counter()
    stats = Stats()
    eg, outs, orig = from_graph(graph)
    roots = [c for _, c, _ in outs]
    stats.cost_before = eg.dag_cost(orig, roots)
    eg.saturate(R.DEFAULT if rules is None else rules, limits or Limits(), stats)
    best = eg.extract()
    stats.cost_after = eg.dag_cost(best, roots)
    stats.classes, stats.nodes = len(eg.classes), eg.num_nodes()
    out = graph
    if stats.cost_after < stats.cost_before:
        out = to_graph(eg, graph, outs, best)
        out.verify()
    else:
        stats.cost_after = stats.cost_before
    stats.seconds = time.perf_counter() - t0
    if verbose:
        print(f"luminal: {graph.name!r}: {stats}", file=sys.stderr)
    return out, stats
