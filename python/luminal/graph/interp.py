"""The reference interpreter: the definition of every op.

It runs any graph on numpy arrays with dims bound at run time. Compiled plans are checked
against it; where a backend and this file disagree, this file is right.

Numerics: low-precision floats (f16, bf16, fp8, ...) compute each op in f32 and round the
result to the op's dtype; sums accumulate floats in at least f32.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from . import dtypes as dt
from . import symbolic as sym
from .graph import Graph, Node
from .ops import Leaf, Op
from .view import View


def bind_dims(
    graph: Graph, inputs: Mapping[str, Any], dims: Mapping[str, int] | None = None
) -> dict[str, int]:
    """Dims given explicitly, plus those read off inputs whose shape entry is a bare dim;
    every dim checked against its declared range."""
    declared = graph.dims()
    env: dict[str, int] = {}
    for k, v in (dims or {}).items():
        if k not in declared:
            raise ValueError(
                f"unknown dim {k!r}; graph {graph.name!r} declares {sorted(declared) or 'none'}"
            )
        env[k] = int(v)
    for name, node in graph.inputs.items():
        if name not in inputs:
            continue
        arr_shape = np.shape(inputs[name])
        if len(arr_shape) != len(node.shape):
            continue  # reported with the full shape by check_input
        for s, a in zip(node.shape, arr_shape):
            if isinstance(s, sym.Expr) and s.kind == sym.VAR:
                if s.name in env and env[s.name] != a:
                    raise ValueError(
                        f"input {name!r}: dim {s.name!r} is {a} here but {env[s.name]} elsewhere"
                    )
                env[s.name] = int(a)
    for k, v in env.items():
        d = declared[k]
        if not d.lo <= v <= d.hi:
            raise ValueError(f"dim {k!r} = {v} is outside its declared range [{d.lo}, {d.hi}]")
    return env


def check_input(name: str, node: Node, arr: Any, env: Mapping[str, int]) -> np.ndarray:
    a = np.asarray(arr)
    want = tuple(int(sym.evaluate(s, env)) for s in node.shape)
    if a.shape != want:
        raise ValueError(f"input {name!r}: expected shape {want}, got {a.shape}")
    if a.dtype != np.dtype(node.dtype.np_type):
        raise TypeError(f"input {name!r}: expected dtype {node.dtype.name}, got {a.dtype}")
    return a


def _grid(shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    n = len(shape)
    return {
        f"_i{k}": np.arange(s, dtype=np.int64).reshape([s if j == k else 1 for j in range(n)])
        for k, s in enumerate(shape)
    }


def read(view: View, arr: np.ndarray, env: Mapping[str, int]) -> np.ndarray:
    """What an edge with ``view`` sees of ``arr`` (the source's contiguous buffer)."""
    shape = tuple(int(sym.evaluate(s, env)) for s in view.shape)
    flat = arr.reshape(-1)
    if view.is_contiguous() and flat.size == int(np.prod(shape)):  # a prefix slice is not a copy
        return flat.reshape(shape)
    fast = _strided(view, shape, flat, env)
    if fast is not None:
        return fast
    g = {**env, **_grid(shape)}
    idx = np.broadcast_to(np.asarray(sym.evaluate(view.index, g), dtype=np.int64), shape)
    valid = np.broadcast_to(np.asarray(sym.evaluate(view.valid, g)) != 0, shape)
    if flat.size == 0:
        if valid.any():
            raise IndexError(f"view {view} reads an empty buffer")
        return np.zeros(shape, dtype=arr.dtype)
    safe = np.where(valid, idx, 0)
    if valid.all() and (safe.min(initial=0) < 0 or safe.max(initial=0) >= flat.size):
        raise IndexError(f"view {view} reads outside a buffer of {flat.size} elements")
    out = flat[safe]
    return out if valid.all() else np.where(valid, out, np.zeros((), dtype=arr.dtype))


def _strided(
    view: View, shape: tuple[int, ...], flat: np.ndarray, env: Mapping[str, int]
) -> np.ndarray | None:
    """A no-copy numpy view when the index is affine in the index variables and nothing is
    padded (expand, permute, slice): the common case, and far cheaper than an index grid."""
    if view.valid != 1 or 0 in shape or not isinstance(view.index, (int, sym.Expr)):
        return None
    terms, off = sym._lin(view.index)
    strides = [0] * len(shape)
    for t, c in terms.items():
        fs = t.args if t.kind == sym.MUL else (t,)
        if any(not isinstance(f, sym.Expr) or f.kind != sym.VAR for f in fs):
            return None
        ivs = [f for f in fs if f.extent is not None]
        if len(ivs) > 1 or any(f.extent is None and f.name not in env for f in fs):
            return None
        coef = c * int(np.prod([env[f.name] for f in fs if f.extent is None], dtype=np.int64))
        if ivs:
            strides[int(ivs[0].name[2:])] += coef
        else:
            off += coef
    lo = off + sum(min(0, (n - 1) * st) for n, st in zip(shape, strides))
    hi = off + sum(max(0, (n - 1) * st) for n, st in zip(shape, strides))
    if lo < 0 or hi >= flat.size:
        return None  # the general path reports the out-of-range read
    item = flat.itemsize
    return np.lib.stride_tricks.as_strided(
        flat[off:], shape, [st * item for st in strides], writeable=False
    )


def _float_op(fn: Any, d: dt.DType, *xs: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        if d in (dt.f32, dt.f64):
            return fn(*xs)
        return fn(*(x.astype(np.float32) for x in xs)).astype(d.np_type)


_UNARY = {
    Op.EXP2: np.exp2,
    Op.LOG2: np.log2,
    Op.SIN: np.sin,
    Op.SQRT: np.sqrt,
    Op.RECIP: lambda x: np.reciprocal(x),
}


def _binary(op: Op, d: dt.DType, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if op is Op.LESS_THAN:
        return np.less(a, b)
    if d is dt.bool_:
        return np.logical_and(a, b)  # MUL on bool; ADD/MOD are rejected at build time
    fn = {Op.ADD: np.add, Op.MUL: np.multiply, Op.MOD: np.fmod}[op]
    if d.is_float:
        return _float_op(fn, d, a, b)
    with np.errstate(all="ignore"):
        if op is Op.MOD and (b == 0).any():
            raise ZeroDivisionError("MOD: integer modulo by zero")
        return fn(a, b).astype(d.np_type)


def _reduce(op: Op, d: dt.DType, x: np.ndarray, axis: int) -> np.ndarray:
    if op is Op.SUM_REDUCE:
        if d.is_float:
            acc = np.float64 if d is dt.f64 else np.float32
            return x.astype(acc).sum(axis=axis).astype(d.np_type)
        return x.sum(axis=axis, dtype=d.np_type)
    if d.is_float:
        init = -np.inf
    elif d is dt.bool_:
        init = False
    else:
        init = np.iinfo(np.dtype(d.np_type)).min if d.bits >= 8 else (-8 if d is dt.i4 else 0)
    xs = x.astype(np.float32) if d.is_float and d not in (dt.f32, dt.f64) else x
    return np.max(xs, axis=axis, initial=init).astype(d.np_type)


def eval_node(n: Node, srcs: list[np.ndarray], env: Mapping[str, int]) -> np.ndarray:
    op, d = n.op, n.dtype
    if op in _UNARY:
        return _float_op(_UNARY[op], d, srcs[0])
    if op in (Op.ADD, Op.MUL, Op.MOD, Op.LESS_THAN):
        return _binary(op, n.srcs[0][0].dtype, srcs[0], srcs[1])
    if op in (Op.SUM_REDUCE, Op.MAX_REDUCE):
        return _reduce(op, d, srcs[0], n.arg)
    if op is Op.CAST:
        return dt.np_cast(srcs[0], d)
    shape = tuple(int(sym.evaluate(s, env)) for s in n.shape)
    if op is Op.IOTA:
        v = np.asarray(sym.evaluate(n.arg, {**env, **_grid(shape)}))
        return np.broadcast_to(v, shape).astype(d.np_type)
    if op is Op.GATHER:
        data, idx = srcs
        idx = idx.astype(np.int64)
        ok = (idx >= 0) & (idx < data.shape[0])
        out = data[np.where(ok, idx, 0)] if data.shape[0] else np.zeros(shape, data.dtype)
        mask = ok.reshape(ok.shape + (1,) * (data.ndim - 1))
        return np.where(mask, out, np.zeros((), data.dtype))
    if op is Op.SCATTER:
        dest, idx, src = srcs
        out = dest.copy()
        fi = idx.astype(np.int64).reshape(-1)
        fs = src.reshape((fi.size,) + dest.shape[1:])
        ok = (fi >= 0) & (fi < dest.shape[0])
        out[fi[ok]] = fs[ok]
        return out
    if op is Leaf.CONSTANT:
        v = n.arg
        if isinstance(v, sym.Expr):
            v = sym.evaluate(v, env)
        return (
            dt.np_cast(np.asarray(v), d)
            if not d.is_float
            else np.asarray(v, dtype=np.float64).astype(d.np_type)
        )
    raise ValueError(f"interp: cannot evaluate {n}")


def run(
    graph: Graph,
    inputs: Mapping[str, Any] | None = None,
    dims: Mapping[str, int] | None = None,
    outputs: list[str] | None = None,
) -> dict[str, np.ndarray]:
    """Run ``graph`` on numpy inputs; returns {output name: array}. Weights come from the
    graph (``Tensor.set``) unless given in ``inputs``."""
    inputs = dict(inputs or {})
    for name in inputs:
        if name not in graph.inputs:
            raise ValueError(
                f"unknown input {name!r}; graph {graph.name!r} has {sorted(graph.inputs)}"
            )
    feed = {**graph.weights, **inputs}
    env = bind_dims(graph, feed, dims)
    names = outputs if outputs is not None else list(graph.outputs)
    for o in names:
        if o not in graph.outputs:
            raise ValueError(
                f"unknown output {o!r}; graph {graph.name!r} has {sorted(graph.outputs)}"
            )
    vals: dict[int, np.ndarray] = {}
    result: dict[str, np.ndarray] = {}
    for n in graph.toposort([graph.outputs[o] for o in names]):
        if n.op is Leaf.INPUT:
            name = n.arg[0]
            if name not in feed:
                kind = "weight" if n.arg[1] else "input"
                raise ValueError(f"missing {kind} {name!r} (graph {graph.name!r})")
            vals[n.id] = check_input(name, n, feed[name], env)
            continue
        srcs = [read(v, vals[s.id], env) for s, v in n.srcs]
        if n.op is Leaf.OUTPUT:
            result[n.arg] = np.ascontiguousarray(srcs[0]).reshape(np.shape(srcs[0]))  # keep 0-d
            continue
        vals[n.id] = np.ascontiguousarray(eval_node(n, srcs, env))
    return {o: result[o] for o in names}
