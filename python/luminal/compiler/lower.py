"""Lowering: a graph of primitives -> kernels of the kernel IR plus a buffer table.

The baseline schedule: a node is *materialized* (gets a buffer and a kernel) when it is a
reduction, gather or scatter, has several consumers, or feeds an output; every other
elementwise node (and every constant and iota) is *inlined* into its consumers, through
whatever view connects them. So an elementwise chain becomes one kernel, and a reduction
fuses with the elementwise producers of its input. The search (compiler/search) improves on
this by choosing among alternatives; this lowering is always available and always correct.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from ..graph import dtypes as dt
from ..graph import symbolic as sym
from ..graph.graph import Graph, Node
from ..graph.ops import ELEMENTWISE, REDUCE, TRANSCENDENTAL, Leaf, Op
from ..graph.symbolic import sint
from ..graph.view import View
from . import kernel_ir as K
from .attention import SoftmaxSumMatch, match_softmax_sums
from .masked import assuming, read_at, unflatten

Role = Literal["input", "weight", "output", "scratch"]


@dataclass
class BufferInfo:
    id: int
    name: str
    dtype: dt.DType
    shape: tuple[sint, ...]
    role: Role
    alias: int | None = None  # output written in place into this input buffer

    def numel(self) -> sint:
        n: sint = 1
        for s in self.shape:
            n = sym.mul(n, s)
        return n

    def nbytes(self) -> sint:
        return sym.ceildiv(sym.mul(self.numel(), self.dtype.bits), 8)


@dataclass
class Lowered:
    buffers: list[BufferInfo]
    kernels: list[K.Kernel]
    dims: dict[str, sym.Expr]
    weights: dict[str, object] = field(default_factory=dict)  # weight name -> array
    # inlined nodes a consumer reads through overlapping windows (each element several times,
    # recomputed per read): whether to store them is the search's choice (search/fusion.py)
    windowed: tuple[int, ...] = ()

    def verify(self) -> None:
        for k in self.kernels:
            k.verify()


def _numel(shape: tuple[sint, ...]) -> sint:
    out: sint = 1
    for d in shape:
        out = sym.mul(out, d)
    return out


def _consumers(graph: Graph, live: list[Node]) -> dict[int, list[Node]]:
    out: dict[int, list[Node]] = {n.id: [] for n in live}
    for n in live:
        for s, _ in n.srcs:
            out[s.id].append(n)
    return out


class _Lowerer:
    def __init__(
        self,
        graph: Graph,
        in_place: frozenset[str] = frozenset(),
        store: frozenset[int] = frozenset(),
    ) -> None:
        self.graph = graph
        self.store = store  # node ids stored, never inlined (the search's fusion choices)
        self.windowed: list[int] = []
        self.in_place = in_place  # outputs of graph.state to write into their inputs
        outs = list(graph.outputs.values())
        self.order = graph.toposort(outs)
        self.by_id = {m.id: m for m in self.order}
        self.consumers = _consumers(graph, self.order)
        self.buffers: list[BufferInfo] = []
        self.buf_of: dict[int, int] = {}  # node id -> buffer id
        self.kernels: list[K.Kernel] = []
        self.values: dict[int, K.Value] = {}  # inlined node id -> value over its own index vars
        # the online-softmax rewrite (compiler/attention.py): each match's weights are never
        # materialized, and its score is computed inside the one pass over the keys
        self.softmax_sums = {m.out.id: m for m in match_softmax_sums(self.order, self.consumers)}
        self.absorbed: set[int] = set()
        self.forced: set[int] = set()
        for m in self.softmax_sums.values():
            self.absorbed |= m.absorbed
            self.forced |= self._score_chain(m)
        # narrow floats stored in their own type, widened where read (_narrow_source)
        self.narrow: set[int] = set()
        # values a consumer would read many times per element (_recomputes): stored even when
        # small enough to recompute in each consumer kernel (materialized)
        self.reread: set[int] = set()
        self.inline = self._plan_fusion()
        self._reads: dict[tuple[int, View], K.Value] = {}
        self._subst_memo: dict[tuple, dict[int, object]] = {}

    def new_buffer(self, name: str, dtype: dt.DType, shape: tuple[sint, ...], role: Role) -> int:
        self.buffers.append(BufferInfo(len(self.buffers), name, dtype, shape, role))
        return len(self.buffers) - 1

    def _plan_fusion(self) -> set[int]:
        """Nodes to inline, decided consumers-first: a node whose consumers all end up in the
        same kernel is inlined there for free (codegen computes a shared subtree once), and a
        reduction read once per row (a row max, a mean) is inlined and hoisted out of the
        inner loop."""
        roots: dict[int, frozenset[int]] = {}
        inline: set[int] = set()
        costly = self._transcendental_chains()
        index_only: set[int] = set()
        for n in self.order:
            if (
                n.op in ELEMENTWISE
                and not costly[n.id][0]
                and costly[n.id][1] <= INDEX_CHAIN_OPS
                and all(s.op in (Leaf.CONSTANT, Op.IOTA) or s.id in index_only for s, _ in n.srcs)
            ):
                index_only.add(n.id)
        # looped[n]: n's own axes that vary inside some reduction's loop of its final kernel
        # (_VARIES: its value sits under a mask that does); empty: codegen can hoist n out of
        # every such loop, as a softmax's row max out of the row sum
        looped: dict[int, frozenset[int]] = {}
        # gathers from each node up to its kernel's root, itself included (see GATHER_NEST_MAX)
        nest: dict[int, int] = {}
        for n in reversed(self.order):
            cons = self.consumers[n.id]
            r = frozenset().union(*(roots[c.id] for c in cons)) if cons else frozenset()
            looped[n.id] = self._looped_axes(n, cons, inline, looped)
            ok = False
            if n.id in self.store and n.id not in self.absorbed and n.id not in self.forced:
                ok = False
            elif n.id in self.absorbed or n.id in self.forced:
                ok = True
            elif n.id in self.narrow or n.id in self.softmax_sums:
                # a softmax-weighted sum is a kernel of its own: the attention code path
                # takes it only at a kernel's top (inside another value it runs as a scalar
                # loop over the keys for every output element)
                ok = False
            elif n.op in (Leaf.CONSTANT, Op.IOTA):
                ok = True
            elif n.id in index_only and not any(c.op is Leaf.OUTPUT for c in cons):
                # a few ALU ops on index values and constants (a quantized weight's nibble
                # scale): recomputing them is free, and once a loop rewrite fixes the
                # indices they fold to literals
                ok = True
            elif (
                n.op is Leaf.INPUT or n.op is Leaf.OUTPUT or any(c.op is Leaf.OUTPUT for c in cons)
            ):
                ok = False
            elif _is_copy(n):
                ok = False  # an explicit copy (compiler/stage.py) exists to be stored
            elif n.op is Op.GATHER:
                # an indexed read: inlined into elementwise consumers of one kernel, which
                # then load the rows they use (an embedding row plus its position; the rows
                # of a packed batch that attention reads as a padded one) instead of a
                # stored copy of them
                views = {v for c in cons for s, v in c.srcs if s is n}
                ok = (
                    len(r) == 1
                    and all(c.op in ELEMENTWISE for c in cons)
                    and len({read_at(v, n.shape) for v in views}) == 1
                    and max((nest[c.id] for c in cons), default=0) < GATHER_NEST_MAX
                )
            elif n.op in ELEMENTWISE or _small_reduce(n):
                # (a reduction over 2-4 values, relu's max against 0, is elementwise work)
                # one kernel, and one view: then every use is the same shared subtree (reads
                # through different views would each recompute it, exponentially in a chain)
                views = {v for c in cons for s, v in c.srcs if s is n}
                ok = len(r) == 1 and len({read_at(v, n.shape) for v in views}) == 1
                if ok and any(self._recomputes(n, c, costly, looped, inline) for c in cons):
                    ok = False
                    self.reread.add(n.id)
                if ok and len(cons) > 1:
                    # keep index math simple: div/mod views compose into large expressions
                    vw = next(iter(views))
                    ok = not _has_divmod(unflatten(vw.index, n.shape, vw.valid))
                if ok and costly.get(n.id, (False, 0))[1] + int(_small_reduce(n)) > 0:
                    if any(_overlapping(v, n.shape) for v in views):
                        self.windowed.append(n.id)
                narrow = None if ok else _narrow_source(n)
                if narrow is not None and narrow.id not in self.absorbed | self.forced:
                    self.narrow.add(narrow.id)
                    ok = True
            elif n.op in REDUCE and len(cons) <= 2:
                # never into a kernel that is itself a reduction: there it would sit inside
                # the outer loop and be recomputed per step (a matmul feeding a matmul)
                ok = all(self._cheap_read(n, c, len(cons)) for c in cons) and not looped[n.id]
                if ok and any(c.id in inline for c in cons):
                    ok = not self._recomputed(n, r)
            up = max((nest[c.id] for c in cons), default=0) if ok else 0
            nest[n.id] = up + int(n.op is Op.GATHER)
            if ok:
                inline.add(n.id)
                roots[n.id] = r
            else:
                roots[n.id] = frozenset({n.id})
        return inline

    def _looped_axes(
        self, n: Node, cons: list[Node], inline: set[int], looped: dict[int, frozenset[int]]
    ) -> frozenset[int]:
        """Axes of ``n`` that vary inside a reduction loop of the kernel its consumers land
        in: a consumer's looped axes (its own reduced axis, for a reduction with a loop, plus
        those of an inlined consumer) mapped through the view it reads ``n`` by."""
        out: set[int] = set()
        for c in cons:
            if c.op in REDUCE:
                # the consumer's source index space: its output axes with the reduced one
                # inserted at c.arg
                above = looped.get(c.id, frozenset()) if c.id in inline else frozenset()
                c_loop = {a if a < c.arg else a + 1 for a in above if a != _VARIES}
                if _VARIES in above:
                    c_loop.add(_VARIES)
                if not _small_reduce(c):
                    c_loop.add(c.arg)
            elif c.id in inline and c.op in ELEMENTWISE:
                c_loop = set(looped.get(c.id, frozenset()))
            else:
                continue
            if not c_loop:
                continue
            if _VARIES in c_loop:
                out.add(_VARIES)
            names = {f"_i{a}" for a in c_loop}
            for s, v in c.srcs:
                if s is not n:
                    continue
                if isinstance(v.valid, sym.Expr) and {x.name for x in v.valid.vars()} & names:
                    out.add(_VARIES)  # under a mask that changes within the loop: not hoisted
                idx = unflatten(v.index, n.shape, v.valid) if n.shape else {}
                for k in range(len(n.shape)):
                    e = idx.get(f"_i{k}", 0)
                    if isinstance(e, sym.Expr) and {x.name for x in e.vars()} & names:
                        out.add(k)
        return frozenset(out)

    def _score_chain(self, m: SoftmaxSumMatch) -> set[int]:
        """The score node and the elementwise nodes (and first reductions, the QK^T sums)
        above it that only feed the pattern: inlined into the one-pass kernel."""
        inside = set(m.absorbed)
        chain: set[int] = set()
        stack = [m.score]
        while stack:
            n = stack.pop()
            if n.id in chain or not all(
                c.id in inside or c.id in chain for c in self.consumers[n.id]
            ):
                continue
            if n.op not in ELEMENTWISE and n.op not in REDUCE:
                continue
            chain.add(n.id)
            if n.op in ELEMENTWISE:
                stack += [s for s, _ in n.srcs]
        return chain

    def _transcendental_chains(self) -> dict[int, tuple[bool, int]]:
        """Per elementwise node: (its elementwise ancestry holds a transcendental op, ALU ops
        in that ancestry, capped): what inlining it costs per read."""
        out: dict[int, tuple[bool, int]] = {}
        for n in self.order:
            if n.op in ELEMENTWISE:
                up = [out[s.id] for s, _ in n.srcs if s.id in out]
                out[n.id] = (
                    n.op in TRANSCENDENTAL or any(t for t, _ in up),
                    min(RECOMPUTE_READS, int(n.op is not Op.CAST) + sum(c for _, c in up)),
                )
        return out

    def _recomputes(
        self,
        n: Node,
        c: Node,
        costly: dict[int, tuple[bool, int]],
        looped: dict[int, frozenset[int]],
        inline: set[int],
    ) -> bool:
        """Whether inlining ``n`` into consumer ``c`` recomputes it many times: ``c`` reads
        each element of ``n`` for several values of an index that codegen cannot hoist ``n``
        out of (the innermost loop it can: a reduction's own axis; for an elementwise ``c``
        inside a reduction's loop, the axis that loop runs along, else ``c``'s last axis).
        Transcendental chains are stored when read twice; other chains when read 64 times
        (the normalized activation feeding a GEMV row loop)."""
        trans, ops = costly.get(n.id, (False, 0))
        if not trans and ops == 0:
            return False
        inner = looped.get(c.id, frozenset()) if c.id in inline else frozenset()
        for s, v in c.srcs:
            if s is not n:
                continue
            used = {x.name for x in v.index.vars()} if isinstance(v.index, sym.Expr) else set()
            if c.op in REDUCE:
                hoisted = {c.arg}
            elif inner and _VARIES not in inner:
                # a product's operand broadcast along its output columns ([K, N] weights:
                # x @ W), summed along K: the sum's loop is innermost and every column
                # computes the operand again
                hoisted = set(inner)
            else:
                hoisted = {len(v.shape) - 1}
            factor = 1
            for k, ext in enumerate(v.shape):
                if k not in hoisted and f"_i{k}" not in used:
                    factor *= max(sym.lower_bound(ext), 1)
            if factor >= (2 if trans else RECOMPUTE_READS):
                return True
        return False

    def materialized(self, n: Node) -> bool:
        if n.id in self.inline:
            return False
        if n.id in self.store or n.id in self.narrow or n.id in self.reread:
            return True
        if _is_copy(n):
            return True
        if n.op is Leaf.INPUT or any(c.op is Leaf.OUTPUT for c in self.consumers[n.id]):
            return True
        if (n.op in ELEMENTWISE or _small_reduce(n)) and len(self.consumers[n.id]) <= 3:
            # consumers in different kernels: recompute a small reduction-free expression in
            # each rather than store and reload it
            v = self.value_of(n)
            size = sum(1 for _ in K.walk(v))
            big = size > SHARED_TREE_MAX
            return big or any(isinstance(x, (K.Reduce, K.Gather)) for x in K.walk(v))
        return True

    def _recomputed(self, n: Node, roots: frozenset[int]) -> bool:
        """Whether reduction ``n``, read by a value computed inside the kernels of ``roots``,
        would run more than once per element there after hoisting out of their innermost
        loops: a layer norm's row statistics inside the im2col copy of the convolution after
        it, once per (channel, tap) of each patch."""
        size = sym.upper_bound(_numel(n.shape))
        for rid in roots:
            shape = self.by_id[rid].shape
            inner = sym.upper_bound(shape[-1]) if shape else 1
            if sym.upper_bound(_numel(shape)) > size * max(inner, 1):
                return True
        return False

    def _cheap_read(self, n: Node, c: Node, n_consumers: int) -> bool:
        if c.op in ELEMENTWISE:
            inner = f"_i{len(c.shape) - 1}" if c.shape else None
        elif c.op in REDUCE:
            inner = f"_i{c.arg}"
        else:
            return False
        for s, v in c.srcs:
            if s is not n:
                continue
            if n_consumers == 1 and v == View.contiguous(n.shape):
                continue  # pointwise: each value computed exactly once either way
            idx = unflatten(v.index, n.shape, v.valid) if n.shape else {}
            used = {x.name for e in idx.values() if isinstance(e, sym.Expr) for x in e.vars()}
            if isinstance(v.valid, sym.Expr):
                used |= {x.name for x in v.valid.vars()}
            if inner is None or inner in used:
                return False
        return True

    # ---------------------------------------------------------------- reading an edge
    def read(self, src: Node, view: View) -> K.Value:
        """The value a consumer sees at its index vars when reading ``src`` through ``view``.
        Memoized, so two reads of one node through one view share a subtree (a DAG, not an
        exponentially large tree)."""
        key = (src.id, view)
        hit = self._reads.get(key)
        if hit is None:
            hit = self._reads[key] = self._read(src, view)
        return hit

    def subst(self, v: K.Value, mapping: dict[str, sint]) -> K.Value:
        """K.substitute with one memo per mapping for the whole lowering, so a subtree shared
        by several consumers stays shared after substitution."""
        if all(
            isinstance(e, sym.Expr) and e.kind == sym.VAR and e.name == k
            for k, e in mapping.items()
        ):
            return v
        key = tuple(sorted(mapping.items(), key=lambda kv: kv[0]))
        return K.substitute(v, mapping, self._subst_memo.setdefault(key, {}))

    def _read(self, src: Node, view: View) -> K.Value:
        if src.op is Leaf.CONSTANT:
            v: K.Value = (
                K.IndexVal(src.arg, src.dtype)
                if isinstance(src.arg, sym.Expr) and not src.dtype.is_float
                else K.Cast(K.IndexVal(src.arg, dt.i64), src.dtype) if isinstance(src.arg, sym.Expr)
                else K.Const(src.arg, src.dtype)
            )  # fmt: skip
            return v if view.valid == 1 else _masked(view.valid, v)
        if src.id in self.buf_of:
            index = assuming(view.index, view.valid)
            return K.Load(self.buf_of[src.id], index, view.valid, src.dtype)
        inner = self.values[src.id]
        if not src.shape:
            out = inner
        else:
            out = self.subst(inner, unflatten(view.index, src.shape, view.valid))
        return out if view.valid == 1 else _masked(view.valid, out)

    # ---------------------------------------------------------------- node values
    def value_of(self, n: Node) -> K.Value:
        """n's value at its own index vars, reading its sources (inlined or loaded)."""
        op = n.op
        if op in ELEMENTWISE:
            srcs = tuple(self.read(s, v) for s, v in n.srcs)
            if op is Op.CAST:
                return srcs[0] if srcs[0].dtype is n.dtype else K.Cast(srcs[0], n.dtype)
            return K.Alu(op, srcs, n.dtype)
        if op is Op.IOTA:
            return K.IndexVal(n.arg, n.dtype)
        if n.id in self.softmax_sums:
            return self._softmax_sum(self.softmax_sums[n.id])
        if op in REDUCE:
            (s, v), axis = n.srcs[0], n.arg
            ext = v.shape[axis]
            rv = sym.var(f"_r{n.id}", 0, max(sym.upper_bound(ext) - 1, 0), ext)
            # source index vars: output vars with the reduced axis inserted
            m: dict[str, sint] = {}
            for k in range(len(v.shape)):
                m[f"_i{k}"] = (
                    rv if k == axis else sym.index_var(k if k < axis else k - 1, v.shape[k])
                )
            body = self.subst(self.read(s, v), m)
            return K.Reduce(op, rv, ext, body, n.dtype)
        if op is Op.GATHER:
            (data, dv), (idx, iv) = n.srcs
            nidx = len(iv.shape)
            row = self.read(idx, iv)
            rows = dv.shape[0]
            gv = sym.var(f"_g{n.id}", 0, max(sym.upper_bound(rows) - 1, 0), rows)
            m = {"_i0": gv}
            for k in range(1, len(dv.shape)):
                m[f"_i{k}"] = sym.index_var(nidx + k - 1, dv.shape[k])
            body = self.subst(self.read(data, dv), m)
            return K.two_way_gather(gv, row, rows, body, n.dtype)
        raise ValueError(f"lower: no value for {n}")

    def _softmax_sum(self, m: SoftmaxSumMatch) -> K.Value:
        o, prod = m.out, m.product
        n = len(o.shape)
        ext = prod.shape[-1]
        rv = sym.var(f"_r{o.id}", 0, max(sym.upper_bound(ext) - 1, 0), ext)
        to_out: dict[str, sint] = {f"_i{k}": sym.index_var(k, o.shape[k]) for k in range(n)}
        to_out[f"_i{n}"] = rv
        # the score in the product's index space: P and S hold their elements in one order,
        # though S may have another shape (heads split off the batch axis to add a mask)
        score = self.subst(self.values[m.score.id], unflatten(m.p_view.index, m.score.shape))
        score = self.subst(score, to_out)
        score = K.Alu(Op.MUL, (score, K.Const(m.scale, o.dtype)), o.dtype)
        weight = self.subst(self.read(m.value, m.value_view), to_out)
        if weight.dtype is not o.dtype:
            weight = K.Cast(weight, o.dtype)
        return K.SoftmaxSum(rv, ext, score, weight, o.dtype)

    # ---------------------------------------------------------------- kernels
    def emit(self, n: Node, out: int) -> None:
        name = f"k{len(self.kernels)}_{n.op.name.lower()}"
        if n.op is Op.SCATTER:
            (dest, dview), (idx, iview), (src, sview) = n.srcs
            # 1) out = dest, 2) rows of src into out (a second kernel: it must see all of 1);
            # an in-place output already holds dest (it is dest's buffer)
            if self.buffers[out].alias is None:
                self.kernels.append(
                    K.Kernel(name + "_copy", n.shape, out, self.read(dest, dview), n.dtype)
                )
            row = self.read(idx, iview)
            self.kernels.append(
                K.Kernel(
                    name,
                    sview.shape,
                    out,
                    self.read(src, sview),
                    n.dtype,
                    scatter_row=row,
                    scatter_rows=dview.shape[0],
                    row_dims=len(iview.shape),
                )  # fmt: skip
            )
            return
        self.kernels.append(K.Kernel(name, n.shape, out, self.value_of(n), n.dtype))

    def run(self) -> Lowered:
        g = self.graph
        for n in self.order:
            if n.op is Leaf.INPUT:
                name, is_weight = n.arg
                role: Role = "weight" if is_weight else "input"
                self.buf_of[n.id] = self.new_buffer(name, n.dtype, n.shape, role)
            elif n.op is Leaf.OUTPUT:
                if n.id in self.buf_of:
                    continue  # its producer wrote it in place
                s, v = n.srcs[0]
                ob = self.new_buffer(n.arg, n.dtype, v.shape, "output")
                value = self.read(s, v)
                self.kernels.append(
                    K.Kernel(f"k{len(self.kernels)}_out", v.shape, ob, value, n.dtype)
                )
            elif n.op is Leaf.CONSTANT or n.id in self.absorbed:
                continue  # constants render in place; absorbed nodes live in a SoftmaxSum
            elif self.materialized(n):
                cons = self.consumers[n.id]
                upd = self._updated_input(n)
                if upd is not None:
                    # the output shares the input's memory (the plan records the alias)
                    o, inp = upd
                    b = self.new_buffer(o.arg, o.dtype, n.shape, "output")
                    self.buffers[b].alias = self.buf_of[inp.id]
                    self.buf_of[o.id] = b
                elif (
                    len(cons) == 1
                    and cons[0].op is Leaf.OUTPUT
                    and cons[0].srcs[0][1] == View.contiguous(n.shape)
                ):
                    # the only consumer is an output read contiguously: write straight into it
                    o = cons[0]
                    b = self.new_buffer(o.arg, o.dtype, n.shape, "output")
                    self.buf_of[o.id] = b
                else:
                    b = self.new_buffer(f"t{n.id}", n.dtype, n.shape, "scratch")
                self.emit(n, b)
                self.buf_of[n.id] = b
            else:
                self.values[n.id] = self.value_of(n)
        for name, n in g.inputs.items():
            if n.id not in self.buf_of and not n.arg[1]:
                # unused inputs stay in the signature, so callers need not know what was pruned
                self.buf_of[n.id] = self.new_buffer(name, n.dtype, n.shape, "input")
        windowed = tuple(i for i in self.windowed if i in self.inline)
        return Lowered(self.buffers, self.kernels, g.dims(), dict(g.weights), windowed)

    def _updated_input(self, n: Node) -> tuple[Node, Node] | None:
        """(output, input) when ``n`` is a SCATTER whose output updates its dest input in
        place (graph.state, checked again here: passes may have rebuilt the graph)."""
        if n.op is not Op.SCATTER:
            return None
        dest, dview = n.srcs[0]
        if dest.op is not Leaf.INPUT or dest.id not in self.buf_of:
            return None
        if dview != View.contiguous(dest.shape):
            return None
        for c in self.consumers[n.id]:
            if (
                c.op is Leaf.OUTPUT
                and c.arg in self.in_place
                and self.graph.state.get(c.arg) == dest.arg[0]
                and c.srcs[0][1] == View.contiguous(n.shape)
            ):
                return c, dest
        return None


def _unsafe_in_place(low: Lowered) -> set[str]:
    """In-place outputs whose input is still read (its old value) by the scatter writing it or
    by a later step: those need their own buffer."""
    bad: set[str] = set()
    aliased = [b for b in low.buffers if b.alias is not None]
    if not aliased:
        return bad
    steps = [K.step_buffers(k) for k in low.kernels]
    for b in aliased:
        written = [i for i, (w, _) in enumerate(steps) if w == [b.id]]
        first = written[0] if written else len(steps)
        if any(b.alias in r for _, r in steps[first:]):
            bad.add(b.name)
    return bad


# A chain of cheap ops read this many times per element is stored, not inlined (set on
# SmolLM2's normalized activation feeding GEMV rows: inlined, it was recomputed per row).
RECOMPUTE_READS = 64
# An index-only chain (iota and constants) of at most this many ops is inlined everywhere.
INDEX_CHAIN_OPS = 8
# A reduction-free value of at most this many IR nodes is recomputed in each of its (up to
# three) consumer kernels rather than stored and reloaded.
SHARED_TREE_MAX = 12
# At most this many gathers nest in one kernel's value; a deeper one is stored. Each inlined
# gather renames its source's whole value tree, so a chain of writes into one tensor (a
# recurrence's ``out[:, t] = ...`` in a loop: a gather of the previous result per step) grew
# the lowering and the kernel's code with the square of its length: 24 steps 6.8 s to compile,
# a 2-layer RWKV at 32 tokens not in 10 minutes. Models' own nests (an embedding row, a
# concatenation, a KV cache's two sides, a packed batch read as a padded one) are 1-3 deep.
GATHER_NEST_MAX = 4

# _overlapping's probe: index values per axis, and the value of every symbolic dim
WINDOW_PROBE = 6
WINDOW_PROBE_DIM = 12

_VARIES = -1  # a looped-axes marker: the value is under a mask that varies in the loop


def _overlapping(v: View, shape: tuple[sint, ...]) -> bool:
    """Whether ``v`` reads some element of a tensor of ``shape`` at several of its own
    indices that all matter to the read (a window: ``2*oh + kh`` with ``kh`` in 0..2; not a
    broadcast, whose extra indices are unused, nor a reshape, which is one-to-one). Probed on
    the first ``WINDOW_PROBE`` values of each index, dims at ``WINDOW_PROBE_DIM``: a window
    smaller than the probe is seen, and a false positive costs one measurement."""
    if not shape or not isinstance(v.index, sym.Expr):
        return False
    names = sorted({x.name for x in v.index.vars()})
    used = [n for n in names if n.startswith("_i")]
    if len(used) < 2:
        return False
    shapes = [*v.shape, *shape]
    dims = {x.name: min(max(WINDOW_PROBE_DIM, x.lo), x.hi) for x in sym.free_dims(shapes)}
    dims |= {n: WINDOW_PROBE_DIM for n in names if not n.startswith("_i") and n not in dims}
    axes = []
    for n in used:
        ext = sym.evaluate(v.shape[int(n[2:])], dims)
        axes.append(np.arange(min(int(ext), WINDOW_PROBE)))
    grid = np.meshgrid(*axes, indexing="ij")
    env = {**dims, **dict(zip(used, (g.ravel() for g in grid), strict=True))}
    try:
        points = (grid[0].size,)
        idx = np.broadcast_to(sym.evaluate(v.index, env), points)
        valid = np.broadcast_to(np.asarray(sym.evaluate(v.valid, env)) != 0, points)
    except (ValueError, ZeroDivisionError):
        return False
    read = idx[valid]
    return bool(len(np.unique(read)) < len(read))


def _narrow_source(n: Node) -> Node | None:
    """The source of ``n`` when ``n`` widens a narrower float to f32 or f64 (exactly: every
    narrower float is an f32): storing that source instead and widening it where it is read
    moves fewer bytes and keeps the narrow type visible to the reader (a GEMM of bf16
    operands). None otherwise."""
    if n.op is not Op.CAST or n.dtype not in (dt.f32, dt.f64):
        return None
    s, v = n.srcs[0]
    if not s.dtype.is_float or s.dtype.packed or s.dtype.bits >= n.dtype.bits:
        return None
    if s.op in (Leaf.CONSTANT, Op.IOTA) or v != View.contiguous(s.shape):
        return None
    return s


def _is_copy(n: Node) -> bool:
    """A same-dtype CAST: never made by the front end, only as an explicit copy."""
    return n.op is Op.CAST and n.srcs[0][0].dtype is n.dtype


def _small_reduce(n: Node) -> bool:
    """A reduction over a constant 2-4 values: codegen writes it out (no loop)."""
    if n.op not in REDUCE:
        return False
    ext = n.srcs[0][1].shape[n.arg]
    return isinstance(ext, int) and ext <= 4


def _has_divmod(idx: dict[str, sint]) -> bool:
    return any(sym.has_divmod(e) for e in idx.values())


def _masked(valid: sint, v: K.Value) -> K.Value:
    if valid == 0:
        return K.Const(0, v.dtype)
    return K.Masked(valid, v, v.dtype)


def lower(graph: Graph, store: frozenset[int] = frozenset()) -> Lowered:
    """Lower every output of ``graph`` to kernels (see the module doc for the schedule);
    the nodes in ``store`` get buffers of their own."""
    if not graph.outputs:
        raise ValueError(f"graph {graph.name!r} has no outputs")
    graph.verify()
    in_place = frozenset(graph.state)
    result = _Lowerer(graph, in_place, store).run()
    unsafe = _unsafe_in_place(result)
    if unsafe:  # an old value is read after the write: copy those (rare; lower once more)
        result = _Lowerer(graph, in_place - unsafe, store).run()
    result.verify()
    return result
