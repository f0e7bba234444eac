"""What one server accepts: the limits ``luminal serve`` enforces on every request."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    """``max_context``: tokens per sequence (prompt + generated; the KV-cache slot size).
    ``max_tokens``: generated tokens per request. ``max_seqs``: sequences decoded together
    (KV-cache slots, the batch of the decode plan). ``max_queue``: requests waiting for a
    slot; beyond it a request gets 429 with Retry-After. ``max_request_bytes``: request body
    size (413 beyond). ``idle_unload``: seconds without requests before the model's plans and
    weights are dropped (0: never). ``shutdown_grace``: seconds in-flight requests get to
    finish on shutdown before they are cancelled. ``max_embed_inputs``: texts per
    embeddings request."""

    max_context: int = 1024
    max_tokens: int = 512
    max_seqs: int = 16
    max_queue: int = 64
    max_request_bytes: int = 1 << 20
    idle_unload: float = 0.0
    shutdown_grace: float = 10.0
    max_embed_inputs: int = 256

    def __post_init__(self) -> None:
        for name in (
            "max_context",
            "max_tokens",
            "max_seqs",
            "max_request_bytes",
            "max_embed_inputs",
        ):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if isinstance(self.max_queue, bool) or not isinstance(self.max_queue, int):
            raise ValueError(f"max_queue must be an int, got {self.max_queue!r}")
        if self.max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {self.max_queue}")
        for name in ("idle_unload", "shutdown_grace"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
                raise ValueError(f"{name} must be a number of seconds >= 0, got {v!r}")
