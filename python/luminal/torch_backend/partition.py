"""Split an ATen graph into luminal partitions and eager leftovers, and run the partitions.

A trial conversion of the whole graph finds the nodes luminal cannot convert; torch's
capability-based partitioner then groups the convertible nodes into submodules (never making a
cycle), and each submodule is replaced by a ``LuminalPartition`` that runs a compiled plan.
The unconvertible nodes stay in the parent graph and run in eager PyTorch.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.fx import GraphModule, Node
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase
from torch.multiprocessing.reductions import StorageWeakRef

from .. import compile as lm_compile
from .. import flags
from .. import functional as F
from ..functional._base import index_dtype
from ..graph import dtypes as dt
from ..graph import symbolic as sym
from ..graph.ops import Leaf, Op
from ..tensor import Graph, Tensor
from .call import _BITS_VIEWED, Call, complex_of, plan_array, prepare, to_torch, weight_array
from .convert import Ctx, convert_call
from .convert_views import copy_value
from .symbols import Dims, Unsupported, bare_symbol, dense_order, quotient_name


@dataclass
class Stats:
    """Counters a test or a user can read: ``luminal.torch_backend.stats``."""

    compiles: int = 0  # dynamo graphs handed to the backend
    partitions: int = 0  # luminal graphs built from them
    plans: int = 0  # luminal.compile calls (a partition compiles on its first run)
    failed_plans: int = 0  # partitions whose plan did not build: they run in eager
    eager_ops: dict[str, int] = field(default_factory=dict)  # op -> nodes left to eager
    fallbacks: list[str] = field(default_factory=list)  # why something ran in eager, per event
    partition_sizes: list[int] = field(default_factory=list)  # ATen nodes per luminal partition
    in_place: int = 0  # inputs that plans update in place (StaticCache key / value writes)
    checks: int = 0  # error checks of a plan's result left to eager (linalg's info tensors)


stats = Stats()
_warned: set[str] = set()


@contextlib.contextmanager
def _matmul_precision() -> Iterator[None]:
    """PyTorch's ``set_float32_matmul_precision("medium")`` (bf16 allowed inside float32
    matmuls) as luminal's bf16 products while a plan compiles, unless
    ``LUMINAL_MATMUL_PRECISION`` says otherwise (part of the plan cache's key either way)."""
    name = flags.MATMUL_PRECISION.name
    if name in os.environ or torch.get_float32_matmul_precision() != "medium":
        yield
        return
    os.environ[name] = "bf16"
    try:
        yield
    finally:
        os.environ.pop(name, None)


def warn_once(key: str, msg: str) -> None:
    """Record a fallback to eager in ``stats.fallbacks``; warn the first time per ``key``."""
    stats.fallbacks.append(msg)
    if key not in _warned:
        _warned.add(key)
        warnings.warn(msg, RuntimeWarning, stacklevel=3)


class Env:
    """Dims bound from the top-level arguments of the current call, shared by its partitions."""

    def __init__(self, binders: dict[str, tuple[int, int | None]],
                 multiples: dict[str, int] | None = None) -> None:  # fmt: skip
        self.binders = binders  # dim name -> (argument index, axis or None for a SymInt arg)
        self.multiples = multiples or {}  # dim name -> m its guards hold it to multiples of
        self.dims: dict[str, int] = {}
        self._sizes = [(n, i, a) for n, (i, a) in binders.items() if a is not None]
        self._ints = [(n, i) for n, (i, a) in binders.items() if a is None]
        self._quotients = [(n, m, quotient_name(n, m)) for n, m in self.multiples.items()
                           if n in binders]  # fmt: skip
        self.divides: list[tuple[sym.sint, sym.sint, str]] = []  # see Dims.divides
        self.nonneg: list[tuple[sym.sint, str]] = []  # see Dims.nonneg
        self.used: set[str] = set()  # symbols some plan takes as a dim
        # set for a call whose sizes no plan takes: every partition runs its ATen code (the
        # graph itself holds the partitions now, so the caller cannot run it around them)
        self.eager = False

    def require(self, divides: Sequence[tuple[sym.sint, sym.sint, str]],
                nonneg: Sequence[tuple[sym.sint, str]] = (),
                used: Iterable[str] = ()) -> None:  # fmt: skip
        """Take up the run-time conditions a partition's conversion relied on, and the
        symbols its plan takes as dims."""
        self.divides += [d for d in divides if d not in self.divides]
        self.nonneg += [d for d in nonneg if d not in self.nonneg]
        self.used |= set(used)

    def bind(self, args: Sequence[Any]) -> None:
        dims = {name: args[i].shape[axis] for name, i, axis in self._sizes}  # torch.Size: ints
        for name, i in self._ints:
            dims[name] = int(args[i])
            if dims[name] < 0 and name in self.used:  # a dim is a size: never negative
                raise ValueError(f"int argument {name} = {dims[name]} is negative")
        for name, m, q in self._quotients:
            if dims[name] % m:
                raise ValueError(f"size {name} = {dims[name]} is not a multiple of {m}, which "
                                 "the graph's guards promised")  # fmt: skip
            dims[q] = dims[name] // m
        for a, b, what in self.divides:
            va, vb = sym.evaluate(a, dims), sym.evaluate(b, dims)
            if vb == 0 or va % vb:
                raise ValueError(f"{what}: size {a} = {va} is not a multiple of {b} = {vb}")
        for e, what in self.nonneg:
            if sym.evaluate(e, dims) < 0:
                raise ValueError(f"{what} at these sizes")
        self.dims = dims


def binders_for(gm: GraphModule) -> dict[str, tuple[int, int | None]]:
    """Where each dynamic size can be read at run time: a bare symbol in an input's shape."""
    out: dict[str, tuple[int, int | None]] = {}
    for i, ph in enumerate(n for n in gm.graph.nodes if n.op == "placeholder"):
        val = ph.meta.get("val")
        if isinstance(val, torch.Tensor):
            for axis, s in enumerate(val.shape):
                name = bare_symbol(s)
                if name is not None:
                    out.setdefault(name, (i, axis))
        elif isinstance(val, torch.SymInt):
            name = bare_symbol(val)
            if name is not None:
                out.setdefault(name, (i, None))
    return out


# ----------------------------------------------------------------------------- graph building
@dataclass
class Built:
    graph: Graph
    dims: Dims
    inputs: list[tuple[int, str]]  # (placeholder index, luminal input name) for data inputs
    weights: list[tuple[int, Tensor]]  # (placeholder index, weight tensor)
    scalars: list[tuple[int, str]]  # (placeholder index, input name) of run-time floats
    outputs: list[Any]  # per output: ("t", name, torch dtype) | ("s", sint) | ("v", value)
    tuple_out: bool
    updated: list[int]  # placeholder indices of inputs the plan writes in place (copy_ into)
    failed: dict[Node, str]  # tolerant builds only: node -> why it cannot convert
    # placeholder indices of strided inputs a copy_ writes: the plan computes the new value,
    # the partition copies it into the tensor
    written_back: list[int] = field(default_factory=list)


# plans a partition keeps for distinct weight sets, least recently used dropped: one per layer
# when a model's layers share one graph (dynamo resumes each layer's forward after a graph
# break); each holds only its own layer's weights, and 64 exceeds the layer count of the
# transformers models this backend is checked on (a deeper model recompiles per call past it)
MAX_WEIGHT_SETS = 64
_DOWNSTREAM = "an argument luminal cannot hold"  # not this op's fault: not reported
# an input mutation the plan cannot write in place: the plan computes the new value and eager
# PyTorch copies it into the input, as AOTAutograd's epilogue would (not reported either)
_EAGER_COPY = "a new value for an input, copied by eager PyTorch"
_MISSING = object()  # a value luminal cannot hold (SymFloat, an unconverted result, ...)


def build(gm: GraphModule, weight_names: set[str], shape_env: Any, tolerant: bool = False,
          multiples: dict[str, int] | None = None) -> Built:  # fmt: skip
    """Convert ``gm`` to a luminal graph. Strict builds raise Unsupported; tolerant builds record
    each failing node and stand in an input for its value so later nodes can still be tried."""
    g = Graph("torch")
    dims = Dims(shape_env, multiples)
    cx = Ctx(g, dims)
    env: dict[Node, Any] = {}
    cx.values = env
    inputs: list[tuple[int, str]] = []
    weights: list[tuple[int, Tensor]] = []
    scalars: list[tuple[int, str]] = []
    failed: dict[Node, str] = {}
    k = 0
    outputs: list[Any] = []
    tuple_out = True
    storages: dict[Any, int] = {}  # fake storage of each tensor placeholder -> its index
    mutated = mutated_inputs(gm)
    updated: list[int] = []
    written_back: list[int] = []
    ph_index: dict[Node, int] = {}
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if node.op == "placeholder":
            ph_index[node] = k
            if node in mutated:
                flat = _flat_input(g, dims, node, val)
                if flat is _MISSING:
                    env[node] = flat
                else:
                    env[node] = flat.reshape(dims.shape(val))
                    cx.flat_inputs[id(env[node])] = flat
                    inputs.append((k, node.name))
            else:
                env[node] = _placeholder(g, dims, node, val, k, weight_names, inputs, weights,
                                         scalars)  # fmt: skip
            if isinstance(val, torch.Tensor):
                storages.setdefault(StorageWeakRef(val.untyped_storage()), k)
            k += 1
        elif node.op == "call_function":
            if not _is_tensor_value(val):  # symbolic ints and friends: plain expressions
                is_float = isinstance(val, torch.SymFloat)
                env[node] = _scalar_input(g, f"_host_{node.name}") if is_float else \
                    _host_value(dims, val)  # fmt: skip
                continue
            args = torch.fx.node.map_arg(node.args, lambda n: env[n])
            kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: env[n])
            try:
                if _has_missing((args, kwargs)):
                    raise Unsupported(_DOWNSTREAM)
                cx.val, cx.node = val, node
                if node.target is torch.ops.aten.copy_.default and node.args[0] in mutated:
                    env[node] = _write_in_place(cx, node, args)
                    updated.append(ph_index[node.args[0]])
                elif node.target is torch.ops.aten.copy_.default and node.args[0] in ph_index:
                    env[node] = _write_back(cx, node, args, inputs)
                    written_back.append(ph_index[node.args[0]])
                else:
                    env[node] = convert_call(cx, node.target, args, kwargs)
            except Unsupported as e:
                if not tolerant:
                    raise Unsupported(f"{_op_name(node.target)}: {e}") from e
                failed[node] = str(e)
                env[node] = _stand_in(g, dims, node, val)
        elif node.op == "get_attr":  # a tensor constant (e.g. an empty KV cache's start)
            const = _attr_tensor(gm, node)
            env[node] = _stand_in(g, dims, node, const) if const is not None else _MISSING
        elif node.op == "output":
            res = node.args[0]
            tuple_out = isinstance(res, (tuple, list))
            for j, r in enumerate(res if tuple_out else [res]):
                outputs.append(_output(g, dims, env, storages, r, j) if not tolerant else None)
        else:
            raise Unsupported(f"FX node kind {node.op}")
    return Built(
        g, dims, inputs, weights, scalars, outputs, tuple_out, updated, failed, written_back
    )


def _attr_tensor(gm: GraphModule, node: Node) -> torch.Tensor | None:
    obj: Any = gm
    try:
        for part in str(node.target).split("."):
            obj = getattr(obj, part)
    except AttributeError:
        return None
    return obj if isinstance(obj, torch.Tensor) else None


def mutated_inputs(gm: GraphModule) -> set[Node]:
    """Placeholders an ``aten.copy_`` writes (AOTAutograd keeps inference input mutations in
    the graph): contiguous tensors the plan can update in place, e.g. a StaticCache's."""
    out = set()
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target is torch.ops.aten.copy_.default:
            dst = n.args[0]
            if not isinstance(dst, Node):
                continue
            val = dst.meta.get("val")
            if dst.op == "placeholder" and isinstance(val, torch.Tensor) and \
                    val.is_contiguous() and val.dtype.itemsize >= 1:  # fmt: skip
                out.add(dst)
    return out


def _flat_input(g: Graph, dims: Dims, node: Node, val: torch.Tensor) -> Any:
    """A written input as the 1-D array it is in memory (read through a reshape): a SCATTER
    into it then updates the caller's tensor in place."""
    try:
        shape, dtype = dims.shape(val), dt.to_dtype(val.dtype)
    except (Unsupported, TypeError, ValueError, KeyError):
        return _MISSING
    n: sym.sint = 1
    for s in shape:
        n = sym.mul(n, s)
    return g.input(node.name, (n,), dtype)


def _write_in_place(cx: Ctx, node: Node, args: tuple) -> Tensor:
    """``copy_(input, value)`` as an in-place plan output when ``value`` is a SCATTER into that
    input (a cache write); anything else is left to eager PyTorch."""
    dst, src = args[0], copy_value(cx, args[0], args[1])
    name = str(getattr(node.args[0], "name", ""))
    into, layout = cx.flat_writes.get(id(src.node), (None, None))
    flat = cx.flat_inputs.get(id(dst))
    if flat is None:
        raise Unsupported(_EAGER_COPY)
    if into is flat.node and src.layout == layout:
        new = Tensor(src.node)  # a write into the input: that SCATTER read whole
    else:  # a whole new value (a counter += 1): a SCATTER of every element
        n = flat.shape[0]
        every = F.arange(cx.g, n, dtype=index_dtype(n))
        val = src.cast(dst.dtype).reshape(-1)
        new = Tensor(cx.g.add_op(Op.SCATTER, [flat.edge, every.edge, val.edge]))
    try:
        cx.g.output(f"_upd_{name}", new, updates=name)
    except ValueError as e:  # not a scatter into that input: a whole new value
        raise Unsupported(f"copy_ into an input: {e}") from e
    return src


def _write_back(cx: Ctx, node: Node, args: tuple, inputs: list[tuple[int, str]]) -> Tensor:
    """``copy_(input, value)`` into a strided input (not one the plan can write in place): the
    new value is a plan output the partition copies into the tensor (``copy_back``)."""
    name = str(getattr(node.args[0], "name", ""))
    if not isinstance(args[0], Tensor) or not any(n == name for _, n in inputs):
        raise Unsupported(_EAGER_COPY)
    new = copy_value(cx, args[0], args[1])
    cx.g.output(f"_upd_{name}", new if new.node.op is not Leaf.INPUT else _copy(new))
    return new


def _is_size(dims: Dims, val: Any) -> bool:
    if not isinstance(val, torch.SymInt):
        return False
    try:
        dims.expr(val)
    except Unsupported:
        return False
    return True


def _is_tensor_value(val: Any) -> bool:
    if isinstance(val, (tuple, list)):
        return any(isinstance(v, torch.Tensor) for v in val)
    return isinstance(val, torch.Tensor)


def _has_missing(x: Any) -> bool:
    if x is _MISSING:
        return True
    if isinstance(x, (tuple, list)):
        return any(_has_missing(v) for v in x)
    if isinstance(x, dict):
        return any(_has_missing(v) for v in x.values())
    return False


def _host_value(dims: Dims, val: Any) -> Any:
    try:
        if isinstance(val, (torch.SymInt, int)) and not isinstance(val, bool):
            return dims.expr(val)
    except Unsupported:
        return _MISSING
    if val is None or isinstance(val, (float, bool)):
        return val
    return _MISSING


def _scalar_input(g: Graph, name: str) -> Tensor:
    """A float only known at run time (a torch SymFloat, e.g. 1/sqrt(head_dim)) as a 0-d input."""
    return g.input(name, (), dt.f32)


def _placeholder(g: Graph, dims: Dims, node: Node, val: Any, k: int, weight_names: set[str],
                 inputs: list, weights: list, scalars: list) -> Any:  # fmt: skip
    if isinstance(val, torch.SymFloat):
        scalars.append((k, node.name))
        return _scalar_input(g, node.name)
    if not isinstance(val, torch.Tensor):
        return _host_value(dims, val)
    try:
        shape, dtype = dims.shape(val), dt.to_dtype(val.dtype)
    except (Unsupported, TypeError, ValueError, KeyError):
        return _MISSING
    if node.name in weight_names and all(isinstance(s, int) for s in shape):
        w = g.weight(node.name, shape, dtype)
        weights.append((k, w))
        return w
    inputs.append((k, node.name))
    return g.input(node.name, shape, dtype)


def _stand_in(g: Graph, dims: Dims, node: Node, val: Any, k: int = 0) -> Any:
    if isinstance(val, (tuple, list)):
        return tuple(
            _stand_in(g, dims, node, v, j) if isinstance(v, torch.Tensor) else None
            for j, v in enumerate(val)
        )
    try:
        return g.input(f"_eager_{node.name}_{k}", dims.shape(val), dt.to_dtype(val.dtype))
    except (Unsupported, TypeError, ValueError, KeyError):
        return _MISSING


def _output(g: Graph, dims: Dims, env: dict[Node, Any], storages: dict[Any, int], r: Any,
            j: int) -> Any:  # fmt: skip
    """How output ``j`` is produced at run time. Tensors must have torch's layout: AOTAutograd
    replays views on them with as_strided, so an alias of an input is returned as a view of that
    input and a permuted result keeps its strides."""
    if not isinstance(r, Node):
        return ("v", r)
    v = env[r]
    val = r.meta.get("val")
    if isinstance(v, Tensor) and isinstance(val, torch.Tensor):
        size = dims.shape(val)
        stride = tuple(dims.expr(s) for s in val.stride())
        k = storages.get(StorageWeakRef(val.untyped_storage()))
        if k is not None:
            if val.is_complex():  # a complex view of a real input's memory
                raise Unsupported(f"output {r.name}: a complex alias of an input")
            return ("alias", k, dims.expr(val.storage_offset()), size, stride)
        perm = dense_order(val, size, stride)
        name = f"out{j}"
        if perm is None:  # overlapping or gapped strides: copy into torch's layout
            g.output(name, v if v.node.op is not Leaf.INPUT else _copy(v))
            return ("strided", name, val.dtype, size, stride)
        # a complex value's real pairs keep their pair axis last (view_as_complex's layout)
        phys = v.permute([*perm, len(perm)] if val.is_complex() else perm)
        g.output(name, phys if phys.node.op is not Leaf.INPUT else _copy(phys))
        inv = sorted(range(len(perm)), key=perm.__getitem__)
        return ("t", name, val.dtype, None if perm == sorted(perm) else inv)
    if isinstance(v, (int, sym.Expr)) and not isinstance(v, bool):
        return ("s", v)
    if v is None or isinstance(v, (float, bool)):
        return ("v", v)
    raise Unsupported(f"output {r.name} of kind {type(val).__name__}")


def _copy(v: Tensor) -> Tensor:
    """An op that copies an input (a plan's outputs are written by kernels, not aliased)."""
    return v.cast(dt.u8).cast(dt.bool_) if v.dtype is dt.bool_ else v.mul(1)


def _is_error_check(node: Node) -> bool:
    """An effectful check that raises torch's error for a bad input (a singular matrix) from
    an info tensor the plan computed; it computes no value, so eager PyTorch runs it."""
    return (node.target is torch.ops.higher_order.with_effects and len(node.args) > 1
            and node.args[1] is torch.ops.aten._linalg_check_errors.default)  # fmt: skip


def _op_name(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return str(target)  # aten.convolution.default
    return str(getattr(target, "__name__", None) or target)


# ----------------------------------------------------------------------------- running
def _weight_key(t: torch.Tensor) -> tuple:
    try:
        version = t._version
    except RuntimeError:  # inference tensors have no version counter
        version = -1
    return (id(t), t.data_ptr(), version)


class LuminalPartition(torch.nn.Module):
    """A converted submodule: compiled on its first call (weights come from that call's
    arguments), recompiled only if a weight tensor is replaced or changed in place.

    FX calls it through ``__call__``, which is ``forward`` itself: a partition has no hooks,
    and ``nn.Module.__call__``'s dispatch would cost more than the rest of the glue."""

    def __init__(self, built: Built, env: Env, eager: GraphModule) -> None:
        super().__init__()
        self.built = built
        self.env = env
        self.eager = eager  # kept so a failing plan build can still run correctly
        self.cg: Any = None
        self.call: Call | None = None  # the prepared fast path, once the plan is built
        self.failed = False
        self.weight_keys: list[tuple] = []
        self.plan_dims: list[str] = []
        self.out_names: list[str] = []  # the plan's outputs in the order the native run has them
        self.copy_back: list[tuple[str, int]] = []  # (output, argument) of unaliased updates
        self.plain_out = False
        # plans by weight set: layers whose forward dynamo resumes after a graph break share
        # one graph and call it with their own parameters in turn
        self.by_weights: OrderedDict[tuple, tuple] = OrderedDict()

    def _compile(self, args: Sequence[Any]) -> None:
        self.call = None
        for k, w in self.built.weights:
            w.set(weight_array(args[k]))
        with _matmul_precision():
            # the search measures at this call's sizes: what the model was traced for
            self.cg = lm_compile(self.built.graph, typical_dims=self.env.dims)
        stats.plans += 1
        self.weight_keys = [_weight_key(args[k]) for k, _ in self.built.weights]
        self.plan_dims = list(self.cg.executor.dims)
        self.call = prepare(self.cg.executor, self.built.inputs, self.built.scalars,
                            [(k, args[k]) for k, _ in self.built.weights])  # fmt: skip
        ex = self.cg.executor
        self.out_names = [n for n in ex.outputs if n not in ex.updates]  # in-place: no array
        # a written input the plan could not alias (its old value is read after the write):
        # the new value comes back as an array and is copied into the tensor here
        at = {f"_upd_{name}": k for k, name in self.built.inputs}
        self.copy_back = [(n, at[n]) for n in self.out_names if n in at]
        outs = self.built.outputs
        self.plain_out = self.out_names == [o[1] if o[0] == "t" else None for o in outs] and all(
            o[3] is None and o[2] not in _BITS_VIEWED and not o[2].is_complex for o in outs
        )

    def forward(self, *args: Any) -> Any:
        if self.env.eager:
            return self.eager(*args)
        call = self.call
        if call is not None:
            try:
                res = call.run(args, self.env.dims)
            except (ValueError, TypeError, RuntimeError) as e:  # e.g. a size outside a range
                return self._give_up("running a partition failed", e, args)
            if res is None:  # a weight changed: rebuild
                return self._forward_general(args)
            if self.plain_out:  # one dense tensor per output, in torch's layout and order
                return tuple(res) if self.built.tuple_out else res[0]
            named = dict(zip(self.out_names, res, strict=True))
            self._copy_back(named, args)
            got = [self._out(o, named, args) for o in self.built.outputs]
            return tuple(got) if self.built.tuple_out else got[0]
        return self._forward_general(args)

    def _copy_back(self, res: dict[str, Any], args: Sequence[Any]) -> None:
        for name, k in self.copy_back:
            t = args[k]
            t.copy_(_as_torch(res[name], t.dtype).view(t.shape))

    __call__ = forward

    def _forward_general(self, args: Sequence[Any]) -> Any:
        if self.failed:
            return self.eager(*args)
        if self.cg is None or self._weights_changed(args):
            if not self._restore(args):
                try:
                    self._compile(args)
                except Exception as e:  # a plan that cannot be built must not break the model
                    return self._give_up("compiling a partition failed", e, args)
                self._remember()
            if self.call is not None:
                return self.forward(*args)
        inputs = {name: plan_array(args[k]) for k, name in self.built.inputs}
        for k, name in self.built.scalars:
            inputs[name] = np.asarray(float(args[k]), np.float32)
        dims = {n: self.env.dims[n] for n in self.plan_dims}
        try:
            res = self.cg.run(inputs, **dims)
        except (ValueError, TypeError, RuntimeError) as e:  # e.g. a size outside a dim's range
            return self._give_up("running a partition failed", e, args)
        self._copy_back(res, args)
        outs = [self._out(o, res, args) for o in self.built.outputs]
        return tuple(outs) if self.built.tuple_out else outs[0]

    _STATE = ("cg", "call", "weight_keys", "plan_dims", "out_names", "copy_back", "plain_out")

    def _remember(self) -> None:
        self.by_weights[tuple(self.weight_keys)] = tuple(getattr(self, a) for a in self._STATE)
        while len(self.by_weights) > MAX_WEIGHT_SETS:
            self.by_weights.popitem(last=False)

    def _restore(self, args: Sequence[Any]) -> bool:
        """Take up the plan built for these weight tensors (same objects, memory and version)
        when there is one."""
        keys = tuple(_weight_key(args[k]) for k, _ in self.built.weights)
        state = self.by_weights.get(keys)
        if state is None:
            return False
        self.by_weights.move_to_end(keys)
        for a, v in zip(self._STATE, state, strict=True):
            setattr(self, a, v)
        return True

    def _weights_changed(self, args: Sequence[Any]) -> bool:
        return any(_weight_key(args[k]) != key
                   for (k, _), key in zip(self.built.weights, self.weight_keys))  # fmt: skip

    def _give_up(self, what: str, e: Exception, args: Sequence[Any]) -> Any:
        msg = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        warn_once(f"{what}:{msg}", f"luminal: {what} ({msg}); it runs in eager PyTorch")
        self.failed = True
        self.call = None
        stats.failed_plans += 1
        return self.eager(*args)

    def _out(self, o: tuple, res: dict[str, Any], args: Sequence[Any]) -> Any:
        """Output ``o`` from the plan's results ``res`` (torch tensors from the prepared call,
        numpy arrays from the general path)."""
        kind, env = o[0], self.env.dims
        if kind == "t":
            t = _as_torch(res[o[1]], o[2])
            return t if o[3] is None else t.permute(o[3])
        if kind == "s":
            return int(sym.evaluate(o[1], env))
        if kind == "v":
            return o[1]
        size, stride = ([int(sym.evaluate(e, env)) for e in es] for es in o[-2:])
        if kind == "alias":
            return torch.as_strided(args[o[1]], size, stride, int(sym.evaluate(o[2], env)))
        # "strided": torch's layout overlaps or has gaps; scatter into storage of that layout
        n = 1 + sum((a - 1) * b for a, b in zip(size, stride, strict=True)) if all(size) else 0
        flat = torch.empty(n, dtype=o[2])
        where = torch.arange(n).as_strided(size, stride).reshape(-1)
        flat[where] = _as_torch(res[o[1]], o[2]).reshape(-1)
        return flat.as_strided(size, stride)


def _as_torch(x: Any, dtype: torch.dtype) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        return to_torch(x, dtype)
    return complex_of(x, dtype) if dtype.is_complex and not x.is_complex() else x


class _Support(OperatorSupportBase):
    def __init__(self, nodes: set[Node]) -> None:
        self.nodes = nodes

    def is_node_supported(self, submodules: Any, node: Node) -> bool:
        return node in self.nodes


def split(gm: GraphModule, weight_names: set[str], shape_env: Any, env: Env) -> GraphModule:
    """Replace the convertible parts of ``gm`` with LuminalPartitions; warn once per eager op."""
    weight_names = weight_names - {n.name for n in mutated_inputs(gm)}  # read at every call
    trial = build(gm, weight_names, shape_env, tolerant=True, multiples=env.multiples)
    bound = set(env.binders)
    for node, why in trial.failed.items():
        if why in (_DOWNSTREAM, _EAGER_COPY):
            continue
        if _is_error_check(node):
            stats.checks += 1
            continue
        name = _op_name(node.target)
        stats.eager_ops[name] = stats.eager_ops.get(name, 0) + 1
        warn_once(f"op:{name}", f"luminal: {name} is not supported ({why}); that part of the "
                  "graph runs in eager PyTorch")  # fmt: skip
    ok = {
        n
        for n in gm.graph.nodes
        if n.op == "call_function" and n not in trial.failed and _is_tensor_value(n.meta.get("val"))
    }
    if not ok:
        return gm
    # size arithmetic (sym_size of an intermediate, products of sizes) joins the partitions:
    # left outside, it would sit between two luminal nodes and split one plan into several
    ok |= {
        n
        for n in gm.graph.nodes
        if n.op == "call_function" and _is_size(trial.dims, n.meta.get("val"))
    }
    parts = CapabilityBasedPartitioner(gm, _Support(ok), allows_single_node_partition=True)
    fused = parts.fuse_partitions(parts.propose_partitions())
    for node in list(fused.graph.nodes):
        if node.op != "call_module":
            continue
        sub = getattr(fused, node.target)
        if not any(_is_tensor_value(n.meta.get("val")) for n in sub.graph.nodes
                   if n.op == "call_function"):  # fmt: skip
            continue  # size arithmetic only: FX runs it
        phs = [n for n in sub.graph.nodes if n.op == "placeholder"]
        subw = {
            ph.name
            for ph, a in zip(phs, node.args, strict=False)
            if isinstance(a, Node)
            and (a.op == "get_attr" or (a.op == "placeholder" and a.name in weight_names))
        }
        try:
            built = build(sub, subw, shape_env, multiples=env.multiples)
            unbound = set(built.dims.dims) - bound
            if unbound:
                raise Unsupported(f"sizes {sorted(unbound)} are not input sizes")
        except Unsupported as e:
            warn_once(f"part:{e}", f"luminal: {e}; that part of the graph runs in eager PyTorch")
            continue
        if all(o[0] in ("alias", "s", "v") for o in built.outputs) and not \
                (built.updated or built.written_back):  # fmt: skip
            continue  # views of inputs and sizes only: nothing for a plan to compute
        env.require(built.dims.divides, built.dims.nonneg, built.dims.dims)
        stats.partitions += 1
        stats.in_place += len(built.updated)
        stats.partition_sizes.append(sum(n.op == "call_function" for n in sub.graph.nodes))
        setattr(fused, node.target, LuminalPartition(built, env, sub))
    fused.recompile()
    return fused
