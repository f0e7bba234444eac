"""The OpenAI-compatible HTTP application: ``/v1/chat/completions``, ``/v1/completions``
(streaming over SSE or not), ``/v1/embeddings``, ``/v1/models``, ``/health`` and
``/metrics`` (Prometheus). Bodies are parsed here, bounded in size, and validated
(``schemas``); every client mistake is a 4xx with an OpenAI-style error body (``errors``)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing, asynccontextmanager
from typing import Any, TypeVar

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..sampling import Sampler
from .engine import EmbedEngine, GenRequest, LLMEngine, QueueFull, ShuttingDown, log
from .errors import APIError, error_body
from .limits import Limits
from .metrics import Metrics
from .schemas import ChatRequest, CompletionRequest, EmbeddingRequest, describe

B = TypeVar("B", bound=BaseModel)
_ENDPOINTS = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/models",
    "/health",
    "/metrics",
)
MAX_STOPS = 4


class _CountRequests:
    """ASGI middleware counting responses by endpoint and status (a plain wrapper, so
    streaming responses and client disconnects pass through untouched)."""

    def __init__(self, app: Any, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = [500]

        async def send_status(msg: Any) -> None:
            if msg["type"] == "http.response.start":
                status[0] = msg["status"]
            await send(msg)

        path = scope.get("path", "")
        label = path if path in _ENDPOINTS else "other"
        try:
            await self.app(scope, receive, send_status)
        finally:
            self.metrics.requests.labels(label, str(status[0])).inc()


class Server:
    """The state the handlers share: engines, limits, metrics."""

    def __init__(
        self, llm: LLMEngine | None, embed: EmbedEngine | None, limits: Limits, metrics: Metrics
    ) -> None:
        self.llm = llm
        self.embed = embed
        self.limits = limits
        self.metrics = metrics
        self.created = int(time.time())

    def models(self) -> list[dict[str, Any]]:
        names = [e.name for e in (self.llm, self.embed) if e is not None]
        return [
            {"id": n, "object": "model", "created": self.created, "owned_by": "luminal"}
            for n in names
        ]

    def llm_for(self, model: str) -> LLMEngine:
        if self.llm is not None and model == self.llm.name:
            return self.llm
        if self.embed is not None and model == self.embed.name:
            raise APIError(
                400,
                f"model {model!r} is an embedding model; use /v1/embeddings",
                "model",
                "model_not_supported",
            )
        raise self._unknown(model)

    def embed_for(self, model: str) -> EmbedEngine:
        if self.embed is not None and model == self.embed.name:
            return self.embed
        if self.llm is not None and model == self.llm.name:
            raise APIError(
                400,
                f"model {model!r} generates text; it has no embeddings endpoint here",
                "model",
                "model_not_supported",
            )
        raise self._unknown(model)

    def _unknown(self, model: str) -> APIError:
        have = ", ".join(repr(m["id"]) for m in self.models()) or "none"
        return APIError(
            404, f"the model {model!r} does not exist (served: {have})", "model", "model_not_found"
        )


async def read_body(request: Request, schema: type[B], limit: int) -> B:
    """The JSON body as ``schema``: 413 past ``limit`` bytes, 400 for bad JSON or fields."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise APIError(413, f"the request body has {declared} bytes; the limit is {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise APIError(413, f"the request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    raw = b"".join(chunks)
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise APIError(400, f"the request body is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise APIError(400, f"the request body must be a JSON object, not {type(data).__name__}")
    try:
        return schema.model_validate(data)
    except ValidationError as e:
        msg, param = describe(e.errors())
        raise APIError(400, msg, param) from None


def create_app(
    llm: LLMEngine | None, embed: EmbedEngine | None, limits: Limits, metrics: Metrics | None = None
) -> FastAPI:
    """The application over started engines (``engine.start()``); its lifespan shuts them
    down (running requests get ``limits.shutdown_grace`` seconds)."""
    metrics = metrics or (llm.metrics if llm else embed.metrics if embed else Metrics())
    srv = Server(llm, embed, limits, metrics)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        task = asyncio.create_task(_idle_embedder(srv))
        try:
            yield
        finally:
            task.cancel()
            if srv.llm is not None:
                await asyncio.to_thread(srv.llm.shutdown)
            log("stopped")

    app = FastAPI(title="luminal serve", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.server = srv

    @app.exception_handler(APIError)
    async def _api_error(_: Request, e: APIError) -> JSONResponse:
        return e.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, e: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(
            error_body(e.status_code, str(e.detail)),
            status_code=e.status_code,
            headers=getattr(e, "headers", None),
        )

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, e: RequestValidationError) -> JSONResponse:
        msg, param = describe(list(e.errors()))
        return JSONResponse(error_body(400, msg, param), status_code=400)

    @app.exception_handler(Exception)
    async def _internal(_: Request, e: Exception) -> JSONResponse:
        log(f"internal error: {type(e).__name__}: {e}")
        return JSONResponse(error_body(500, f"internal error: {type(e).__name__}"), 500)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        out: dict[str, Any] = {"status": "ok", "pid": os.getpid(), "models": {}}
        if srv.llm is not None:
            active, waiting = srv.llm.counts()
            out["models"][srv.llm.name] = {
                "loaded": srv.llm.is_loaded,
                "active": active,
                "waiting": waiting,
            }
            if srv.llm.stopping:
                out["status"] = "stopping"
        if srv.embed is not None:
            out["models"][srv.embed.name] = {"loaded": srv.embed.is_loaded}
        return out

    @app.get("/metrics")
    async def prom() -> Response:
        body, ctype = metrics.render()
        return Response(body, media_type=ctype)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": srv.models()}

    @app.get("/v1/models/{name:path}")
    async def model(name: str) -> dict[str, Any]:
        for m in srv.models():
            if m["id"] == name:
                return m
        raise srv._unknown(name)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = await read_body(request, ChatRequest, limits.max_request_bytes)
        eng = srv.llm_for(body.model)
        if body.top_logprobs is not None and not body.logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true", "top_logprobs")
        top = (body.top_logprobs or 0) if body.logprobs else None
        msgs = [
            {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
            for m in body.messages
        ]
        try:
            text = eng.tokenizer.apply_chat_template(msgs)
        except Exception as e:  # a template that rejects these messages (e.g. role order)
            raise APIError(
                400, f"the chat template rejects these messages: {e}", "messages"
            ) from None
        ids = eng.tokenizer.encode(text)
        mx = body.max_completion_tokens or body.max_tokens
        return await _generate(srv, eng, request, body, ids, mx, top, None)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await read_body(request, CompletionRequest, limits.max_request_bytes)
        eng = srv.llm_for(body.model)
        if body.suffix is not None:
            raise APIError(400, "suffix is not supported", "suffix")
        if body.echo and body.logprobs is not None and body.stream:
            raise APIError(400, "echo with logprobs is not supported when streaming", "echo")
        p = body.prompt
        if isinstance(p, list) and p and isinstance(p[0], int):
            ids = [int(t) for t in p]
            bad_ids = [t for t in ids if not 0 <= t < eng.tokenizer.vocab_size]
            if bad_ids:
                raise APIError(
                    400,
                    f"token id {bad_ids[0]} is out of range [0, {eng.tokenizer.vocab_size})",
                    "prompt",
                )
        else:
            texts = [p] if isinstance(p, str) else p
            if len(texts) != 1:
                raise APIError(400, f"one prompt per request (got {len(texts)})", "prompt")
            ids = eng.tokenizer.encode(str(texts[0]))
        echo: str | None = None
        if body.echo:  # the prompt as sent, or its token ids decoded
            first = p[0] if isinstance(p, list) and p and isinstance(p[0], str) else p
            echo = first if isinstance(first, str) else str(eng.tokenizer.decode(ids))
        return await _generate(srv, eng, request, body, ids, body.max_tokens, body.logprobs, echo)

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        body = await read_body(request, EmbeddingRequest, limits.max_request_bytes)
        eng = srv.embed_for(body.model)
        texts = [body.input] if isinstance(body.input, str) else list(body.input)
        if not texts:
            raise APIError(400, "input must not be empty", "input")
        if len(texts) > limits.max_embed_inputs:
            raise APIError(
                400,
                f"input has {len(texts)} texts; the limit is {limits.max_embed_inputs}",
                "input",
            )
        for i, t in enumerate(texts):
            if not t.strip():
                raise APIError(400, f"input[{i}] is empty", "input")
        counts = eng.count_tokens(texts)
        vecs = await asyncio.to_thread(eng.embed, texts)
        if body.dimensions is not None and body.dimensions != vecs.shape[1]:
            raise APIError(400, f"dimensions must be {vecs.shape[1]} for this model", "dimensions")
        data = []
        for i, v in enumerate(vecs):
            emb: Any = (
                base64.b64encode(np.ascontiguousarray(v, "<f4").tobytes()).decode()
                if body.encoding_format == "base64"
                else [float(x) for x in v]
            )
            data.append({"object": "embedding", "index": i, "embedding": emb})
        used = sum(counts)
        metrics.prompt_tokens.inc(used)
        return JSONResponse(
            {
                "object": "list",
                "data": data,
                "model": eng.name,
                "usage": {"prompt_tokens": used, "total_tokens": used},
            }
        )

    app.add_middleware(_CountRequests, metrics=metrics)
    return app


async def _idle_embedder(srv: Server) -> None:
    while srv.embed is not None and srv.limits.idle_unload:
        await asyncio.sleep(min(0.5, srv.limits.idle_unload / 4))
        await asyncio.to_thread(srv.embed.maybe_unload)


class _Gone(Exception):
    """The client of a non-streaming request disconnected."""


async def _events(
    reqs: list[GenRequest], request: Request | None = None
) -> AsyncGenerator[tuple[int, str, Any], None]:
    """The events of ``reqs`` as ``(index, kind, value)`` in the order they come, until each
    has ended; with ``request``, raises ``_Gone`` once its client disconnects."""
    merged: asyncio.Queue[tuple[int, str, Any]] = asyncio.Queue()

    async def pump(i: int, r: GenRequest) -> None:
        while True:
            kind, value = await r.events.get()
            merged.put_nowait((i, kind, value))
            if kind in ("done", "error"):
                return

    async def one() -> tuple[int, str, Any]:
        kind, value = await reqs[0].events.get()
        return 0, kind, value

    # one request (n = 1, the usual case) is read directly: no pump task per event
    tasks = [asyncio.create_task(pump(i, r)) for i, r in enumerate(reqs)] if len(reqs) > 1 else []
    get = merged.get if tasks else one
    left = len(reqs)
    try:
        while left:
            if request is None:  # streaming: a gone client ends the response's generator
                i, kind, value = await get()
            else:
                try:
                    i, kind, value = await asyncio.wait_for(get(), 0.5)
                except TimeoutError:
                    if await request.is_disconnected():
                        raise _Gone() from None
                    continue
            if kind in ("done", "error"):
                left -= 1
            yield i, kind, value
    finally:
        for t in tasks:
            t.cancel()
        for r in reqs:
            r.cancel()  # no-op once done; frees the slots of the unfinished ones


def _token_text(eng: LLMEngine, tok: int) -> str:
    return str(eng.tokenizer.decode([tok]))


def _chat_logprobs(eng: LLMEngine, recs: list[Any]) -> dict[str, Any]:
    def one(tok: int, lp: float) -> dict[str, Any]:
        t = _token_text(eng, tok)
        return {"token": t, "logprob": lp, "bytes": list(t.encode())}

    content = [
        {**one(tok, lp), "top_logprobs": [one(t, x) for t, x in top]} for tok, lp, top in recs
    ]
    return {"content": content, "refusal": None}


def _completion_logprobs(eng: LLMEngine, recs: list[Any], offset: int) -> dict[str, Any]:
    tokens = [_token_text(eng, tok) for tok, _, _ in recs]
    offsets = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t)
    return {
        "tokens": tokens,
        "token_logprobs": [lp for _, lp, _ in recs],
        "top_logprobs": [{_token_text(eng, t): x for t, x in top or []} for _, _, top in recs],
        "text_offset": offsets,
    }


async def _generate(
    srv: Server,
    eng: LLMEngine,
    request: Request,
    body: Any,
    ids: list[int],
    max_tokens: int | None,
    top_logprobs: int | None,
    echo: str | None,
) -> Response:
    """A chat completion (``body`` a ``ChatRequest``) or a completion: ``body.n`` sequences
    of the prompt ``ids``, each in its own slot; ``echo``: the prompt text that the
    completion text begins with."""
    limits = srv.limits
    chat = isinstance(body, ChatRequest)
    n = body.n
    if not 1 <= n <= limits.max_seqs:
        raise APIError(400, f"n must be in [1, {limits.max_seqs}] (got {n})", "n")
    stops = body.stops()
    if len(stops) > MAX_STOPS or any(not s for s in stops):
        raise APIError(400, f"stop takes up to {MAX_STOPS} non-empty strings", "stop")
    if max_tokens is not None and max_tokens > limits.max_tokens:
        raise APIError(
            400,
            f"max_tokens is {max_tokens}; this server's limit is {limits.max_tokens}",
            "max_tokens",
        )
    if not ids:
        raise APIError(400, "the prompt is empty", "messages" if chat else "prompt")
    if len(ids) + 1 > eng.ctx:
        raise APIError(
            400,
            f"the prompt has {len(ids)} tokens; this model's context is "
            f"{eng.ctx} tokens (prompt + completion)",
            "messages" if chat else "prompt",
            "context_length_exceeded",
        )
    budget = min(max_tokens or limits.max_tokens, eng.ctx - len(ids))
    loop = asyncio.get_running_loop()
    reqs = []
    for i in range(n):  # with a seed, choice i samples with seed + i: n distinct choices
        seed = None if body.seed is None else body.seed + i
        sampler = Sampler(float(body.temperature), 0, float(body.top_p), seed)
        prompt_lps = echo is not None and top_logprobs is not None
        reqs.append(GenRequest(ids, budget, sampler, stops, loop, top_logprobs, prompt_lps))
    try:
        for r in reqs:
            eng.submit(r)
    except QueueFull:
        for r in reqs:
            r.cancel()
        raise APIError(
            429,
            "the server is at its queue limit; retry shortly",
            None,
            "queue_full",
            {"Retry-After": "1"},
        ) from None
    except ShuttingDown:
        for r in reqs:
            r.cancel()
        raise APIError(503, "the server is shutting down", None, "shutting_down") from None
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
    created = int(time.time())
    usage_of = lambda: {  # noqa: E731
        "prompt_tokens": len(ids),
        "completion_tokens": sum(r.generated for r in reqs),
        "total_tokens": len(ids) + sum(r.generated for r in reqs),
    }
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(
            _stream(eng, reqs, rid, created, chat, include_usage, usage_of, top_logprobs, echo),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )
    parts: list[list[str]] = [[echo] if echo else [] for _ in reqs]
    recs: list[list[Any]] = [[] for _ in reqs]
    prompt_recs: list[list[Any]] = [[] for _ in reqs]
    reasons: list[str | None] = [None] * n
    try:
        async with aclosing(_events(reqs, request)) as events:
            async for i, kind, value in events:
                if kind == "text":
                    parts[i].append(value)
                elif kind == "logprob":
                    recs[i].append(value)
                elif kind == "prompt_logprob":
                    prompt_recs[i].append(value)
                elif kind == "done":
                    reasons[i] = value
                else:
                    raise APIError(500, f"generation failed: {value}")
    except _Gone:
        return Response(status_code=499)
    choices = []
    for i in range(n):
        text = "".join(parts[i])
        choice: dict[str, Any] = {"index": i, "logprobs": None, "finish_reason": reasons[i]}
        if top_logprobs is not None:
            if chat:
                choice["logprobs"] = _chat_logprobs(eng, recs[i])
            elif echo is not None:  # the prompt's tokens first; the first has no logprob
                lp = _completion_logprobs(eng, [(ids[0], None, None), *prompt_recs[i], *recs[i]], 0)
                lp["top_logprobs"][0] = None
                choice["logprobs"] = lp
            else:
                choice["logprobs"] = _completion_logprobs(eng, recs[i], 0)
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        choices.append(choice)
    return JSONResponse(
        {
            "id": rid,
            "object": "chat.completion" if chat else "text_completion",
            "created": created,
            "model": eng.name,
            "choices": choices,
            "usage": usage_of(),
        }
    )


def _sse(obj: Any) -> bytes:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n".encode()


async def _stream(
    eng: LLMEngine,
    reqs: list[GenRequest],
    rid: str,
    created: int,
    chat: bool,
    include_usage: bool,
    usage_of: Any,
    top_logprobs: int | None,
    echo: str | None,
) -> AsyncIterator[bytes]:
    """SSE chunks of ``reqs`` (choice ``index`` each): text as it comes, the logprobs of its
    tokens with it, a last chunk with the finish reason, then the usage if asked for."""
    obj = "chat.completion.chunk" if chat else "text_completion"
    offsets = [len(echo or "")] * len(reqs)
    held: list[list[Any]] = [[] for _ in reqs]  # logprobs waiting for their text

    def chunk(i: int, text: str | None, reason: str | None, first: bool = False) -> bytes:
        c: dict[str, Any] = {"index": i, "logprobs": None, "finish_reason": reason}
        if top_logprobs is not None and (held[i] or text):
            if chat:
                c["logprobs"] = _chat_logprobs(eng, held[i])
            else:
                c["logprobs"] = _completion_logprobs(eng, held[i], offsets[i])
                offsets[i] += sum(len(t) for t in c["logprobs"]["tokens"])
            held[i] = []
        if chat:
            delta: dict[str, Any] = {}
            if first:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            c["delta"] = delta
        else:
            c["text"] = text or ""
        out: dict[str, Any] = {
            "id": rid,
            "object": obj,
            "created": created,
            "model": eng.name,
            "choices": [c],
        }
        if include_usage:
            out["usage"] = None
        return _sse(out)

    try:
        for i in range(len(reqs)):
            if chat:
                yield chunk(i, "", None, first=True)
            elif echo:
                yield chunk(i, echo, None)
        async with aclosing(_events(reqs)) as events:
            async for i, kind, value in events:
                if kind == "text":
                    yield chunk(i, value, None)
                elif kind == "logprob":
                    held[i].append(value)
                elif kind == "done":
                    yield chunk(i, None, value)
                else:
                    yield _sse(error_body(500, f"generation failed: {value}"))
                    break
        if include_usage:
            yield _sse(
                {
                    "id": rid,
                    "object": obj,
                    "created": created,
                    "model": eng.name,
                    "choices": [],
                    "usage": usage_of(),
                }
            )
        yield b"data: [DONE]\n\n"
    finally:
        for r in reqs:
            r.cancel()  # the client went away (or we are done): free the slots
