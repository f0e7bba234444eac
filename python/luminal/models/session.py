"""``LMSession``: a language model with its KV cache and tokenizer, as ``models.load``
returns decoders."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from .llama import LlamaSession


class LMSession(LlamaSession):
    """A language model with its KV cache and tokenizer (``LlamaSession`` plus
    ``generate``)."""

    def __init__(self, model: Any, tokenizer: Any = None, backend: str = "auto",
                 quiet: bool = True, **kw: Any) -> None:  # fmt: skip
        super().__init__(model, backend, quiet, **kw)
        self.tokenizer = tokenizer
        self._history: list[int] = []

    def _rope_switch(self) -> int | None:
        """LongRoPE's original context: past it, every position takes the long factors."""
        s = getattr(self.model.config, "rope_scaling", None)
        if s and s.get("rope_type") == "longrope":
            return int(s["original_max_position_embeddings"])
        return None

    def reset(self) -> None:
        super().reset()
        self._history = []

    def forward(self, tokens: list[int] | np.ndarray) -> np.ndarray:
        """``LlamaSession.forward``; a LongRoPE model whose step crosses the original
        context runs its whole history again, so the cached keys are rotated with the long
        factors too (as transformers' Phi-3 recomputes its cache there)."""
        switch = self._rope_switch()
        if switch is None:
            return super().forward(tokens)
        toks = [int(t) for t in np.asarray(tokens).reshape(-1)]
        if 0 < self.pos <= switch < self.pos + len(toks):
            toks = self._history + toks
            super().reset()
            self._history = []
        out = super().forward(toks)
        self._history.extend(toks)
        return out

    @property
    def config(self) -> Any:
        return self.model.config

    def stream(
        self,
        prompt: str | Sequence[int],
        max_new_tokens: int = 32,
        sampler: Callable[[np.ndarray], int] | None = None,
        stop: Sequence[int] | None = None,
        images: np.ndarray | None = None,
    ) -> Iterator[int]:
        """New token ids after ``prompt`` (text needs a tokenizer), greedy unless a
        ``sampler`` is given, up to ``max_new_tokens`` or a stop id (default: the tokenizer's
        EOS ids; the stop id is not yielded). Continues from the cache: ``reset()`` first for
        a fresh conversation. ``images`` (pixels) go with a prompt holding their image tokens,
        for models that take images."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("a text prompt needs a tokenizer; pass token ids instead")
            ids = self.tokenizer.encode(prompt)
        else:
            ids = [int(t) for t in prompt]
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        stops = set(stop if stop is not None else getattr(self.tokenizer, "eos_ids", []))
        pick = sampler or (lambda lg: int(np.argmax(lg)))
        budget = min(max_new_tokens, self.model.ctx - self.pos - len(ids) + 1)
        if max_new_tokens and budget < 1:
            raise ValueError(
                f"context full: {self.pos} cached + {len(ids)} prompt tokens leave no room in "
                f"the context of {self.model.ctx} tokens"
            )
        if not max_new_tokens:
            return
        logits = self._prefill(ids, images)
        for n in range(budget):
            nxt = pick(logits)
            if nxt in stops:
                return
            yield nxt
            if n + 1 < budget:
                logits = self.forward([nxt])

    def generate(
        self,
        prompt: str | Sequence[int],
        max_new_tokens: int = 32,
        sampler: Callable[[np.ndarray], int] | None = None,
        stop: Sequence[int] | None = None,
        images: np.ndarray | None = None,
    ) -> list[int]:
        """``list(stream(...))``: the generated ids (decode them with ``tokenizer.decode``)."""
        return list(self.stream(prompt, max_new_tokens, sampler, stop, images))

    def _prefill(self, ids: list[int], images: np.ndarray | None) -> np.ndarray:
        if images is not None:
            arch = getattr(self.config, "arch", type(self.model).__name__.lower())
            raise ValueError(f"{arch}: this model takes no images")
        return self.forward(ids)
