"""Prometheus metrics of one server (its own registry, so several servers can live in one
process, as in tests)."""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

_LATENCY = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "luminal_requests",
            "HTTP requests by endpoint and status",
            ["endpoint", "status"],
            registry=r,
        )
        self.prompt_tokens = Counter("luminal_prompt_tokens", "prompt tokens processed", registry=r)
        self.prompt_reused = Counter(
            "luminal_prompt_tokens_reused",
            "prompt tokens whose keys and values were taken from another sequence's (a shared "
            "prefix) instead of being run",
            registry=r,
        )
        self.completion_tokens = Counter(
            "luminal_completion_tokens", "tokens generated", registry=r
        )
        self.queue_depth = Gauge(
            "luminal_queue_depth", "requests waiting for a KV-cache slot", registry=r
        )
        self.active = Gauge("luminal_active_sequences", "sequences being decoded", registry=r)
        self.ttft = Histogram(
            "luminal_time_to_first_token_seconds",
            "request arrival to its first generated token",
            buckets=_LATENCY,
            registry=r,
        )
        self.itl = Histogram(
            "luminal_inter_token_latency_seconds",
            "time between a sequence's consecutive tokens",
            buckets=_LATENCY,
            registry=r,
        )
        self.batch = Histogram(
            "luminal_batch_size",
            "sequences per batched step",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128),
            registry=r,
        )
        self.step_tokens = Histogram(
            "luminal_step_tokens",
            "tokens per batched step (decode tokens and prompt tokens)",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
            registry=r,
        )
        self.step = Histogram(
            "luminal_decode_step_seconds", "one batched step", buckets=_LATENCY, registry=r
        )
        self.prefill = Histogram(
            "luminal_prefill_seconds",
            "one prompt through the prefill plan (--prefill serial)",
            buckets=_LATENCY,
            registry=r,
        )
        self.host = Histogram(
            "luminal_step_host_seconds",
            "the engine thread's time per iteration outside plan runs (admission, sampling, "
            "detokenizing, events)",
            buckets=(0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1),
            registry=r,
        )
        self.loaded = Gauge(
            "luminal_model_loaded", "1 while a model's plans are loaded", ["model"], registry=r
        )
        self.loads = Counter(
            "luminal_model_loads", "model loads (start and reloads)", ["model"], registry=r
        )
        self.cold_start = Gauge(
            "luminal_cold_start_seconds",
            "duration of the model's last load (plans from the plan cache)",
            ["model"],
            registry=r,
        )
        self.unloads = Counter("luminal_model_unloads", "idle unloads", ["model"], registry=r)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
