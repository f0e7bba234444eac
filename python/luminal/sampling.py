"""Choosing the next token from logits: greedy, temperature, top-k, top-p, seeded.

Runs on the host with numpy on one row of logits (vocab-sized), after the graph has run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Sampler:
    """``temperature <= 0`` is greedy (argmax). Otherwise logits are divided by the
    temperature, cut to the ``top_k`` largest (0: all) and to the smallest set whose
    probability reaches ``top_p`` (1.0: all), renormalized, and sampled with ``seed``."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    rng: np.random.Generator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        self.rng = np.random.default_rng(self.seed)

    def probs(self, logits: np.ndarray) -> np.ndarray:
        """The distribution sampled from (all mass on the argmax when greedy)."""
        x = np.asarray(logits, dtype=np.float64).reshape(-1)
        if self.temperature <= 0:
            p = np.zeros_like(x)
            p[int(np.argmax(x))] = 1.0
            return p
        x = x / self.temperature
        if 0 < self.top_k < x.size:
            kth = np.partition(x, -self.top_k)[-self.top_k]
            x = np.where(x >= kth, x, -np.inf)
        p = np.exp(x - x.max())
        p /= p.sum()
        if self.top_p < 1.0:
            order = np.argsort(-p, kind="stable")
            cum = np.cumsum(p[order])
            keep = order[
                : int(np.searchsorted(cum, self.top_p)) + 1
            ]  # smallest prefix reaching top_p
            mask = np.zeros_like(p, dtype=bool)
            mask[keep] = True
            p = np.where(mask, p, 0.0)
            p /= p.sum()
        return p

    def __call__(self, logits: np.ndarray) -> int:
        if self.temperature <= 0:
            return int(np.argmax(logits))
        p = self.probs(logits)
        return int(self.rng.choice(p.size, p=p))
