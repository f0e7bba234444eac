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
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
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
        if body.logprobs:
            raise APIError(400, "logprobs are not supported", "logprobs")
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
        return await _generate(srv, eng, request, body, ids, mx, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await read_body(request, CompletionRequest, limits.max_request_bytes)
        eng = srv.llm_for(body.model)
        for flag, bad in (
            ("echo", body.echo),
            ("logprobs", body.logprobs is not None),
            ("suffix", body.suffix is not None),
        ):
            if bad:
                raise APIError(400, f"{flag} is not supported", flag)
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
        return await _generate(srv, eng, request, body, ids, body.max_tokens, chat=False)

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


async def _generate(
    srv: Server,
    eng: LLMEngine,
    request: Request,
    body: Any,
    ids: list[int],
    max_tokens: int | None,
    chat: bool,
) -> Response:
    limits = srv.limits
    if body.n != 1:
        raise APIError(400, f"n must be 1 (got {body.n})", "n")
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
    sampler = Sampler(float(body.temperature), 0, float(body.top_p), body.seed)
    req = GenRequest(ids, budget, sampler, stops, asyncio.get_running_loop())
    try:
        eng.submit(req)
    except QueueFull:
        raise APIError(
            429,
            "the server is at its queue limit; retry shortly",
            None,
            "queue_full",
            {"Retry-After": "1"},
        ) from None
    except ShuttingDown:
        raise APIError(503, "the server is shutting down", None, "shutting_down") from None
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
    created = int(time.time())
    usage_of = lambda: {  # noqa: E731
        "prompt_tokens": len(ids),
        "completion_tokens": req.generated,
        "total_tokens": len(ids) + req.generated,
    }
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(
            _stream(req, rid, created, eng.name, chat, include_usage, usage_of),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )
    parts: list[str] = []
    reason = None
    try:
        while reason is None:
            try:
                kind, value = await asyncio.wait_for(req.events.get(), 0.5)
            except TimeoutError:
                if await request.is_disconnected():
                    req.cancel()
                    return Response(status_code=499)
                continue
            if kind == "text":
                parts.append(value)
            elif kind == "done":
                reason = value
            else:
                raise APIError(500, f"generation failed: {value}")
    finally:
        req.cancel()  # no-op once done; frees the slot if the handler is cancelled
    text = "".join(parts)
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": reason}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    return JSONResponse(
        {
            "id": rid,
            "object": "chat.completion" if chat else "text_completion",
            "created": created,
            "model": eng.name,
            "choices": [choice],
            "usage": usage_of(),
        }
    )


def _sse(obj: Any) -> bytes:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n".encode()


async def _stream(
    req: GenRequest,
    rid: str,
    created: int,
    model: str,
    chat: bool,
    include_usage: bool,
    usage_of: Any,
) -> AsyncIterator[bytes]:
    obj = "chat.completion.chunk" if chat else "text_completion"

    def chunk(text: str | None, reason: str | None, first: bool = False) -> bytes:
        c: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": reason}
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
            "model": model,
            "choices": [c],
        }
        if include_usage:
            out["usage"] = None
        return _sse(out)

    try:
        if chat:
            yield chunk("", None, first=True)
        while True:
            kind, value = await req.events.get()
            if kind == "text":
                yield chunk(value, None)
            elif kind == "done":
                yield chunk(None, value)
                break
            else:
                yield _sse(error_body(500, f"generation failed: {value}"))
                break
        if include_usage:
            yield _sse(
                {
                    "id": rid,
                    "object": obj,
                    "created": created,
                    "model": model,
                    "choices": [],
                    "usage": usage_of(),
                }
            )
        yield b"data: [DONE]\n\n"
    finally:
        req.cancel()  # the client went away (or we are done): free the slot
