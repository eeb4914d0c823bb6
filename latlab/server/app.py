"""The OpenAI-compatible HTTP front of the engine (FastAPI).

Routes: /v1/completions, /v1/chat/completions, /v1/models (API key checked when set),
/health, /ready (200 only once warm-up is done), /metrics (Prometheus), /openapi.json.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from latlab import __version__
from latlab.records.engine import ServeConfig
from latlab.server.async_engine import AsyncEngine
from latlab.server.auth import check_bearer
from latlab.server.connections import WholeRequests
from latlab.server.guards import OriginGuard
from latlab.server.openai_serving import OpenAIServing
from latlab.server.openapi import ERRORS, METRICS, install_openapi, request_body
from latlab.server.schemas import (
    ApiError,
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ModelCard,
    ModelList,
)
from latlab.server.telemetry import Telemetry
from latlab.server.timing import TRACEPARENT

log = logging.getLogger("latlab.serve")


class RequestIdMiddleware:
    """The outermost layer of a request: stamp its receipt as early as the app sees it
    (`state.received_ns`, before routing and the body), keep its `traceparent` for its span,
    and echo the request id in `X-Request-Id`: the handler's (state.request_id), else the
    client's own header."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        state = scope.setdefault("state", {})
        state["received_ns"] = time.perf_counter_ns()
        headers = dict(scope["headers"])
        incoming = headers.get(b"x-request-id")
        traceparent = headers.get(b"traceparent")
        TRACEPARENT.set(traceparent.decode("latin-1") if traceparent else None)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                rid = state.get("request_id")
                value = rid.encode("latin-1", "replace") if rid else incoming
                if value:
                    message["headers"] = [*message.get("headers", []), (b"x-request-id", value)]
            await send(message)

        await self.app(scope, receive, send_with_id)


def create_app(engine: AsyncEngine, settings: ServeConfig, warmup: bool = True) -> FastAPI:
    """The app; its lifespan starts the engine thread (warming up first) and stops it."""
    tracer = None
    if settings.otel_file or settings.otlp_endpoint:
        from latlab.server.tracing import RequestTracer  # the SDK only when asked for

        tracer = RequestTracer(settings.otel_file, settings.otlp_endpoint)
    telemetry = Telemetry(lambda: engine.stats, tracer, engine_settings(engine))
    serving = OpenAIServing(engine, settings, telemetry)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine.start(warmup)
        try:
            yield
        finally:
            engine.stop()
            serving.prompts.close()
            if tracer is not None:
                tracer.shutdown()

    app = FastAPI(title="latlab serve", lifespan=lifespan, docs_url=None, redoc_url=None)
    if settings.allow_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.allow_origins),
                           allow_methods=["GET", "POST"], expose_headers=["x-request-id"],
                           allow_headers=["authorization", "content-type", "x-request-id"])
    app.add_middleware(WholeRequests, max_body_bytes=settings.max_body_bytes)
    app.add_middleware(OriginGuard, allowed=settings.allow_origins)
    app.add_middleware(RequestIdMiddleware)  # added last: the outermost, the earliest stamp
    app.state.engine = engine
    app.state.telemetry = telemetry

    async def check_api_key(request: Request) -> None:
        if settings.api_key is not None:
            check_bearer(request.headers.get("authorization", ""), settings.api_key)

    v1 = APIRouter(prefix="/v1", dependencies=[Depends(check_api_key)])
    v1.add_api_route("/completions", serving.completions, methods=["POST"],
                     response_model=CompletionResponse, responses=ERRORS,
                     openapi_extra=request_body(CompletionRequest))
    v1.add_api_route("/chat/completions", serving.chat, methods=["POST"],
                     response_model=ChatCompletionResponse, responses=ERRORS,
                     openapi_extra=request_body(ChatCompletionRequest))

    @v1.get("/models", response_model=ModelList)
    async def models() -> dict[str, Any]:
        card = ModelCard(id=settings.model_name,
                         max_model_len=engine.info.config.max_model_len)
        return ModelList(data=[card]).model_dump()

    app.include_router(v1)
    install_openapi(app, [CompletionRequest, ChatCompletionRequest],
                    engine.info.model_config.vocab_size)

    @app.get("/health")
    async def health() -> JSONResponse:
        if engine.failed:
            return JSONResponse({"status": "failed", "error": engine.failed}, status_code=503)
        if engine.info.config.idle_unload is None:
            return JSONResponse({"status": "ok"})
        # False after --idle-unload unloaded the model; the next request loads it again.
        return JSONResponse({"status": "ok", "model_loaded": engine.stats.model_loaded})

    @app.get("/ready")
    async def ready() -> JSONResponse:
        if engine.ready.is_set() and not engine.failed:
            return JSONResponse({"status": "ready", "startup_s": engine.startup_s})
        return JSONResponse({"status": "failed" if engine.failed else "warming up"},
                            status_code=503)

    @app.get("/server_info")
    async def server_info() -> dict[str, Any]:
        """The engine's settings as this server resolved them (what advice can rely on)."""
        return {"server": "latlab", "version": __version__, "engine": engine_settings(engine)}

    @app.get("/metrics", response_class=Response, responses=METRICS)
    async def metrics() -> Response:
        return Response(telemetry.render(), media_type="text/plain; version=0.0.4")

    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError) -> JSONResponse:
        if 400 <= e.status < 500 and e.status not in (401, 429):
            telemetry.requests.labels("invalid").inc()
        elif e.status == 500:
            telemetry.requests.labels("error").inc()
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(ClientDisconnect)
    async def client_left(request: Request, e: ClientDisconnect) -> Response:
        log.warning("request %s: the client left before sending the whole body",
                    getattr(request.state, "request_id", "?"))
        telemetry.requests.labels("abort").inc()
        return Response(status_code=499)  # nobody reads it

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, e: RequestValidationError) -> JSONResponse:
        error = e.errors()[0]
        param = ".".join(str(p) for p in error.get("loc", ()) if p != "body") or None
        return await api_error(request, ApiError(400, f"{param}: {error['msg']}", param=param))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException) -> JSONResponse:
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return JSONResponse(ApiError(e.status_code, str(e.detail), type=kind).body(),
                            status_code=e.status_code, headers=e.headers)

    return app


def engine_settings(engine: AsyncEngine) -> dict[str, Any]:
    """The engine's config, resolved (its context and KV pool as the engine sized them)."""
    return engine.info.config.model_dump(mode="json") | {
        "num_kv_blocks": engine.info.num_kv_blocks, "device_type": engine.info.device}
