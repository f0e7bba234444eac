"""``Module``: a tree of named parameters that binds to a graph when called.

A module holds ``Parameter`` slots (shape, dtype, numpy data) under PyTorch's names, so a
torch ``state_dict()`` loads as is. Nothing graph-specific is stored: calling ``module(x)``
creates each parameter it uses as a named weight of ``x.graph`` (``"layers.0.attn.q_proj.weight"``)
holding the loaded array, or reuses it when that graph already has it, so one module can be
traced into many graphs and twice into the same one.

Parameters not loaded are filled on first use with PyTorch-style default initialization,
seeded by the parameter's name (deterministic, and no memory spent on weights that a
checkpoint will replace).
"""

from __future__ import annotations

import zlib
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from ..graph import dtypes as dt
from ..graph.dtypes import DType
from ..graph.ops import Leaf
from ..tensor import Graph, Tensor

Init = tuple[str, float]  # ("uniform", bound) | ("normal", std) | ("const", value)


def _shape_str(shape: Sequence[int]) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ")"


def _to_numpy(v: Any) -> np.ndarray:
    """numpy arrays as they are; torch tensors (even bf16) without importing torch."""
    if type(v).__module__.startswith("torch"):
        v = v.detach().cpu()
        if str(v.dtype) == "torch.bfloat16":
            return v.float().numpy().astype(dt.bf16.np_type)
        return v.numpy()
    return np.asarray(v)


class Parameter:
    """A weight slot of a module: its full name (set by the owning tree), shape, dtype and
    data (a numpy array once loaded or initialized)."""

    __slots__ = ("name", "shape", "dtype", "init", "_data")

    def __init__(
        self, shape: Sequence[int], dtype: Any = dt.f32, init: Init = ("const", 0.0)
    ) -> None:
        self.shape = tuple(int(s) for s in shape)
        self.dtype: DType = dt.to_dtype(dtype)
        self.init = init
        self.name = ""
        self._data: np.ndarray | None = None

    def __repr__(self) -> str:
        state = "loaded" if self._data is not None else "default init"
        return f"Parameter({self.name!r}, {self.dtype.name}{_shape_str(self.shape)}, {state})"

    @property
    def data(self) -> np.ndarray:
        if self._data is None:
            self._data = self._initial()
        return self._data

    def _initial(self) -> np.ndarray:
        kind, v = self.init
        rng = np.random.default_rng(zlib.crc32(self.name.encode()))
        if kind == "uniform":
            arr = rng.uniform(-v, v, self.shape)
        elif kind == "normal":
            arr = rng.normal(0.0, v, self.shape)
        else:
            arr = np.full(self.shape, v)
        return dt.np_cast(np.asarray(arr, dtype=np.float64), self.dtype)

    def set(self, value: Any) -> None:
        arr = _to_numpy(value)
        if tuple(arr.shape) != self.shape:
            raise ValueError(
                f"parameter {self.name!r}: expected shape {_shape_str(self.shape)}, "
                f"got {_shape_str(arr.shape)}"
            )
        same = arr.dtype == np.dtype(self.dtype.np_type)
        self._data = np.ascontiguousarray(arr if same else dt.np_cast(arr, self.dtype))

    def bind(self, graph: Graph) -> Tensor:
        """This parameter as a named weight of ``graph`` (created on first use), or the
        plain input of its name that ``Module.parameter_inputs`` made for training."""
        node = graph.inputs.get(self.name)
        if node is None:
            return graph.weight(self.name, self.shape, self.dtype, data=self.data)
        if node.op is not Leaf.INPUT or node.shape != self.shape or node.dtype is not self.dtype:
            raise ValueError(
                f"parameter {self.name!r} {self.dtype.name}{_shape_str(self.shape)}: graph "
                f"{graph.name!r} already has a different input of that name: {node}"
            )
        return Tensor(node)


class LoadResult(NamedTuple):
    missing_keys: list[str]
    unexpected_keys: list[str]


class Module:
    """Base class: assign ``Parameter``s and sub-``Module``s as attributes, write
    ``forward``. Names follow the attribute paths, as in PyTorch."""

    training = False

    def __init__(self) -> None:
        object.__setattr__(self, "_params", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_persistent", set())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "_prefix", "")

    # ------------------------------------------------------------------ registration
    def __setattr__(self, name: str, value: Any) -> None:
        if "_modules" not in self.__dict__:
            raise AttributeError(
                f"{type(self).__name__}: call super().__init__() before assigning attributes"
            )
        for d in (self._params, self._buffers, self._modules, self.__dict__):
            d.pop(name, None)
        if isinstance(value, Parameter):
            self._params[name] = value
            value.name = self._prefix + name
        elif isinstance(value, Module):
            self._modules[name] = value
            value._rename(f"{self._prefix}{name}.")
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:  # only called when normal lookup fails
        d = self.__dict__
        for key in ("_params", "_buffers", "_modules"):
            if key in d and name in d[key]:
                return d[key][name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def register_buffer(self, name: str, value: Parameter, persistent: bool = True) -> None:
        """A non-trainable state slot (e.g. BatchNorm's running_mean); in ``state_dict``
        when ``persistent``."""
        self._buffers[name] = value
        value.name = self._prefix + name
        if persistent:
            self._persistent.add(name)

    def add_module(self, name: str, module: Module) -> None:
        setattr(self, name, module)

    def _rename(self, prefix: str) -> None:
        object.__setattr__(self, "_prefix", prefix)
        for k, p in [*self._params.items(), *self._buffers.items()]:
            p.name = prefix + k
        for k, m in self._modules.items():
            m._rename(f"{prefix}{k}.")

    # ------------------------------------------------------------------ traversal
    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        yield prefix, self
        for k, m in self._modules.items():
            yield from m.named_modules(f"{prefix}.{k}" if prefix else k)

    def modules(self) -> Iterator[Module]:
        return (m for _, m in self.named_modules())

    def named_children(self) -> Iterator[tuple[str, Module]]:
        return iter(self._modules.items())

    def children(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def _slots(self, which: str) -> Iterator[tuple[str, Parameter]]:
        seen: set[int] = set()
        for path, m in self.named_modules():
            items = {
                "params": m._params.items(),
                "buffers": m._buffers.items(),
                "state": [
                    *m._params.items(),
                    *((k, b) for k, b in m._buffers.items() if k in m._persistent),
                ],
            }[which]
            for k, p in items:
                if id(p) not in seen:  # a shared parameter is listed once, under its first name
                    seen.add(id(p))
                    yield (f"{path}.{k}" if path else k), p

    def named_parameters(self) -> Iterator[tuple[str, Parameter]]:
        return self._slots("params")

    def parameters(self) -> Iterator[Parameter]:
        return (p for _, p in self.named_parameters())

    def named_buffers(self) -> Iterator[tuple[str, Parameter]]:
        return self._slots("buffers")

    def parameter_inputs(self, graph: Graph) -> dict[str, Tensor]:
        """Every parameter as a plain (non-weight) input of ``graph``, by its name: a graph
        traced after this reads parameters fed at run time (a training step that updates
        them in place) instead of baking them in as weights. Buffers stay weights."""
        out: dict[str, Tensor] = {}
        for p in self.parameters():
            if p.name in graph.inputs:
                raise ValueError(
                    f"parameter_inputs: graph {graph.name!r} already has an input {p.name!r}"
                )
            out[p.name] = graph.input(p.name, p.shape, p.dtype)
        return out

    def num_parameters(self) -> int:
        return sum(int(np.prod(p.shape)) for p in self.parameters())

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, np.ndarray]:
        """Parameters and persistent buffers by PyTorch name (defaults materialized)."""
        return {k: p.data for k, p in self._slots("state")}

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> LoadResult:
        """Load arrays (numpy, or torch tensors) by name, cast to each parameter's dtype.
        Shape mismatches always raise; missing/unexpected keys raise when ``strict``."""
        slots = dict(self._slots("state"))
        missing = [k for k in slots if k not in state_dict]
        unexpected = [k for k in state_dict if k not in slots]
        errors = []
        arrays = {}
        for k, v in state_dict.items():
            if k in slots:
                arr = _to_numpy(v)
                if tuple(arr.shape) != slots[k].shape:
                    errors.append(
                        f"shape mismatch for {k!r}: expected {_shape_str(slots[k].shape)}, "
                        f"got {_shape_str(arr.shape)}"
                    )
                arrays[k] = arr
        if strict and missing:
            errors.append(f"missing keys: {missing}")
        if strict and unexpected:
            errors.append(f"unexpected keys: {unexpected}")
        if errors:
            raise ValueError(f"load_state_dict into {type(self).__name__}: " + "; ".join(errors))
        for k, arr in arrays.items():
            slots[k].set(arr)
        return LoadResult(missing, unexpected)

    def to(self, dtype: Any) -> Module:
        """Change every floating-point parameter and buffer to ``dtype`` (data cast)."""
        d = dt.to_dtype(dtype)
        for _, p in [*self._slots("params"), *self._slots("buffers")]:
            if p.dtype.is_float and p.dtype is not d:
                data = p._data
                p.dtype = d
                if data is not None:
                    p._data = dt.np_cast(data, d)
        return self

    def eval(self) -> Module:
        return self.train(False)

    def train(self, mode: bool = True) -> Module:
        for m in self.modules():
            object.__setattr__(m, "training", mode)
        return self

    # ------------------------------------------------------------------ calling
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} does not define forward()")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        lines = [f"({k}): " + repr(m).replace("\n", "\n  ") for k, m in self._modules.items()]
        head = f"{type(self).__name__}({self.extra_repr()}"
        return head + ")" if not lines else head + "\n  " + "\n  ".join(lines) + "\n)"


class _Container(Module):
    """Indexing, length and iteration over the child modules, in insertion order."""

    def __getitem__(self, i: int) -> Module:
        return list(self._modules.values())[i]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())


class Sequential(_Container):
    def __init__(self, *mods: Module | Mapping[str, Module]) -> None:
        super().__init__()
        if len(mods) == 1 and isinstance(mods[0], Mapping):
            for k, m in mods[0].items():
                setattr(self, k, m)
        else:
            for i, mod in enumerate(mods):
                setattr(self, str(i), mod)

    def forward(self, x: Any) -> Any:
        for m in self._modules.values():
            x = m(x)
        return x


class ModuleList(_Container):
    def __init__(self, mods: Iterable[Module] = ()) -> None:
        super().__init__()
        self.extend(mods)

    def append(self, m: Module) -> ModuleList:
        setattr(self, str(len(self._modules)), m)
        return self

    def extend(self, mods: Iterable[Module]) -> ModuleList:
        for m in mods:
            self.append(m)
        return self
