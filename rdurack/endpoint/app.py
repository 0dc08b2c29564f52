"""The HTTP endpoint: OpenAI's `/v1/models`, `/v1/completions` and `/v1/chat/completions`
(streamed as server-sent events, or not), `/metrics` for Prometheus and `/health` for
probes, on FastAPI.

Every request goes to its model's engine (endpoint/engine.py; a CoE bundle's experts,
and the bundle whose router picks one, share the bundle's: endpoint/models.py, and the
expert that served it is the `x-rdurack-expert` header); its tokens come back as
the engine's iterations produce them, and `usage` reports the emulated timings. Errors
are OpenAI's error body with the status an OpenAI client expects: 400 for a bad field
(named) or a prompt that can never fit, 404 for an unknown model, 429 with Retry-After
when the model's queue is at its bound, 503 with Retry-After when the rack's sockets
could not run an iteration (a stream already under way ends with an error event); with
the rack's tokens on, 401 and 403 (who may call, and which models: endpoint/auth.py). A
client that goes away, or a stop sequence met, takes its request out of the batch at
once.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from math import ceil
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from opentelemetry.trace import TracerProvider
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.types import ASGIApp, Receive, Scope, Send

from rdurack.endpoint import tracing
from rdurack.endpoint.auth import Gate
from rdurack.endpoint.engine import Engine, QueueFull, Token, Unavailable
from rdurack.endpoint.metrics import EndpointMetrics
from rdurack.endpoint.models import Models, Served
from rdurack.endpoint.protocol import (
    ChatRequest,
    CompletionRequest,
    Sampling,
    Usage,
    error_body,
)
from rdurack.endpoint.text import Text, chat_tokens, count_tokens, seed_of
from rdurack.errors import UnknownName
from rdurack.telemetry.names import TRACER_ENDPOINT
from rdurack.workloads.serving.stream.scheduler import Refused

OWNER = "rdurack"
EXPERT_HEADER = "x-rdurack-expert"  # a bundle's request: the expert that served it


def create_app(
    engines: dict[str, Engine],
    metrics: EndpointMetrics | None = None,
    gate: Gate | None = None,
    tracer_provider: TracerProvider | None = None,
) -> FastAPI:
    """An app serving `engines` by model name (a bundle's, by its experts' too); it
    starts and stops them with itself. `gate`: who may call and which models (default:
    everyone, every model). `tracer_provider`: a trace per completion request
    (endpoint/tracing.py; default: none)."""
    served = Models(engines)
    access = gate or Gate.open()
    watched = metrics or EndpointMetrics()
    for engine in engines.values():
        watched.watch(engine)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        for engine in engines.values():
            engine.start()
        yield
        for engine in engines.values():
            await engine.stop()

    app = FastAPI(
        title="rdurack",
        lifespan=lifespan,
        dependencies=[Depends(access.model_allowed)],
        telemetry=tracing.telemetry(tracer_provider),
    )
    app.add_middleware(Received)
    access.install(app)  # outside Received: an unknown caller is refused before anything
    if tracer_provider is not None:
        tracing.watch(engines.values(), tracer_provider.get_tracer(TRACER_ENDPOINT))
    _errors(app)
    created = int(time.time())

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        mine = [_model(m, created) for m in served.names if access.may_use(request, m)]
        return {"object": "list", "data": mine}

    @app.get("/v1/models/{name}")
    async def one_model(name: str) -> dict[str, Any]:
        served.engine_of(name)
        return _model(name, created)

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, request: Request) -> Response | dict[str, Any]:
        prompt = body.text()
        limit, received = body.limit(), request.state.received
        run = served.submit(body.model, prompt, count_tokens(prompt), limit, received)
        return await _serve(Reply(run, body, seed_of(prompt, body.seed), False))

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(body: ChatRequest, request: Request) -> Response | dict[str, Any]:
        texts = [m.text() for m in body.messages]
        prompt, limit, received = "\n".join(texts), body.limit(), request.state.received
        run = served.submit(body.model, prompt, chat_tokens(texts), limit, received)
        return await _serve(Reply(run, body, seed_of(prompt, body.seed), True))

    @app.get("/metrics")
    async def scrape() -> Response:
        return Response(generate_latest(watched.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/health")
    async def health() -> Response:
        # For probes (vLLM's route): open, and as cheap as an answer gets.
        return Response(status_code=200)

    return app


class Received:
    """ASGI middleware: stamps when the server got each request (`request.state.received`,
    time.monotonic()), before parsing and validating it, which the engine does not count
    as emulated time."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope.setdefault("state", {})["received"] = time.monotonic()
        await self.app(scope, receive, send)


def _model(name: str, created: int) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": created, "owned_by": OWNER}


# ------------------------------------------------------------------ serving one request


class Reply:
    """What goes back for one request: its text so far, its tokens, its usage."""

    def __init__(self, run: Served, body: Sampling, seed: int, chat: bool):
        self.engine, self.handle, self.expert = run.engine, run.handle, run.expert
        self.body, self.chat = body, chat
        self.text = Text(seed, body.stops())
        self.tokens: list[Token] = []
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())

    async def next(self) -> str | None:
        """The next token's text, or None when the request is over (its length reached,
        a stop sequence met: then it leaves the batch at once)."""
        if self.text.stopped:
            return None
        token = await self.handle.tokens.get()
        if token is None:
            if self.handle.error is not None:
                raise self.handle.error
            return None
        self.tokens.append(token)
        piece = self.text.next()
        if self.text.stopped:
            self.engine.cancel(self.handle)
        return piece

    @property
    def finish_reason(self) -> str:
        return "stop" if self.text.stopped else "length"

    def usage(self) -> Usage:
        a, n = self.handle.arrival, len(self.tokens)
        first = self.tokens[0].emulated_s if n else a.at_s
        last = self.tokens[-1].emulated_s if n else a.at_s
        total = last - a.at_s
        batches = self.handle.batches
        return Usage(
            prompt_tokens=a.prompt_tokens,
            completion_tokens=n,
            total_tokens=a.prompt_tokens + n,
            time_to_first_token=first - a.at_s,
            total_latency=total,
            completion_tokens_per_sec=n / total if total > 0 else 0.0,
            completion_tokens_after_first_per_sec=(n - 1) / (last - first) if n > 1 else 0.0,
            batch_size_used=round(sum(batches) / len(batches)) if batches else 0,
        )

    def choice(self, text: str, finish: str | None, chunk: bool) -> dict[str, Any]:
        """One choice: a completion's text; a chat's message, or in a chunk the delta
        (OpenAI's last chunk has an empty delta and the finish reason)."""
        if not self.chat:
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        if chunk:
            delta = {"content": text} if text else {}
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        message = {"role": "assistant", "content": text}
        return {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}

    def envelope(self, choices: list[dict[str, Any]], chunk: bool) -> dict[str, Any]:
        kind = "chat.completion" if self.chat else "text_completion"
        return {
            "id": self.id,
            "object": f"{kind}.chunk" if chunk and self.chat else kind,
            "created": self.created,
            "model": self.body.model,
            "choices": choices,
        }


async def _serve(reply: Reply) -> Response | dict[str, Any]:
    """The reply streamed as server-sent events, or whole when its last token is out."""
    engine, handle = reply.engine, reply.handle
    headers = {EXPERT_HEADER: reply.expert} if reply.expert else None
    if reply.body.stream:
        return StreamingResponse(_events(reply), media_type="text/event-stream", headers=headers)
    try:
        while await reply.next() is not None:
            pass  # the text gathers in reply.text
    finally:
        engine.cancel(handle)  # the client gone mid-wait: its slot and cache freed
    out = reply.envelope([reply.choice(reply.text.text, reply.finish_reason, False)], False)
    body = {**out, "usage": reply.usage().model_dump()}
    return body if headers is None else JSONResponse(body, headers=headers)


async def _events(reply: Reply) -> AsyncIterator[str]:
    """Server-sent events: a chunk per token, the finish, the usage if asked, [DONE]."""
    try:
        if reply.chat:  # OpenAI's first chat chunk names the role
            role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                    "finish_reason": None}  # fmt: skip
            yield _sse(reply.envelope([role], True))
        try:
            while (piece := await reply.next()) is not None:
                yield _sse(reply.envelope([reply.choice(piece, None, True)], True))
        except Unavailable as e:  # the status is sent: OpenAI streams an error event
            yield _sse(error_body(str(e), "service_unavailable_error", None, "unavailable"))
            return
        yield _sse(reply.envelope([reply.choice("", reply.finish_reason, True)], True))
        options = reply.body.stream_options
        if options is not None and options.include_usage:
            yield _sse(reply.envelope([], True) | {"usage": reply.usage().model_dump()})
        yield "data: [DONE]\n\n"
    finally:
        reply.engine.cancel(reply.handle)


def _sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data)}\n\n"


# ------------------------------------------------------------------ errors


def _errors(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def bad_field(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        where = [str(p) for p in first.get("loc", ()) if p != "body"]
        param = ".".join(where) or None
        message = f"{param}: {first.get('msg')}" if param else str(first.get("msg"))
        return JSONResponse(error_body(message, "invalid_request_error", param), 400)

    @app.exception_handler(UnknownName)
    async def no_model(request: Request, exc: UnknownName) -> JSONResponse:
        message = f"{exc} (the models served here)"
        return JSONResponse(
            error_body(message, "invalid_request_error", "model", "model_not_found"), 404
        )

    @app.exception_handler(Refused)
    async def too_long(request: Request, exc: Refused) -> JSONResponse:
        return JSONResponse(
            error_body(str(exc), "invalid_request_error", "messages", "context_length_exceeded"),
            400,
        )

    @app.exception_handler(QueueFull)
    async def busy(request: Request, exc: QueueFull) -> JSONResponse:
        retry = max(1, ceil(exc.retry_after_s))
        return JSONResponse(
            error_body(str(exc), "rate_limit_error", None, "queue_full"),
            429,
            headers={"Retry-After": str(retry)},
        )

    @app.exception_handler(Unavailable)
    async def down(request: Request, exc: Unavailable) -> JSONResponse:
        return JSONResponse(
            error_body(str(exc), "service_unavailable_error", None, "unavailable"),
            503,
            headers={"Retry-After": str(max(1, ceil(exc.retry_after_s)))},
        )

    @app.exception_handler(ValueError)
    async def bad_value(request: Request, exc: ValueError) -> JSONResponse:
        return JSONResponse(error_body(str(exc), "invalid_request_error"), 400)
