"""Training through plans: ``grad`` on tensors, and ``TrainStep``, one compiled plan per step.

A step's graph holds the forward pass, its gradient (``luminal.compiler.autograd``) and the
optimizer's update (``luminal.optim``). Parameters and optimizer state are plain inputs that
the plan updates in place (``Graph.output(..., updates=...)``), so the model's own parameter
arrays are the plan's state: nothing is copied between steps, and the module can be saved
(``save_weights``) or traced for inference at any time.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import numpy as np

from .compile import CompiledGraph
from .compiler import autograd
from .graph import dtypes as dt
from .graph.ops import Op
from .graph.symbolic import sint
from .graph.view import View, idx_vars
from .nn.module import Module
from .optim import Optimizer
from .tensor import Graph, Tensor


def grad(loss: Tensor, wrt: Sequence[Tensor]) -> list[Tensor]:
    """d loss / d t for each t of ``wrt`` (inputs, weights or intermediate results of the
    loss's graph), as tensors of the same graph; zeros where the loss does not depend on t."""
    if not isinstance(loss, Tensor):
        raise TypeError(f"grad: loss must be a Tensor, got {type(loss).__name__}")
    if loss.ndim != 0:
        raise ValueError(f"grad: loss must be a scalar, got shape {tuple(loss.shape)}")
    nodes = []
    for t in wrt:
        if not isinstance(t, Tensor):
            raise TypeError(f"grad: wrt entries must be Tensors, got {type(t).__name__}")
        if t.graph is not loss.graph:
            raise ValueError("grad: a wrt tensor belongs to another graph than the loss")
        if t.layout != View.contiguous(t.node.shape):
            raise ValueError(
                f"grad: {t} is a view of another tensor; differentiate w.r.t. the tensor "
                "itself (a view's gradient is that tensor's gradient read through the view)"
            )
        if not t.dtype.is_float:
            raise TypeError(f"grad: {t} is {t.dtype.name}; only float tensors have gradients")
        nodes.append(t.node)
    out = []
    for t, e in zip(wrt, autograd.gradients(loss.graph, loss.edge, nodes)):
        out.append(Tensor(*e) if e is not None else t.graph.zeros(*t.shape, dtype=t.dtype))
    return out


def cross_entropy(logits: Tensor, target: Tensor) -> Tensor:
    """Mean negative log-likelihood of integer ``target`` (N,) under ``logits`` (N, C)."""
    if logits.ndim != 2 or target.ndim != 1:
        raise ValueError(
            f"cross_entropy: logits must be (N, C) and target (N,), got {tuple(logits.shape)} "
            f"and {tuple(target.shape)}"
        )
    if target.dtype.is_float:
        raise TypeError(f"cross_entropy: target must hold class indices, got {target.dtype.name}")
    n, c = logits.shape
    shape = (n, c)
    cls = Tensor(logits.graph.add_op(Op.IOTA, [], arg=idx_vars(shape)[1], shape=shape,
                                     dtype=target.dtype))  # fmt: skip
    hot = target.unsqueeze(1).expand(shape).eq(cls).to(logits.dtype)
    return -(logits.log_softmax(-1) * hot).sum() / n


def _scatter_whole(t: Tensor, dest: Tensor) -> Tensor:
    """``t`` written over all of ``dest`` (a SCATTER of every row): the form an in-place
    output takes."""
    rows = dest.shape[0]
    idx = Tensor(dest.graph.add_op(Op.IOTA, [], arg=idx_vars((rows,))[0], shape=(rows,),
                                   dtype=dt.i32))  # fmt: skip
    return Tensor(dest.graph.add_op(Op.SCATTER, [dest.edge, idx.edge, t.cast(dest.dtype).edge]))


class TrainStep:
    """One optimizer step of ``model`` on ``loss_fn(model, **batch)`` as a compiled plan.

    ``inputs`` declares the batch: name -> (shape, dtype). Calling the step with the batch's
    arrays runs forward + backward + update and returns the loss (before the update); the
    model's parameters and the optimizer state change in place. ``compile=False`` runs the
    same graph on the reference interpreter."""

    def __init__(
        self,
        model: Module,
        loss_fn: Callable[..., Tensor],
        optimizer: Optimizer,
        inputs: Mapping[str, tuple[Sequence[sint], Any]],
        *,
        compile: bool = True,  # noqa: A002
        backend: str = "cpu",
        search: bool = True,
    ) -> None:
        self.model, self.optimizer = model, optimizer
        self.step_count = 0
        g = Graph("train_step")
        params = model.parameter_inputs(g)
        batch = {k: g.input(k, shape, dtype) for k, (shape, dtype) in inputs.items()}
        loss = loss_fn(model, **batch)
        if not isinstance(loss, Tensor) or loss.ndim != 0:
            raise ValueError("TrainStep: loss_fn must return a scalar Tensor")
        scalars = {k: g.input(f"opt.{k}", (), dt.f32) for k in optimizer.scalars(1)}
        grads = grad(loss, list(params.values()))
        self._state: dict[str, np.ndarray] = {}
        self._copy_back: dict[str, str] = {}  # output -> input, for 0-d tensors (no SCATTER)
        for (name, pt), gp in zip(params.items(), grads):
            state = {}
            for s in optimizer.state_names():
                key = f"{name}.{s}"
                state[s] = g.input(key, pt.shape, pt.dtype)
                shape = cast(tuple[int, ...], pt.shape)  # parameters have static shapes
                self._state[key] = np.zeros(shape, dtype=np.dtype(pt.dtype.np_type))
            new_p, new_state = optimizer.update(pt, gp, state, scalars)
            self._write(g, name, new_p, pt)
            for s, t in new_state.items():
                self._write(g, f"{name}.{s}", t, state[s])
        g.output("loss", loss)
        self.graph = g
        self.params = {p.name: p for p in model.parameters()}
        for p in self.params.values():
            # the plan writes these arrays: own them (a loaded array may be mapped from a
            # file or shared with a torch tensor)
            p.set(np.array(p.data))
        self.compiled: CompiledGraph | None = None
        if compile:
            from .compile import compile as lm_compile

            self.compiled = lm_compile(g, backend=backend, search=search)

    def _write(self, g: Graph, name: str, new: Tensor, old: Tensor) -> None:
        out = f"{name}:new"
        if old.ndim == 0:
            g.output(out, new.cast(old.dtype))
            self._copy_back[out] = name
        else:
            g.output(out, _scatter_whole(new, old), updates=name)

    def _arrays(self) -> dict[str, np.ndarray]:
        return {**{k: p.data for k, p in self.params.items()}, **self._state}

    def __call__(self, lr: float | None = None, **batch: Any) -> float:
        self.step_count += 1
        scal = self.optimizer.scalars(self.step_count, lr)
        state = self._arrays()
        feed = {**state, **batch, **{f"opt.{k}": np.float32(v) for k, v in scal.items()}}
        feed = {k: np.asarray(v) for k, v in feed.items()}
        out = self.compiled.run(feed) if self.compiled is not None else self.graph.run(feed)
        for name, target in self.graph.state.items():
            if out[name] is not state[target]:
                np.copyto(state[target], out[name])
        for name, target in self._copy_back.items():
            np.copyto(state[target], out[name])
        return float(out["loss"])


def save_weights(model: Module, path: str | os.PathLike[str]) -> None:
    """The model's parameters and persistent buffers as a safetensors file (PyTorch names)."""
    from .loaders.safetensors import save_safetensors

    save_safetensors(path, {k: np.ascontiguousarray(v) for k, v in model.state_dict().items()})


def load_weights(model: Module, path: str | os.PathLike[str]) -> None:
    """Load a safetensors file written by ``save_weights`` (or PyTorch) into ``model``."""
    from .loaders.safetensors import load_safetensors

    model.load_state_dict({k: np.array(v) for k, v in load_safetensors(path).items()})
