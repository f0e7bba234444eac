"""Weight folding: evaluate the parts of a graph that depend only on weights, once, at
compile time.

A quantized weight enters a graph as packed bytes with a dequantization expression
(``loaders/quants.py``); an f16 weight as a cast. Inside a matmul that expression is cheap
when each weight element is read once (a GEMV, decode) but is recomputed for every row of a
GEMM (prefill). ``fold_weights`` finds every node whose sources are all weights or plain
constants (and whose shape and views name no dim), evaluates the outermost such nodes that
the rest of the graph reads with the reference interpreter, and replaces each by a new weight
holding the result. The matmuls that read them then see plain f32 weights, which the search
can hand to a GEMM library call. The cost is memory: a folded Q4_1 weight takes 4 bytes per
value instead of 0.625, so the caller opts in (the prefill plan of ``models.llama`` does).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from typing import Any, TypeVar

import numpy as np

from ..graph import symbolic as sym
from ..graph.graph import Graph, Node
from ..graph.interp import check_input, eval_node, read
from ..graph.ops import BINARY, TRANSCENDENTAL, UNARY, Leaf, Op
from ..graph.view import View, contiguous_strides, idx_vars

G = TypeVar("G", bound=Graph)


def _names_no_dim(n: Node) -> bool:
    exprs: list[Any] = list(n.shape)
    for _, v in n.srcs:
        exprs += [*v.shape, v.index, v.valid]
    if isinstance(n.arg, sym.Expr):
        exprs.append(n.arg)
    return not sym.free_dims(exprs)


def foldable_nodes(graph: Graph) -> tuple[set[int], list[Node]]:
    """(ids of the nodes computable from weights alone, the folding frontier: the non-leaf
    foldable nodes that some non-foldable node or an output reads, in graph order). Subgraphs
    of constants and iotas alone are not folded: kernels compute them for free."""
    order = graph.toposort()
    fold: set[int] = set()
    weighted: set[int] = set()  # foldable and reading at least one weight
    for n in order:
        if n.op is Leaf.INPUT:
            if n.arg[1] and n.arg[0] in graph.weights:
                fold.add(n.id)
                weighted.add(n.id)
        elif n.op is Leaf.CONSTANT:
            if not isinstance(n.arg, sym.Expr):
                fold.add(n.id)
        elif n.op is not Leaf.OUTPUT and _names_no_dim(n):
            if all(s.id in fold for s, _ in n.srcs):
                fold.add(n.id)
                if any(s.id in weighted for s, _ in n.srcs):
                    weighted.add(n.id)
    frontier: dict[int, Node] = {}
    for n in order:
        if n.id in fold:
            continue
        for s, _ in n.srcs:
            if s.id in weighted and isinstance(s.op, Op):
                frontier.setdefault(s.id, s)
    return fold, sorted(frontier.values(), key=lambda n: n.id)


def _evaluate(graph: Graph, targets: list[Node]) -> dict[int, np.ndarray]:
    """The values of ``targets`` (weight-only nodes), freeing each intermediate after its last
    use so peak memory stays near the largest weight's working set."""
    order = graph.toposort(targets)
    uses: dict[int, int] = {}
    for n in order:
        for s, _ in n.srcs:
            uses[s.id] = uses.get(s.id, 0) + 1
    keep = {t.id for t in targets}
    vals: dict[int, np.ndarray] = {}
    for n in order:
        if n.op is Leaf.INPUT:
            vals[n.id] = check_input(n.arg[0], n, graph.weights[n.arg[0]], {})
            continue
        srcs = [read(v, vals[s.id], {}) for s, v in n.srcs]
        vals[n.id] = _dense(eval_node(n, srcs, {}))
        for s, _ in n.srcs:
            uses[s.id] -= 1
            if uses[s.id] == 0 and s.id not in keep:
                del vals[s.id]
    return {t.id: vals[t.id] for t in targets}


def _source_weights(graph: Graph, n: Node) -> list[str]:
    """The weights ``n`` reads, largest first, without alias suffixes (``w#u8`` -> ``w``):
    the first is the tensor it is made from, not a small shared table."""
    leaves = [m for m in graph.toposort([n]) if m.op is Leaf.INPUT]
    leaves.sort(key=lambda m: -int(np.asarray(graph.weights[m.arg[0]]).nbytes))
    return [str(m.arg[0]).split("#")[0] for m in leaves]


def _fresh(base: str, taken: set[str]) -> str:
    """``base``, or ``base2``, ``base3``... if taken; the name is then taken."""
    name, k = base, 1
    while name in taken:
        k += 1
        name = f"{base}{k}"
    taken.add(name)
    return name


def _weight_name(graph: Graph, n: Node, taken: set[str]) -> str:
    """``<first weight it reads>#folded`` (quantized aliases ``w#u8`` give ``w#folded``)."""
    return _fresh((_source_weights(graph, n) or ["weight"])[0] + "#folded", taken)


def fold_weights(
    graph: G, progress: Callable[[str], None] | None = None, keep: Collection[str] = ()
) -> G:
    """A copy of ``graph`` whose weight-only subgraphs are precomputed weights (f32 for a
    dequantized weight). Expressions of the weights named in ``keep`` (by the name the graph
    gives them, without a ``#`` alias suffix) stay as they are: a weight read once per run,
    such as a language-model head applied to one row, is cheaper to read packed. Returns
    ``graph`` itself when there is nothing to fold. Weights must have data (``Tensor.set`` or
    ``data=``) to be folded."""
    _, frontier = foldable_nodes(graph)
    frontier = [n for n in frontier if not set(_source_weights(graph, n)) & set(keep)]
    if not frontier:
        return graph
    t0 = time.perf_counter()
    values = _evaluate(graph, frontier)
    g = type(graph)(graph.name)
    taken = set(graph.inputs)
    new: dict[int, Node] = {}
    for n in frontier:
        name = _weight_name(graph, n, taken)
        new[n.id] = g.add_input(name, n.shape, n.dtype, weight=True)
        g.weights[name] = values[n.id]
    # what the folded graph still needs: everything reachable without passing a folded node
    needed = {n.id for n in graph.outputs.values()}
    for n in reversed(graph.nodes):
        if n.id in needed and n.id not in new:
            needed.update(s.id for s, _ in n.srcs)
    for name, n in graph.inputs.items():  # inputs first, in the caller's order
        if n.id in needed or not n.arg[1]:
            new[n.id] = g.add_input(name, n.shape, n.dtype, weight=n.arg[1])
            if name in graph.weights:
                g.weights[name] = graph.weights[name]
    for n in graph.nodes:  # sources come before their users
        if n.id in new or n.id not in needed:
            continue
        srcs = [(new[s.id], v) for s, v in n.srcs]
        up = graph.state.get(n.arg) if n.op is Leaf.OUTPUT else None
        new[n.id] = g.add_like(n, srcs, updates=up)
    g.verify()
    if progress is not None:
        nbytes = sum(v.nbytes for v in values.values())
        progress(f"folded {len(frontier)} weight expressions into {nbytes / 2**20:.0f} MiB of "
                 f"weights in {time.perf_counter() - t0:.1f} s")  # fmt: skip
    return g


# --------------------------------------------------------------------------- compact folds
# A weight-only value that is constant along some axes (a block scale broadcast over the
# block's values) is stored once per distinct element. Folding it costs little memory and
# takes its arithmetic out of every kernel that reads it: an f16 block scale is a broadcast
# load of an f32 instead of a conversion per block, the difference for a quantized GEMV whose
# loop is a few instructions per block.
FOLD_SCALE_RATIO = 0.5  # folded bytes at most this fraction of the weights the value reads


def _axis_vars(shape: tuple[Any, ...]) -> dict[str, int]:
    return {f"_i{k}": k for k in range(len(shape))}


def _dependence(graph: Graph, fold: set[int]) -> dict[int, frozenset[int]]:
    """For each foldable elementwise node, the axes its value varies along (an over-estimate:
    an axis is kept whenever a read's index names it after simplification)."""
    dep: dict[int, frozenset[int]] = {}
    for n in graph.toposort():
        if n.id not in fold or not isinstance(n.op, Op):
            continue
        axes = _axis_vars(n.shape)
        names: set[str] = sym.var_names(n.arg) if n.op is Op.IOTA else set()
        ok = True
        for s, v in n.srcs:
            if tuple(v.shape) != tuple(n.shape):
                ok = False  # a reduction or a reshaping op: left whole
                break
            names |= sym.var_names(v.valid)
            if not isinstance(s.op, Op):  # a weight or constant: the index names its axes
                names |= sym.var_names(v.index)
                continue
            strides = contiguous_strides(s.shape)
            for k in dep.get(s.id, frozenset(range(len(s.shape)))):
                coord = sym.mod(sym.floordiv(v.index, strides[k]), s.shape[k])
                names |= sym.var_names(coord)
        if ok:
            dep[n.id] = frozenset(axes[x] for x in names if x in axes)
    return dep


def _reduced_shape(n: Node, axes: Collection[int]) -> tuple[int, ...] | None:
    """``n``'s shape with the axes not in ``axes`` at 1; None when an extent is symbolic."""
    full = _static_shape(n)
    return None if full is None else tuple(e if k in axes else 1 for k, e in enumerate(full))


def _static_shape(n: Node) -> tuple[int, ...] | None:
    out = [sym.as_int(e) for e in n.shape]
    return None if None in out else tuple(e for e in out if e is not None)


def _dense(a: Any) -> np.ndarray:
    """``a`` as a contiguous array of its own shape (``np.ascontiguousarray`` makes a 0-d value
    1-d, which a scalar node's readers then fail to broadcast)."""
    a = np.asarray(a)
    return np.ascontiguousarray(a).reshape(a.shape)


def _compact_value(graph: Graph, n: Node, dep: dict[int, frozenset[int]]) -> np.ndarray:
    """The value of ``n`` at index 0 of every axis it does not vary along (``dep``), those axes
    of size 1: the elementwise nodes that compute it are evaluated the same way, each on the
    axes it varies along, so a block scale broadcast over its block is computed once per block
    (the same floats as the whole value: each element is the same arithmetic)."""
    order = graph.toposort([n])
    vals: dict[int, np.ndarray] = {}
    reduced: set[int] = set()  # nodes held with their constant axes at size 1

    def whole(s: Node) -> np.ndarray:
        a = vals[s.id]
        if s.id in reduced:
            a = _dense(np.broadcast_to(a, _static_shape(s) or ()))
        return a

    for m in order:
        if m.op is Leaf.INPUT:
            vals[m.id] = check_input(m.arg[0], m, graph.weights[m.arg[0]], {})
            continue
        shape = _reduced_shape(m, dep[m.id]) if m.id in dep else None
        elementwise = m.op in UNARY or m.op in BINARY or m.op is Op.CAST
        if shape is None or not elementwise:
            srcs = [read(v, whole(s), {}) for s, v in m.srcs]
            vals[m.id] = _dense(eval_node(m, srcs, {}))
            continue
        srcs = []
        for s, v in m.srcs:
            if (
                s.id in reduced
                and tuple(s.shape) == tuple(m.shape)
                and v == View.contiguous(m.shape)
            ):
                srcs.append(vals[s.id])  # broadcasts against the other operands
            else:  # read at index 0 of the constant axes
                srcs.append(read(View(shape, v.index, v.valid), whole(s), {}))
        vals[m.id] = _dense(np.broadcast_to(eval_node(m, srcs, {}), shape))
        reduced.add(m.id)
    if n.id in reduced:
        return vals[n.id]
    full = vals[n.id]
    return full[tuple(slice(None) if k in dep[n.id] else slice(0, 1) for k in range(full.ndim))]


def fold_scales(graph: G, progress: Callable[[str], None] | None = None) -> G:
    """A copy of ``graph`` in which each weight-only elementwise value that varies along few of
    its axes (a quantized block's scale or offset, one value per block) is a new weight holding
    its distinct values (``<weight>#scale``), read back through a broadcasting view. Folded only
    when that takes at most ``FOLD_SCALE_RATIO`` of the bytes of the weight it comes from, so a
    plan grows by a fraction of its packed weights, or when the value holds a transcendental
    op and takes no more bytes than the weights it reads (a batch norm's scale); the values
    are the same floats the graph computes. A float weight read once with a stride along its
    reader's innermost axis is stored in the reader's order instead (``_transposed_reads``).
    Returns ``graph`` itself when nothing qualifies."""
    fold, _ = foldable_nodes(graph)
    dep = _dependence(graph, fold)
    by_id = {n.id: n for n in graph.nodes}

    def elems(i: int) -> int | None:
        out = 1
        for k in dep[i]:
            e = sym.as_int(by_id[i].shape[k])
            if e is None:
                return None
            out *= e
        return out

    def cheap(i: int) -> bool:
        n = by_id[i]
        if i not in dep or n.op is Op.IOTA or not _reads_weight(graph, n):
            return False
        size = elems(i)
        if size is None:
            return False
        sizes = [int(np.asarray(graph.weights[w]).nbytes) for w in _weights_read(graph, n)]
        folded = size * n.dtype.itemsize
        # a costly weight-only value (a batch norm's scale: gamma / sqrt(var + eps)) is folded
        # whenever the plan does not grow
        return folded <= FOLD_SCALE_RATIO * max(sizes) or (folded <= sum(sizes) and costly(i))

    costly_memo: dict[int, bool] = {}

    def costly(i: int) -> bool:
        hit = costly_memo.get(i)
        if hit is None:
            n = by_id[i]
            hit = n.op in TRANSCENDENTAL or any(costly(s.id) for s, _ in n.srcs if s.id in dep)
            costly_memo[i] = hit
        return hit

    ok = {i for i in dep if cheap(i)}
    users: dict[int, list[Node]] = {}
    for n in graph.nodes:
        for s, _ in n.srcs:
            users.setdefault(s.id, []).append(n)
    targets = [by_id[i] for i in sorted(ok) if any(u.id not in ok for u in users.get(i, []))]
    folded_ids = {n.id for n in targets}
    reads = _sparse_reads(graph, folded_ids, ok) | _transposed_reads(graph)
    if not targets and not reads:
        return graph
    t0 = time.perf_counter()
    g = type(graph)(graph.name)
    new: dict[int, Node] = {}
    taken = set(graph.inputs)
    compact: dict[int, tuple[Node, list[int]]] = {}  # folded node -> (weight, axes kept)
    packed: dict[tuple[Any, ...], tuple[np.ndarray, Node]] = {}
    nbytes = 0
    for n in targets:
        keep = sorted(dep[n.id])
        distinct = _compact_value(graph, n, dep)
        value = np.ascontiguousarray(distinct).reshape([distinct.shape[k] for k in keep])
        nbytes += value.nbytes
        name = _fresh((_source_weights(graph, n) or ["weight"])[0] + "#scale", taken)
        leaf = g.add_input(name, value.shape, n.dtype, weight=True)
        g.weights[name] = value
        compact[n.id] = (leaf, keep)
    # what the new graph still reads: a weight whose fields are all folded or repacked is gone
    needed = {n.id for n in graph.outputs.values()}
    for n in reversed(graph.nodes):
        if n.id in needed and n.id not in compact:
            needed.update(s.id for j, (s, _) in enumerate(n.srcs) if (n.id, j) not in reads)
    for name, n in graph.inputs.items():
        if n.id in needed or not n.arg[1]:
            new[n.id] = g.add_input(name, n.shape, n.dtype, weight=n.arg[1])
            if name in graph.weights:
                g.weights[name] = graph.weights[name]
    for n in graph.nodes:
        if n.id in new or (n.id not in needed and n.id not in compact):
            continue
        if n.id in compact:
            continue  # its readers read the folded weight (below)
        srcs = []
        for j, (s, v) in enumerate(n.srcs):
            if (n.id, j) in reads:
                srcs.append(_repacked(graph, g, s, v, taken, packed))
            elif s.id in compact:
                srcs.append(_through(v, s, *compact[s.id]))
            else:
                srcs.append((new[s.id], v))
        up = graph.state.get(n.arg) if n.op is Leaf.OUTPUT else None
        new[n.id] = g.add_like(n, srcs, updates=up)
    g.verify()
    if progress is not None:
        nbytes += sum(a.nbytes for a, _ in packed.values())
        progress(f"folded {len(targets)} block scales and repacked {len(packed)} strided reads "
                 f"into {nbytes / 2**20:.1f} MiB in {time.perf_counter() - t0:.1f} s")  # fmt: skip
    return g


def _through(v: View, n: Node, leaf: Node, keep: list[int]) -> tuple[Node, View]:
    """A read of ``n`` through ``v`` as a read of its compact values ``leaf`` (``n``'s axes
    ``keep``, contiguous): each kept coordinate of the flat index ``v`` gives, re-strided."""
    strides = contiguous_strides(n.shape)
    cstrides = contiguous_strides(tuple(n.shape[k] for k in keep))
    index: Any = 0
    for k, st in zip(keep, cstrides):
        coord = sym.mod(sym.floordiv(v.index, strides[k]), n.shape[k])
        index = sym.add(index, sym.mul(coord, st))
    return leaf, View(tuple(v.shape), index, v.valid)


REPACK_RATIO = 0.9  # a strided read is repacked when it covers at most this much of its weight


def _sparse_reads(graph: Graph, folded: set[int], ok: set[int]) -> set[tuple[int, int]]:
    """(node id, source position) of the elementwise reads of a weight that touch a strict part
    of it (a quantized block's quants, not its scales): stored contiguously they are a plain
    unit-stride stream, and once every field of a block is folded or repacked the packed
    original is not kept. Reads inside folded values are not needed any more."""
    out: set[tuple[int, int]] = set()
    for n in graph.nodes:
        if not isinstance(n.op, Op) or n.id in ok or n.op in (Op.GATHER, Op.SCATTER):
            continue
        for j, (s, v) in enumerate(n.srcs):
            if s.op is not Leaf.INPUT or not s.arg[1] or s.arg[0] not in graph.weights:
                continue
            if tuple(v.shape) != tuple(n.shape) or v.valid != 1:
                continue
            sizes = [sym.as_int(x) for x in v.shape]
            axes = _axis_vars(tuple(v.shape))
            used = [axes[x] for x in sorted(sym.var_names(v.index)) if x in axes]
            # only reads indexed by the view's own axes, all of fixed size (a dim or an outer
            # loop's variable has no value at compile time)
            if (
                not used
                or sym.var_names(v.index) - set(axes)
                or any(sizes[k] is None for k in used)
            ):
                continue
            elems = 1
            for k in used:
                elems *= sizes[k] or 0
            total = int(np.asarray(graph.weights[s.arg[0]]).size)
            if elems <= REPACK_RATIO * total:
                out.add((n.id, j))
    return out


def _transposed_reads(graph: Graph) -> set[tuple[int, int]]:
    """(node id, source position) of the one read of a float weight whose index is not
    unit-stride along the reader's innermost axis though the weight is (a product's weight
    stored [in, out] and summed along ``in``, GPT-2's): repacked in the reader's axis order, a
    transposed copy, its loads are contiguous and vectorize (a generated 128 x 768 x 768
    product ran 30-60x slower than the library's). Only a weight read once, by one index, so
    the copy replaces it and the plan does not grow."""
    reads: dict[int, list[tuple[Node, int, View]]] = {}
    for n in graph.nodes:
        for j, (s, v) in enumerate(n.srcs):
            if s.op is Leaf.INPUT and s.arg[1] and s.arg[0] in graph.weights:
                reads.setdefault(s.id, []).append((n, j, v))
    out: set[tuple[int, int]] = set()
    for rs in reads.values():
        if len(rs) != 1:
            continue
        n, j, v = rs[0]
        s = n.srcs[j][0]
        if not isinstance(n.op, Op) or n.op in (Op.GATHER, Op.SCATTER) or not s.dtype.is_float:
            continue
        if tuple(v.shape) != tuple(n.shape) or v.valid != 1 or not isinstance(v.index, sym.Expr):
            continue
        sizes = [sym.as_int(x) for x in v.shape]
        axes = _axis_vars(tuple(v.shape))
        names = sym.var_names(v.index)
        last = f"_i{len(v.shape) - 1}"
        if last not in names or names - set(axes) or any(sizes[axes[x]] is None for x in names):
            continue
        w = np.asarray(graph.weights[s.arg[0]])
        elems = 1
        for x in names:
            elems *= sizes[axes[x]] or 0
        # the whole weight, each element once, and not unit-stride where the reader loops
        if last_step(v) != 1 and elems == w.size and w.ndim >= 2 and w.strides[-1] == w.itemsize:
            out.add((n.id, j))
    return out


def last_step(v: View) -> sym.sint:
    """How far ``v``'s index moves when its last index variable moves by one."""
    last = len(v.shape) - 1
    iv = idx_vars(v.shape)[last]
    return sym.add(sym.substitute(v.index, {f"_i{last}": sym.add(iv, 1)}), sym.mul(v.index, -1))


def repacked_values(w: np.ndarray, v: View) -> np.ndarray:
    """The elements ``v`` reads from weight values ``w``, contiguous in ``v``'s axis order (the
    axes its index does not use left out; those it uses of static size)."""
    axes = _axis_vars(tuple(v.shape))
    used = sorted(axes[x] for x in sym.var_names(v.index) if x in axes)
    sizes = [sym.as_int(v.shape[k]) or 0 for k in used]
    # open grids: each index variable's terms are computed along its own axis, and only the
    # sums that need every axis take the weight's full size
    grid = np.meshgrid(*[np.arange(n, dtype=np.int64) for n in sizes], indexing="ij",
                       sparse=True)  # fmt: skip
    env = {f"_i{k}": a for k, a in zip(used, grid, strict=True)}
    flat = np.asarray(sym.evaluate(v.index, env), dtype=np.int64)
    return np.ascontiguousarray(np.broadcast_to(w.reshape(-1)[flat], sizes))


def repacked_view(v: View) -> View:
    """The view that reads ``repacked_values(w, v)`` back as ``v`` reads ``w``."""
    axes = _axis_vars(tuple(v.shape))
    used = sorted(axes[x] for x in sym.var_names(v.index) if x in axes)
    sizes = [sym.as_int(v.shape[k]) or 0 for k in used]
    iv = idx_vars(v.shape)
    index: Any = 0
    for k, st in zip(used, contiguous_strides(tuple(sizes))):
        index = sym.add(index, sym.mul(iv[k], st))
    return View(tuple(v.shape), index)


def _repacked(
    graph: Graph,
    g: Graph,
    s: Node,
    v: View,
    taken: set[str],
    packed: dict[tuple[Any, ...], tuple[np.ndarray, Node]],
) -> tuple[Node, View]:
    """The elements ``v`` reads from weight ``s``, as a new contiguous weight of ``s``'s dtype
    (shared by reads with the same index), and the view that reads it back."""
    axes = _axis_vars(tuple(v.shape))
    used = sorted(axes[x] for x in sym.var_names(v.index) if x in axes)
    key = (s.id, v.index, tuple(v.shape[k] for k in used))
    if key not in packed:
        values = repacked_values(np.asarray(graph.weights[s.arg[0]]), v)
        name = _fresh(str(s.arg[0]).split("#")[0] + "#packed", taken)
        leaf = g.add_input(name, values.shape, s.dtype, weight=True)
        g.weights[name] = values
        packed[key] = (values, leaf)
    return packed[key][1], repacked_view(v)


def _weights_read(graph: Graph, n: Node) -> list[str]:
    return [m.arg[0] for m in graph.toposort([n]) if m.op is Leaf.INPUT]


def _reads_weight(graph: Graph, n: Node) -> bool:
    return bool(_weights_read(graph, n))
