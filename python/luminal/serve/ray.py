"""Replicas of ``luminal serve`` behind Ray Serve: ``application(...)`` returns a Ray Serve
application whose every replica loads the model (plans from the plan cache) and serves the
same OpenAI-compatible app; Ray's proxy spreads requests over the replicas.

    from ray import serve
    from luminal.serve.ray import application
    serve.run(application(model="model.gguf", num_replicas=2), route_prefix="/")

Options are ``luminal serve``'s (``--max-seqs`` -> ``max_seqs=...``). Needs ``ray[serve]``.
"""

from __future__ import annotations

import argparse
from typing import Any


def options(**kw: Any) -> argparse.Namespace:
    """``luminal serve``'s options with its defaults, overridden by ``kw`` (underscored)."""
    from .cli import add_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    ns = p.parse_args([])
    for k, v in kw.items():
        if not hasattr(ns, k):
            raise ValueError(f"luminal serve has no option --{k.replace('_', '-')}")
        setattr(ns, k, v)
    return ns


def application(num_replicas: int = 2, num_cpus: float = 1.0, **kw: Any) -> Any:
    """A Ray Serve application of ``num_replicas`` luminal servers (``kw``: server options)."""
    from ray import serve

    args = options(**kw)

    @serve.deployment(num_replicas=num_replicas, ray_actor_options={"num_cpus": num_cpus})
    @serve.ingress()
    class LuminalServer:
        def __init__(self, args: argparse.Namespace) -> None:
            from .cli import build

            self.parts = build(args)

        def __serve_build_asgi_app__(self) -> Any:
            from .app import create_app

            llm, embed, metrics, limits = self.parts
            return create_app(llm, embed, limits, metrics)

    deployment: Any = LuminalServer  # a Ray Serve deployment once decorated
    return deployment.bind(args)
