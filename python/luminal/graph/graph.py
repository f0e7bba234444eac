"""Nodes and graphs.

A ``Node`` is one primitive op (or an input, constant or output) applied to sources read
through views. Nodes are interned per graph by (op, sources with their views, dtype, shape,
arg), so common subexpressions are shared as they are built and a node's ``id`` is a stable
hash key. Shapes and dtypes are inferred and checked here, while the graph is built: a wrong
shape or dtype raises at the line that made it, naming the op and the shapes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from . import dtypes as dt
from . import symbolic as sym
from .dtypes import DType
from .ops import BINARY, REDUCE, UNARY, Leaf, Op
from .symbolic import sint
from .view import View

Src = tuple["Node", View]


class Node:
    __slots__ = ("op", "srcs", "dtype", "shape", "arg", "id", "graph")

    def __init__(self, graph: Graph, op: Op | Leaf, srcs: tuple[Src, ...], dtype: DType,
                 shape: tuple[sint, ...], arg: Any, nid: int) -> None:  # fmt: skip
        self.graph, self.op, self.srcs, self.dtype, self.shape, self.arg, self.id = (
            graph, op, srcs, dtype, shape, arg, nid,
        )  # fmt: skip

    def __repr__(self) -> str:
        arg = "" if self.arg is None else f", {self.arg!r}"
        return f"%{self.id} = {self.op.name}{arg} -> {self.dtype.name}{list(self.shape)}"

    @property
    def inputs(self) -> list[Node]:
        return [n for n, _ in self.srcs]


def _shape_str(shape: Sequence[sint]) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ")"


def infer(op: Op | Leaf, srcs: Sequence[Src], arg: Any) -> tuple[DType, tuple[sint, ...]]:
    """Output dtype and shape of an op, or a ValueError/TypeError naming the op and shapes."""
    name = op.name
    shapes = [v.shape for _, v in srcs]
    dts = [n.dtype for n, _ in srcs]
    arity: dict[Op | Leaf, int] = {
        **dict.fromkeys(UNARY, 1), **dict.fromkeys(BINARY, 2), **dict.fromkeys(REDUCE, 1),
        Op.CAST: 1, Op.GATHER: 2, Op.SCATTER: 3, Op.IOTA: 0, Leaf.OUTPUT: 1,
    }  # fmt: skip
    want = arity.get(op, 0)
    if len(srcs) != want:
        raise ValueError(f"{name}: expected {want} inputs, got {len(srcs)}")
    if op in UNARY:
        if not dts[0].is_float:
            raise TypeError(
                f"{name}: needs a float input, got {dts[0].name}{_shape_str(shapes[0])}"
            )
        return dts[0], shapes[0]
    if op in BINARY:
        if shapes[0] != shapes[1]:
            raise ValueError(
                f"{name}: shapes {_shape_str(shapes[0])} and {_shape_str(shapes[1])} differ "
                "(broadcast with expand first)"
            )
        if dts[0] is not dts[1]:
            raise TypeError(f"{name}: dtypes {dts[0].name} and {dts[1].name} differ (cast first)")
        if dts[0] is dt.bool_ and op in (Op.ADD, Op.MOD):
            raise TypeError(f"{name}: not defined for bool inputs")
        return (dt.bool_ if op is Op.LESS_THAN else dts[0]), shapes[0]
    if op in REDUCE:
        if not isinstance(arg, int) or not 0 <= arg < len(shapes[0]):
            raise ValueError(f"{name}: axis {arg} out of range for shape {_shape_str(shapes[0])}")
        return dts[0], shapes[0][:arg] + shapes[0][arg + 1 :]
    if op is Op.CAST:
        return dt.to_dtype(arg), shapes[0]
    if op is Op.GATHER:
        (data, idx) = shapes
        if not dts[1].is_int:
            raise TypeError(f"GATHER: indices must be integers, got {dts[1].name}")
        if len(data) < 1:
            raise ValueError("GATHER: data must have at least one dim")
        return dts[0], tuple(idx) + tuple(data[1:])
    if op is Op.SCATTER:
        dest, idx, src = shapes
        if not dts[1].is_int:
            raise TypeError(f"SCATTER: indices must be integers, got {dts[1].name}")
        if dts[0] is not dts[2]:
            raise TypeError(f"SCATTER: dest is {dts[0].name} but src is {dts[2].name}")
        if len(dest) < 1 or tuple(src) != tuple(idx) + tuple(dest[1:]):
            raise ValueError(
                f"SCATTER: src shape {_shape_str(src)} must be indices shape {_shape_str(idx)} "
                f"+ dest shape {_shape_str(dest)}[1:]"
            )
        return dts[0], tuple(dest)
    if op is Leaf.OUTPUT:
        return dts[0], shapes[0]
    raise ValueError(f"{name}: cannot infer (leaf nodes are made by Graph methods)")


_G = TypeVar("_G", bound="Graph")


class Graph:
    """A static graph of primitive ops. Build it through ``luminal.Tensor`` methods."""

    def __init__(self, name: str = "graph") -> None:
        self.name = name
        self.nodes: list[Node] = []
        self._interned: dict[tuple, Node] = {}
        self.inputs: dict[str, Node] = {}
        self.outputs: dict[str, Node] = {}
        self.weights: dict[str, Any] = {}  # name -> numpy array (weights set with Tensor.set)
        # output name -> the input it updates in place (a KV cache): the compiled plan writes
        # the output into the input's buffer, so a step need not copy the whole tensor
        self.state: dict[str, str] = {}

    def __repr__(self) -> str:
        return (
            f"Graph({self.name!r}, {len(self.nodes)} nodes, inputs={list(self.inputs)}, "
            f"outputs={list(self.outputs)})"
        )

    def _intern(
        self, op: Op | Leaf, srcs: tuple[Src, ...], dtype: DType, shape: tuple[sint, ...], arg: Any
    ) -> Node:
        key = (op, tuple((n.id, v) for n, v in srcs), dtype, shape, arg)
        hit = self._interned.get(key)
        if hit is not None:
            return hit
        node = Node(self, op, srcs, dtype, shape, arg, len(self.nodes))
        self.nodes.append(node)
        self._interned[key] = node
        return node

    def add_op(self, op: Op, srcs: Sequence[Src], arg: Any = None,
               shape: Sequence[sint] | None = None,
           dtype: DType | None = None) -> Node:  # fmt: skip
        """Add a primitive op (shape/dtype checked and inferred)."""
        for n, _ in srcs:
            if n.graph is not self:
                raise ValueError(
                    f"{op.name}: input %{n.id} belongs to another graph ({n.graph.name!r})"
                )
        if op is Op.IOTA:
            if shape is None:
                raise ValueError("IOTA: needs a shape")
            d = dtype or dt.i32
            if not d.is_int:
                raise TypeError(f"IOTA: dtype must be an integer type, got {d.name}")
            shp = tuple(shape)
            for v in _vars(arg):
                k = int(v.name[2:]) if v.extent is not None else -1
                if v.extent is not None and (k >= len(shp) or v.extent != shp[k]):
                    raise ValueError(
                        f"IOTA: expression {arg} uses index variables outside shape "
                        f"{_shape_str(shp)}"
                    )
            return self._intern(op, (), d, shp, arg)
        d, shp = infer(op, srcs, arg)
        if op is Op.CAST:
            arg = d
        return self._intern(op, tuple(srcs), d, tuple(shp), arg)

    def add_input(
        self, name: str, shape: Sequence[sint], dtype: Any = dt.f32, weight: bool = False
    ) -> Node:
        if not name or not isinstance(name, str):
            raise ValueError(f"input name must be a non-empty string, got {name!r}")
        if name in self.inputs:
            raise ValueError(f"input {name!r} is already defined in graph {self.name!r}")
        for s in shape:
            if isinstance(s, int) and s < 0:
                raise ValueError(f"input {name!r}: negative size in shape {_shape_str(shape)}")
            if not isinstance(s, (int, sym.Expr)):
                raise TypeError(f"input {name!r}: shape entries must be ints or dims, got {s!r}")
        node = self._intern(Leaf.INPUT, (), dt.to_dtype(dtype), tuple(shape), (name, weight))
        self.inputs[name] = node
        return node

    def add_like(self, n: Node, srcs: Sequence[Src], updates: str | None = None) -> Node:
        """A node like ``n`` of another graph (a constant, an output, an op; not an input),
        reading ``srcs``: graph rewrites that rebuild a graph copy nodes with this."""
        if n.op is Leaf.CONSTANT:
            return self.add_constant(n.arg, n.dtype)
        if n.op is Leaf.OUTPUT:
            return self.add_output(n.arg, srcs[0], updates=updates)
        if n.op is Op.IOTA:
            return self.add_op(n.op, [], arg=n.arg, shape=n.shape, dtype=n.dtype)
        assert isinstance(n.op, Op), f"input {n} was not registered"
        return self.add_op(n.op, list(srcs), arg=n.arg)

    def rebuilt(self: _G, sources: Callable[[Graph, Node, list[Src]], list[Src]]) -> _G:
        """A copy (same inputs and weights) in which each non-input node reads
        ``sources(copy, node, srcs)``, ``srcs`` being its sources already in the copy: how a
        rewrite that changes what some nodes read builds its graph."""
        g = type(self)(self.name)
        new: dict[int, Node] = {}
        for name, n in self.inputs.items():
            new[n.id] = g.add_input(name, n.shape, n.dtype, weight=n.arg[1])
            if name in self.weights:
                g.weights[name] = self.weights[name]
        for n in self.toposort():
            if n.id in new:
                continue
            srcs = sources(g, n, [(new[s.id], v) for s, v in n.srcs])
            up = self.state.get(n.arg) if n.op is Leaf.OUTPUT else None
            new[n.id] = g.add_like(n, srcs, updates=up)
        return g

    def add_constant(self, value: Any, dtype: Any) -> Node:
        d = dt.to_dtype(dtype)
        if isinstance(value, sym.Expr):
            pass
        elif d.is_float:
            value = float(value)
        elif d is dt.bool_:
            value = bool(value)
        else:
            value = int(value)
        return self._intern(Leaf.CONSTANT, (), d, (), value)

    def add_output(self, name: str, src: Src, updates: str | None = None) -> Node:
        """Declare output ``name``. With ``updates``, the output is the new value of that
        input, written in place: it must be a SCATTER into the input (read whole, as is),
        read whole. Compiled plans then run it without copying the input; the interpreter
        still returns a new array."""
        if name in self.outputs:
            raise ValueError(f"output {name!r} is already defined in graph {self.name!r}")
        d, shp = infer(Leaf.OUTPUT, [src], None)
        if updates is not None:
            self._check_update(name, src, updates)
        node = self._intern(Leaf.OUTPUT, (src,), d, shp, name)
        self.outputs[name] = node
        if updates is not None:
            self.state[name] = updates
        return node

    def _check_update(self, name: str, src: Src, updates: str) -> None:
        what = f"output {name!r} (updates={updates!r})"
        inp = self.inputs.get(updates)
        if inp is None or inp.arg[1]:
            raise ValueError(f"{what}: graph {self.name!r} has no input {updates!r}")
        if updates in self.state.values():
            raise ValueError(f"{what}: another output already updates {updates!r}")
        n, v = src
        if n.dtype is not inp.dtype or tuple(v.shape) != inp.shape:
            raise ValueError(
                f"{what}: output is {n.dtype.name}{_shape_str(v.shape)} but the input is "
                f"{inp.dtype.name}{_shape_str(inp.shape)}"
            )
        if inp.dtype.bits < 8:
            raise ValueError(f"{what}: {inp.dtype.name} is packed; in-place update needs bytes")
        if n.op is not Op.SCATTER or v != View.contiguous(n.shape):
            raise ValueError(f"{what}: the output must be a SCATTER into the input, read whole")
        dest, dview = n.srcs[0]
        if dest is not inp or dview != View.contiguous(inp.shape):
            raise ValueError(
                f"{what}: the SCATTER must write into input {updates!r} itself (not a view of it "
                "or another tensor)"
            )

    # ------------------------------------------------------------------ traversal / checks
    def use_counts(self) -> dict[int, int]:
        """How many edges read each node (by id; nodes nothing reads are absent)."""
        users: dict[int, int] = {}
        for n in self.nodes:
            for s, _ in n.srcs:
                users[s.id] = users.get(s.id, 0) + 1
        return users

    def toposort(self, roots: Iterable[Node] | None = None) -> list[Node]:
        """Nodes reachable from ``roots`` (default: the outputs), sources first."""
        order: list[Node] = []
        seen: set[int] = set()
        stack: list[tuple[Node, bool]] = [
            (n, False) for n in (roots if roots is not None else self.outputs.values())
        ]
        while stack:
            n, done = stack.pop()
            if done:
                order.append(n)
                continue
            if n.id in seen:
                continue
            seen.add(n.id)
            stack.append((n, True))
            stack.extend((s, False) for s, _ in reversed(n.srcs) if s.id not in seen)
        return order

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def dims(self) -> dict[str, sym.Expr]:
        """Every named dim used by the graph (shapes, views, constants, iotas)."""
        out: dict[str, sym.Expr] = {}
        for n in self.nodes:
            exprs: list[Any] = list(n.shape)
            for _, v in n.srcs:
                exprs += [*v.shape, v.index, v.valid]
            if isinstance(n.arg, sym.Expr):
                exprs.append(n.arg)
            for d in sym.free_dims(exprs):
                prev = out.setdefault(d.name, d)
                if prev is not d:
                    raise ValueError(f"dim {d.name!r} is declared twice with different bounds: "
                                     f"[{prev.lo}, {prev.hi}] and [{d.lo}, {d.hi}]")  # fmt: skip
        return out

    def verify(self) -> None:
        """Re-check every node's invariants; raises ValueError naming the first bad node."""
        pos = {n.id: i for i, n in enumerate(self.nodes)}
        for i, n in enumerate(self.nodes):
            if pos.get(n.id) != i or n.graph is not self:
                raise ValueError(f"node {n} is not registered in graph {self.name!r}")
            for s, v in n.srcs:
                if s.graph is not self or pos.get(s.id, i) >= i:
                    raise ValueError(f"node {n}: source %{s.id} is foreign or not before it")
                if v.ndim and any(
                    x.extent is not None and int(x.name[2:]) >= v.ndim for x in _vars(v.index)
                ):
                    raise ValueError(f"node {n}: view {v} uses index variables beyond its rank")
            if isinstance(n.op, Op) and n.op is not Op.IOTA:
                d, shp = infer(n.op, [(s, v) for s, v in n.srcs], n.arg)
                if d is not n.dtype or tuple(shp) != n.shape:
                    raise ValueError(f"node {n}: inferred {d.name}{_shape_str(shp)} differs")
        for name, n in self.outputs.items():
            if n.op is not Leaf.OUTPUT or n.arg != name:
                raise ValueError(f"output {name!r} is not an OUTPUT node")
        for name, inp in self.state.items():
            if name not in self.outputs or inp not in self.inputs:
                raise ValueError(f"state: output {name!r} updates unknown input {inp!r}")
        self.dims()


def _vars(e: Any) -> set[sym.Expr]:
    return e.vars() if isinstance(e, sym.Expr) else set()
