"""Optimizers as graphs: SGD (momentum), Adam and AdamW, with PyTorch's update formulas.

An optimizer does not run anything: ``update`` records one step's arithmetic for one
parameter (its gradient, its state tensors) into the training graph, so forward, backward and
update compile into one plan (``luminal.train.TrainStep``). Per-step scalars (the learning
rate, Adam's bias corrections) are computed on the host in double precision, as PyTorch does,
and fed as scalar inputs: a learning-rate schedule needs no recompile.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .tensor import Tensor


@dataclass(frozen=True)
class Optimizer:
    lr: float = 1e-3

    def state_names(self) -> Sequence[str]:
        """Per-parameter state tensors (same shape as the parameter, zeros at the start)."""
        return ()

    def scalars(self, step: int, lr: float | None = None) -> dict[str, float]:
        """The scalar inputs of step ``step`` (counting from 1)."""
        return {"lr": self.lr if lr is None else lr}

    def update(
        self, p: Tensor, grad: Tensor, state: dict[str, Tensor], s: dict[str, Tensor]
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """(new parameter, new state) after one step; ``s`` holds the ``scalars`` as 0-d
        tensors."""
        raise NotImplementedError

    def _check(self) -> None:
        if not self.lr >= 0:
            raise ValueError(f"{type(self).__name__}: lr must be >= 0, got {self.lr}")


@dataclass(frozen=True)
class SGD(Optimizer):
    lr: float = 1e-3
    momentum: float = 0.0
    dampening: float = 0.0
    weight_decay: float = 0.0
    nesterov: bool = False

    def __post_init__(self) -> None:
        self._check()
        if self.momentum < 0 or self.weight_decay < 0:
            raise ValueError("SGD: momentum and weight_decay must be >= 0")
        if self.nesterov and (self.momentum <= 0 or self.dampening != 0):
            raise ValueError("SGD: nesterov needs momentum > 0 and dampening 0")

    def state_names(self) -> Sequence[str]:
        return ("momentum_buffer",) if self.momentum else ()

    def scalars(self, step: int, lr: float | None = None) -> dict[str, float]:
        # the first step takes the gradient as is (PyTorch clones it; no dampening)
        return {**super().scalars(step, lr), "first": 1.0 if step == 1 else 0.0}

    def update(
        self, p: Tensor, grad: Tensor, state: dict[str, Tensor], s: dict[str, Tensor]
    ) -> tuple[Tensor, dict[str, Tensor]]:
        g = grad + p * self.weight_decay if self.weight_decay else grad
        if not self.momentum:
            return p - g * s["lr"], {}
        buf = state["momentum_buffer"] * self.momentum + g * (1.0 - self.dampening)
        buf = buf + (g - buf) * s["first"]
        d = g + buf * self.momentum if self.nesterov else buf
        return p - d * s["lr"], {"momentum_buffer": buf}


@dataclass(frozen=True)
class Adam(Optimizer):
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        self._check()
        b1, b2 = self.betas
        if not (0 <= b1 < 1 and 0 <= b2 < 1):
            raise ValueError(f"{type(self).__name__}: betas must be in [0, 1), got {self.betas}")
        if self.eps < 0 or self.weight_decay < 0:
            raise ValueError(f"{type(self).__name__}: eps and weight_decay must be >= 0")

    def state_names(self) -> Sequence[str]:
        return ("exp_avg", "exp_avg_sq")

    def scalars(self, step: int, lr: float | None = None) -> dict[str, float]:
        b1, b2 = self.betas
        lr = self.lr if lr is None else lr
        return {
            "lr": lr,
            "step_size": lr / (1.0 - b1**step),
            "bc2_sqrt": (1.0 - b2**step) ** 0.5,
        }

    def _decayed(self, p: Tensor, grad: Tensor, lr: Tensor) -> tuple[Tensor, Tensor]:
        """(parameter, gradient) after weight decay: L2 in the gradient (Adam)."""
        return p, (grad + p * self.weight_decay if self.weight_decay else grad)

    def update(
        self, p: Tensor, grad: Tensor, state: dict[str, Tensor], s: dict[str, Tensor]
    ) -> tuple[Tensor, dict[str, Tensor]]:
        b1, b2 = self.betas
        p, g = self._decayed(p, grad, s["lr"])
        m = state["exp_avg"] * b1 + g * (1.0 - b1)
        v = state["exp_avg_sq"] * b2 + g * g * (1.0 - b2)
        denom = v.sqrt() / s["bc2_sqrt"] + self.eps
        return p - m / denom * s["step_size"], {"exp_avg": m, "exp_avg_sq": v}


@dataclass(frozen=True)
class AdamW(Adam):
    weight_decay: float = 1e-2

    def _decayed(self, p: Tensor, grad: Tensor, lr: Tensor) -> tuple[Tensor, Tensor]:
        """Decoupled decay: the parameter shrinks before the Adam step (AdamW)."""
        return (p * (1.0 - lr * self.weight_decay) if self.weight_decay else p), grad
