"""The lazy ``Tensor`` and the front-end ``Graph``.

A Tensor is a node of a graph read through a view. Movement methods (permute, reshape,
slicing, expand, pad, ...) only change the view; arithmetic adds primitive nodes. Nothing runs
until ``Graph.run`` (the reference interpreter) or a compiled plan executes the graph.
High-level ops (softmax, matmul, conv, attention, ...) live in ``luminal.functional`` and are
compositions of the 15 primitives; the PyTorch-named methods below delegate to them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Union

import numpy as np

from .graph import dtypes as dt
from .graph import interp
from .graph import symbolic as sym
from .graph.dtypes import DType
from .graph.graph import Graph as _CoreGraph
from .graph.graph import Node
from .graph.ops import Leaf, Op
from .graph.symbolic import sint
from .graph.view import View

Scalar = int | float | bool
TensorLike = Union["Tensor", int, float, bool]


def _shape_str(shape: Sequence[sint]) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ")"


class Graph(_CoreGraph):
    """A graph under construction. ``input``/``weight`` make tensors; ``output`` names results;
    ``run`` executes with the reference interpreter."""

    def input(self, name: str, shape: Sequence[sint], dtype: Any = dt.f32) -> Tensor:
        node = self.add_input(name, _check_shape(shape, f"input {name!r}"), dtype)
        return Tensor(node)

    def weight(self, name: str, shape: Sequence[sint] | None = None, dtype: Any = None,
               data: Any = None) -> Tensor:  # fmt: skip
        """A named parameter. Give ``data`` (shape and dtype taken from it) or set it later
        with ``Tensor.set``."""
        if data is not None:
            arr = np.asarray(data)
            shape = arr.shape if shape is None else shape
            dtype = dt.to_dtype(arr.dtype) if dtype is None else dtype
        if shape is None:
            raise ValueError(f"weight {name!r}: give a shape or data")
        node = self.add_input(
            name, _check_shape(shape, f"weight {name!r}"), dtype or dt.f32, weight=True
        )
        t = Tensor(node)
        if data is not None:
            t.set(data)
        return t

    def constant(self, value: Scalar | sym.Expr, dtype: Any = dt.f32) -> Tensor:
        return Tensor(self.add_constant(value, dtype))

    def tensor(self, data: Any, dtype: Any = None, name: str | None = None) -> Tensor:
        """A constant array baked into the graph as an unnamed weight."""
        arr = np.asarray(data)
        d = dt.to_dtype(
            dtype if dtype is not None else arr.dtype if arr.dtype != np.float64 else dt.f32
        )
        name = name or f"_const{len(self.weights)}"
        return self.weight(name, arr.shape, d, data=dt.np_cast(arr, d))

    def output(self, name: str, t: Tensor, updates: str | None = None) -> Tensor:
        """Declare ``t`` an output. ``updates="cache"``: ``t`` is the new value of input
        ``cache`` (a SCATTER into it), updated in place by compiled plans: the caller's
        array is written and returned under ``name``."""
        if not isinstance(t, Tensor):
            raise TypeError(f"output {name!r}: expected a Tensor, got {type(t).__name__}")
        self.add_output(name, t.edge, updates)
        return t

    # creation ops named as in PyTorch: g.arange(n) is luminal.functional.arange(g, n)
    def arange(self, start: Any, end: Any = None, step: Any = 1, *, dtype: Any = None) -> Tensor:
        return F.arange(self, start, end, step, dtype=dtype)

    def zeros(self, *size: Any, dtype: Any = None) -> Tensor:
        return F.zeros(self, *size, dtype=dtype)

    def ones(self, *size: Any, dtype: Any = None) -> Tensor:
        return F.ones(self, *size, dtype=dtype)

    def full(self, size: Sequence[sint], fill_value: Any, *, dtype: Any = None) -> Tensor:
        return F.full(self, size, fill_value, dtype=dtype)

    def eye(self, n: sint, m: sint | None = None, *, dtype: Any = None) -> Tensor:
        return F.eye(self, n, m, dtype=dtype)

    def linspace(self, start: float, end: float, steps: int, *, dtype: Any = None) -> Tensor:
        return F.linspace(self, start, end, steps, dtype=dtype)

    def run(self, inputs: Mapping[str, Any] | None = None, **dims: int) -> dict[str, np.ndarray]:
        """Execute with the reference interpreter; dims not given are read off input shapes."""
        return interp.run(self, inputs, dims)


def _check_shape(shape: Sequence[sint], what: str) -> tuple[sint, ...]:
    if isinstance(shape, (int, sym.Expr)):
        shape = (shape,)
    out = tuple(shape)
    for s in out:
        if not isinstance(s, (int, sym.Expr)) or isinstance(s, bool):
            raise TypeError(f"{what}: shape entries must be ints or dims, got {s!r}")
        if isinstance(s, int) and s < 0:
            raise ValueError(f"{what}: negative size in shape {_shape_str(out)}")
    return out


class _Functional:
    """``luminal.functional``, as Tensor's methods reach it: the package registers itself when
    it is imported (``register_functional``), so this module, which it builds on, does not
    import it back."""

    module: Any = None

    def __getattr__(self, name: str) -> Any:
        if _Functional.module is None:
            raise RuntimeError("luminal.functional is not imported (import luminal first)")
        return getattr(_Functional.module, name)


F: Any = _Functional()


def register_functional(module: Any) -> None:
    """Called by ``luminal.functional`` on import: Tensor's methods delegate to it."""
    _Functional.module = module


def _delegate(name: str) -> Any:
    """A method that calls ``luminal.functional.<name>(self, ...)``."""

    def method(self: Tensor, *args: Any, **kwargs: Any) -> Any:
        return getattr(F, name)(self, *args, **kwargs)

    method.__name__ = method.__qualname__ = name
    return method


class Tensor:
    """A lazy tensor: ``node`` read through ``layout`` (a ``View``: index expressions, no copy).
    ``view(*shape)`` is PyTorch's method (a reshape); the View object is ``layout``."""

    __slots__ = ("node", "layout")
    __array_priority__ = 1000  # make numpy defer to our reflected operators

    def __init__(self, node: Node, layout: View | None = None) -> None:
        self.node = node
        self.layout = layout if layout is not None else View.contiguous(node.shape)

    # ------------------------------------------------------------------ basics
    @property
    def graph(self) -> Graph:
        return self.node.graph  # type: ignore[return-value]

    @property
    def edge(self) -> tuple[Node, View]:
        """How an op reads this tensor: its node and layout."""
        return (self.node, self.layout)

    @property
    def shape(self) -> tuple[sint, ...]:
        return self.layout.shape

    @property
    def dtype(self) -> DType:
        return self.node.dtype

    @property
    def ndim(self) -> int:
        return len(self.layout.shape)

    def dim(self) -> int:
        return self.ndim

    def size(self, d: int | None = None) -> Any:
        return self.shape if d is None else self.shape[self._axis(d)]

    def numel(self) -> sint:
        return self.layout.numel()

    def __len__(self) -> int:
        if not self.shape or not isinstance(self.shape[0], int):
            raise TypeError("len() of a 0-d tensor or a symbolic dim; use .shape[0]")
        return self.shape[0]

    def __repr__(self) -> str:
        n = self.node
        return f"Tensor({self.dtype.name}{_shape_str(self.shape)}, %{n.id} {n.op.name})"

    def __bool__(self) -> bool:
        raise TypeError("a lazy luminal Tensor has no truth value; run the graph to inspect values")

    def set(self, data: Any) -> Tensor:
        """Attach data to a weight; checked against the weight's shape and dtype."""
        n = self.node
        if n.op is not Leaf.INPUT or not n.arg[1]:
            raise ValueError(f"set(): {self} is not a weight (make it with Graph.weight)")
        arr = np.asarray(data)
        name = n.arg[0]
        if len(arr.shape) != len(n.shape) or any(
            isinstance(s, int) and s != a for s, a in zip(n.shape, arr.shape)
        ):
            raise ValueError(
                f"weight {name!r}: expected shape {_shape_str(n.shape)}, got {arr.shape}"
            )
        if arr.dtype != np.dtype(n.dtype.np_type):
            raise TypeError(f"weight {name!r}: expected dtype {n.dtype.name}, got {arr.dtype}")
        self.graph.weights[name] = arr
        return self

    def _axis(self, d: int, ndim: int | None = None) -> int:
        n = self.ndim if ndim is None else ndim
        if not isinstance(d, int) or isinstance(d, bool):
            raise TypeError(f"dim must be an int, got {d!r}")
        if not -max(n, 1) <= d < max(n, 1):
            raise IndexError(
                f"dim {d} out of range for a tensor of shape {_shape_str(self.shape)} (rank {n})"
            )
        return d % max(n, 1)

    # ------------------------------------------------------------------ primitives
    def _op(self, op: Op, *others: Tensor, arg: Any = None) -> Tensor:
        node = self.graph.add_op(op, [self.edge] + [o.edge for o in others], arg)
        return Tensor(node)

    def _const(self, value: Scalar | sym.Expr, dtype: DType | None = None) -> Tensor:
        return Tensor(self.graph.add_constant(value, dtype or self.dtype))

    def _lift(self, x: TensorLike) -> Tensor:
        """Python scalars become constants of a dtype PyTorch would pick."""
        if isinstance(x, Tensor):
            if x.graph is not self.graph:
                raise ValueError(
                    f"tensors from different graphs: {self.graph.name!r} and {x.graph.name!r}"
                )
            return x
        if isinstance(x, sym.Expr):
            return self._const(x, self.dtype if self.dtype is not dt.bool_ else dt.i32)
        if isinstance(x, bool):
            return self._const(x, self.dtype)
        if isinstance(x, float) and not self.dtype.is_float:
            return self._const(x, dt.f32)
        if isinstance(x, (int, float, np.number)):
            return self._const(x, self.dtype if self.dtype is not dt.bool_ else dt.i64)
        raise TypeError(f"cannot combine a Tensor with {type(x).__name__}")

    def exp2(self) -> Tensor:
        return self._floating()._op(Op.EXP2)

    def log2(self) -> Tensor:
        return self._floating()._op(Op.LOG2)

    def sin(self) -> Tensor:
        return self._floating()._op(Op.SIN)

    def sqrt(self) -> Tensor:
        return self._floating()._op(Op.SQRT)

    def reciprocal(self) -> Tensor:
        return self._floating()._op(Op.RECIP)

    def cast(self, dtype: Any) -> Tensor:
        d = dt.to_dtype(dtype)
        return self if d is self.dtype else self._op(Op.CAST, arg=d)

    def to(self, dtype: Any) -> Tensor:
        return self.cast(dtype)

    def float(self) -> Tensor:
        """As f32, like ``torch.Tensor.float()``: f16, bf16 and f64 are converted too."""
        return self if self.dtype is dt.f32 else self.cast(dt.f32)

    def _floating(self) -> Tensor:
        """Itself when of a float type (any width), else as f32: what float-only ops read."""
        return self if self.dtype.is_float else self.cast(dt.f32)

    def _reduce(self, op: Op, dims: int | Sequence[int] | None, keepdim: bool) -> Tensor:
        axes = range(self.ndim) if dims is None else [dims] if isinstance(dims, int) else dims
        ax = sorted({self._axis(a) for a in axes}, reverse=True)
        out = self
        for a in ax:
            out = out._op(op, arg=a)
        if keepdim:
            for a in sorted(ax):
                out = out.unsqueeze(a)
        return out

    def sum_reduce(self, dims: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
        return self._reduce(Op.SUM_REDUCE, dims, keepdim)

    def max_reduce(self, dims: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
        return self._reduce(Op.MAX_REDUCE, dims, keepdim)

    # ------------------------------------------------------------------ broadcasting binary ops
    def _broadcast_pair(self, other: TensorLike, op_name: str) -> tuple[Tensor, Tensor]:
        b = self._lift(other)
        a = self
        d = dt.promote(a.dtype, b.dtype)
        a, b = a.cast(d), b.cast(d)
        shape = broadcast_shapes(a.shape, b.shape, op_name)
        return a.expand(shape), b.expand(shape)

    def _binary(self, op: Op, other: TensorLike, name: str) -> Tensor:
        a, b = self._broadcast_pair(other, name)
        return a._op(op, b)

    def add(self, other: TensorLike) -> Tensor:
        return self._binary(Op.ADD, other, "add")

    def mul(self, other: TensorLike) -> Tensor:
        return self._binary(Op.MUL, other, "mul")

    def fmod(self, other: TensorLike) -> Tensor:
        return self._binary(Op.MOD, other, "fmod")

    def lt(self, other: TensorLike) -> Tensor:
        return self._binary(Op.LESS_THAN, other, "lt")

    # ------------------------------------------------------------------ views (no copies)
    def _with_view(self, v: View) -> Tensor:
        return Tensor(self.node, v)

    def permute(self, *order: Any) -> Tensor:
        dims = tuple(order[0]) if len(order) == 1 and isinstance(order[0], (list, tuple)) else order
        if len(dims) != self.ndim:
            raise ValueError(f"permute: {len(dims)} dims given for a tensor of rank {self.ndim}")
        axes = [self._axis(d) for d in dims]
        if sorted(axes) != list(range(self.ndim)):
            raise ValueError(f"permute: {tuple(dims)} is not a permutation of {self.ndim} dims")
        return self._with_view(self.layout.permute(axes))

    def expand(self, *shape: Any) -> Tensor:
        """Broadcast to ``shape`` (PyTorch rules: new leading dims, size-1 dims grow, -1 keeps)."""
        shp = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (list, tuple)) else shape
        if len(shp) < self.ndim:
            raise ValueError(
                f"expand: target {_shape_str(shp)} has fewer dims than {_shape_str(self.shape)}"
            )
        t = self
        for _ in range(len(shp) - self.ndim):
            t = t.unsqueeze(0)
        full = tuple(s if (isinstance(n, int) and n == -1) else n for s, n in zip(t.shape, shp))
        for s, n in zip(t.shape, full):
            if s is not n and s != n and s != 1:
                raise ValueError(
                    f"expand: cannot broadcast {_shape_str(self.shape)} to {_shape_str(full)}"
                )
        return t if full == t.shape else t._with_view(t.layout.expand(full))

    def unsqueeze(self, d: int) -> Tensor:
        return self._with_view(self.layout.unsqueeze(self._axis(d, self.ndim + 1)))

    def squeeze(self, d: int | Sequence[int] | None = None) -> Tensor:
        if d is None:
            axes = [k for k, s in enumerate(self.shape) if s == 1]
        else:
            axes = [self._axis(a) for a in ([d] if isinstance(d, int) else d)]
            axes = [a for a in axes if self.shape[a] == 1]
        return self.reshape([s for k, s in enumerate(self.shape) if k not in axes])

    def reshape(self, *shape: Any) -> Tensor:
        shp = (
            list(shape[0])
            if len(shape) == 1 and isinstance(shape[0], (list, tuple))
            else list(shape)
        )
        numel = self.numel()
        if sum(1 for s in shp if isinstance(s, int) and s == -1) > 1:
            raise ValueError(f"reshape: only one dim can be -1, got {_shape_str(shp)}")
        if any(isinstance(s, int) and s == -1 for s in shp):
            rest: sint = 1
            for s in shp:
                if not (isinstance(s, int) and s == -1):
                    rest = sym.mul(rest, s)
            q = sym.floordiv(numel, rest) if rest != 0 else 0
            shp = [q if (isinstance(s, int) and s == -1) else s for s in shp]
        new = _check_shape(shp, "reshape")
        n2: sint = 1
        for s in new:
            n2 = sym.mul(n2, s)
        if sym.add(n2, sym.mul(numel, -1)) != 0:
            raise ValueError(
                f"reshape: cannot view {_shape_str(self.shape)} ({numel} elements) "
                f"as {_shape_str(new)}"
            )
        if new == self.shape:
            return self
        return self._with_view(self.layout.reshape(new))

    def view(self, *shape: Any) -> Tensor:
        """PyTorch's ``view``: ``reshape`` (with one ``-1``). Every luminal reshape is a view,
        so there is no non-contiguous case to refuse; ``view(dtype)`` (bit reinterpretation)
        is not supported."""
        if len(shape) == 1 and isinstance(shape[0], (DType, np.dtype, type)):
            raise TypeError("view(dtype) reinterprets bits, which luminal does not support; "
                            "use .to(dtype) for a value cast")  # fmt: skip
        return self.reshape(*shape)

    def view_as(self, other: Tensor) -> Tensor:
        return self.reshape(other.shape)

    def slice(self, d: int, start: sint, length: sint, step: int = 1) -> Tensor:
        """Raw slice: ``length`` elements from ``start`` with ``step`` (no bounds clamping)."""
        return self._with_view(self.layout.slice(self._axis(d), start, length, step))

    def pad_dim(self, d: int, before: sint, after: sint) -> Tensor:
        """Zero-pad one dim (sizes >= 0)."""
        return self._with_view(self.layout.pad(self._axis(d), before, after))

    def contiguous(self) -> Tensor:
        return self

    # ------------------------------------------------------------------ run helpers
    def numpy_eval(self, inputs: Mapping[str, Any] | None = None, **dims: int) -> np.ndarray:
        """Evaluate this tensor alone with the reference interpreter (handy in notebooks)."""
        g = self.graph
        name = f"_eval{self.node.id}"
        if name not in g.outputs:
            g.output(name, self)
        return interp.run(g, inputs, dims, outputs=[name])[name]

    # ================================================================== PyTorch-named API
    # Operators and methods named as in PyTorch; each delegates to ``luminal.functional``
    # (the docs live there). Conversions (.int(), .bool(), ...) are attached after the class.
    __hash__ = object.__hash__  # identity, as torch.Tensor: __eq__ below builds a tensor

    def __add__(self, o: TensorLike) -> Tensor:
        return F.add(self, o)

    def __radd__(self, o: TensorLike) -> Tensor:
        return F.add(o, self)

    def __sub__(self, o: TensorLike) -> Tensor:
        return F.sub(self, o)

    def __rsub__(self, o: TensorLike) -> Tensor:
        return F.sub(o, self)

    def __mul__(self, o: TensorLike) -> Tensor:
        return F.mul(self, o)

    def __rmul__(self, o: TensorLike) -> Tensor:
        return F.mul(o, self)

    def __truediv__(self, o: TensorLike) -> Tensor:
        return F.div(self, o)

    def __rtruediv__(self, o: TensorLike) -> Tensor:
        return F.div(o, self)

    def __floordiv__(self, o: TensorLike) -> Tensor:
        return F.floor_divide(self, o)

    def __rfloordiv__(self, o: TensorLike) -> Tensor:
        return F.floor_divide(o, self)

    def __mod__(self, o: TensorLike) -> Tensor:
        return F.remainder(self, o)

    def __rmod__(self, o: TensorLike) -> Tensor:
        return F.remainder(o, self)

    def __pow__(self, o: TensorLike) -> Tensor:
        return F.pow(self, o)

    def __rpow__(self, o: TensorLike) -> Tensor:
        return F.pow(o, self)

    def __neg__(self) -> Tensor:
        return F.neg(self)

    def __pos__(self) -> Tensor:
        return self

    def __abs__(self) -> Tensor:
        return F.abs(self)

    def __invert__(self) -> Tensor:
        return F.bitwise_not(self)

    def __and__(self, o: TensorLike) -> Tensor:
        return F.bitwise_and(self, o)

    def __rand__(self, o: TensorLike) -> Tensor:
        return F.bitwise_and(o, self)

    def __or__(self, o: TensorLike) -> Tensor:
        return F.bitwise_or(self, o)

    def __ror__(self, o: TensorLike) -> Tensor:
        return F.bitwise_or(o, self)

    def __xor__(self, o: TensorLike) -> Tensor:
        return F.bitwise_xor(self, o)

    def __rxor__(self, o: TensorLike) -> Tensor:
        return F.bitwise_xor(o, self)

    def __lt__(self, o: TensorLike) -> Tensor:
        return F.lt(self, o)

    def __le__(self, o: TensorLike) -> Tensor:
        return F.le(self, o)

    def __gt__(self, o: TensorLike) -> Tensor:
        return F.gt(self, o)

    def __ge__(self, o: TensorLike) -> Tensor:
        return F.ge(self, o)

    def __eq__(self, o: object) -> Tensor:  # type: ignore[override]
        return F.eq(self, o)

    def __ne__(self, o: object) -> Tensor:  # type: ignore[override]
        return F.ne(self, o)

    def __getitem__(self, key: Any) -> Tensor:
        return F.getitem(self, key)

    def __iter__(self) -> Any:
        return iter(F.unbind(self, 0))  # len() raises for symbolic dims: no endless loop

    def __matmul__(self, o: Tensor) -> Tensor:
        return F.matmul(self, o)

    def __rmatmul__(self, o: Tensor) -> Tensor:
        return F.matmul(o, self)

    @property
    def T(self) -> Tensor:  # noqa: N802 - PyTorch's name
        return self.permute(list(range(self.ndim))[::-1])

    @property
    def mT(self) -> Tensor:  # noqa: N802 - PyTorch's name
        return F.transpose(self, -2, -1)

    def where(self, condition: Tensor, other: TensorLike) -> Tensor:
        return F.where(condition, self, other)

    def type_as(self, other: Tensor) -> Tensor:
        return self.cast(other.dtype)

    # same-name delegations: x.f(*args) is F.f(x, *args)
    abs = _delegate("abs")
    absolute = _delegate("absolute")
    neg = _delegate("neg")
    negative = _delegate("negative")
    sign = _delegate("sign")
    sgn = _delegate("sgn")
    sub = _delegate("sub")
    subtract = _delegate("subtract")
    multiply = _delegate("multiply")
    div = _delegate("div")
    divide = _delegate("divide")
    true_divide = _delegate("true_divide")
    floor_divide = _delegate("floor_divide")
    remainder = _delegate("remainder")
    pow = _delegate("pow")
    square = _delegate("square")
    lerp = _delegate("lerp")
    maximum = _delegate("maximum")
    minimum = _delegate("minimum")
    clamp = _delegate("clamp")
    clip = _delegate("clip")
    clamp_min = _delegate("clamp_min")
    clamp_max = _delegate("clamp_max")
    exp = _delegate("exp")
    expm1 = _delegate("expm1")
    log = _delegate("log")
    log10 = _delegate("log10")
    log1p = _delegate("log1p")
    rsqrt = _delegate("rsqrt")
    cos = _delegate("cos")
    tan = _delegate("tan")
    tanh = _delegate("tanh")
    sinh = _delegate("sinh")
    cosh = _delegate("cosh")
    sigmoid = _delegate("sigmoid")
    relu = _delegate("relu")
    erf = _delegate("erf")
    erfc = _delegate("erfc")
    trunc = _delegate("trunc")
    fix = _delegate("fix")
    floor = _delegate("floor")
    ceil = _delegate("ceil")
    round = _delegate("round")
    frac = _delegate("frac")
    isnan = _delegate("isnan")
    isinf = _delegate("isinf")
    isfinite = _delegate("isfinite")
    isposinf = _delegate("isposinf")
    isneginf = _delegate("isneginf")
    nan_to_num = _delegate("nan_to_num")
    logical_and = _delegate("logical_and")
    logical_or = _delegate("logical_or")
    logical_not = _delegate("logical_not")
    logical_xor = _delegate("logical_xor")
    bitwise_and = _delegate("bitwise_and")
    bitwise_or = _delegate("bitwise_or")
    bitwise_xor = _delegate("bitwise_xor")
    bitwise_not = _delegate("bitwise_not")
    eq = _delegate("eq")
    ne = _delegate("ne")
    le = _delegate("le")
    gt = _delegate("gt")
    ge = _delegate("ge")
    less = _delegate("less")
    greater = _delegate("greater")
    less_equal = _delegate("less_equal")
    greater_equal = _delegate("greater_equal")
    not_equal = _delegate("not_equal")
    masked_fill = _delegate("masked_fill")
    sum = _delegate("sum")
    mean = _delegate("mean")
    prod = _delegate("prod")
    var = _delegate("var")
    std = _delegate("std")
    max = _delegate("max")
    min = _delegate("min")
    amax = _delegate("amax")
    amin = _delegate("amin")
    argmax = _delegate("argmax")
    argmin = _delegate("argmin")
    any = _delegate("any")
    all = _delegate("all")
    cumsum = _delegate("cumsum")
    cumprod = _delegate("cumprod")
    norm = _delegate("norm")
    count_nonzero = _delegate("count_nonzero")
    logsumexp = _delegate("logsumexp")
    softmax = _delegate("softmax")
    log_softmax = _delegate("log_softmax")
    flatten = _delegate("flatten")
    unflatten = _delegate("unflatten")
    transpose = _delegate("transpose")
    swapaxes = _delegate("swapaxes")
    swapdims = _delegate("swapdims")
    t = _delegate("t")
    movedim = _delegate("movedim")
    moveaxis = _delegate("moveaxis")
    expand_as = _delegate("expand_as")
    broadcast_to = _delegate("broadcast_to")
    split = _delegate("split")
    chunk = _delegate("chunk")
    unbind = _delegate("unbind")
    repeat = _delegate("repeat")
    tile = _delegate("tile")
    repeat_interleave = _delegate("repeat_interleave")
    flip = _delegate("flip")
    roll = _delegate("roll")
    narrow = _delegate("narrow")
    select = _delegate("select")
    tril = _delegate("tril")
    triu = _delegate("triu")
    diagonal = _delegate("diagonal")
    diag = _delegate("diag")
    gather = _delegate("gather")
    take = _delegate("take")
    take_along_dim = _delegate("take_along_dim")
    index_select = _delegate("index_select")
    scatter = _delegate("scatter")
    scatter_add = _delegate("scatter_add")
    index_add = _delegate("index_add")
    index_put = _delegate("index_put")
    matmul = _delegate("matmul")
    mm = _delegate("mm")
    bmm = _delegate("bmm")
    mv = _delegate("mv")
    dot = _delegate("dot")
    outer = _delegate("outer")


def broadcast_shapes(
    a: Sequence[sint], b: Sequence[sint], op_name: str = "broadcast"
) -> tuple[sint, ...]:
    n = max(len(a), len(b))
    pa = (1,) * (n - len(a)) + tuple(a)
    pb = (1,) * (n - len(b)) + tuple(b)
    out: list[sint] = []
    for x, y in zip(pa, pb):
        if x is y or x == y:
            out.append(x)
        elif x == 1:
            out.append(y)
        elif y == 1:
            out.append(x)
        else:
            raise ValueError(
                f"{op_name}: shapes {_shape_str(a)} and {_shape_str(b)} cannot broadcast"
            )
    return tuple(out)


# Conversions named as in PyTorch; attached here since ``int``/``bool``/... as class attributes
# would shadow the builtins in the class body's annotations.
for _name, _dtype in (("int", dt.i32), ("long", dt.i64), ("half", dt.f16), ("double", dt.f64),
                      ("bool", dt.bool_), ("bfloat16", dt.bf16), ("short", dt.i32), ("byte", dt.u8),
                      ("char", dt.i8)):  # fmt: skip
    setattr(Tensor, _name, lambda self, _d=_dtype: self.cast(_d))
