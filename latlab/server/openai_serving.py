"""`/v1/completions` and `/v1/chat/completions`: admit, read, tokenize, submit, respond.

Timestamps: `received` is taken by the app's outermost middleware (before routing and the
body), so `preprocess` covers reading, validation, the chat template and tokenization. The
body is in before the handler runs (bounded in size and time by `connections`), and only then
does the request take a waiting slot (`--max-waiting`), held until the engine has it: a client
slow to send holds no slot, and a 429 means the queue is full.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from latlab.engine.outputs import RequestOutput
from latlab.records.engine import ServeConfig
from latlab.server.async_engine import (
    AsyncEngine,
    EngineNotReady,
    EngineRequestError,
    QueueFull,
    QueueTimeout,
    RequestFailed,
    RequestStream,
)
from latlab.server.guards import require_json
from latlab.server.prompts import PromptBuilder
from latlab.server.schemas import (
    ApiError,
    AssistantMessage,
    ChatChoice,
    ChatCompletionResponse,
    CompletionChoice,
    CompletionResponse,
    GenerationRequest,
    Usage,
)
from latlab.server.streaming import Api, EngineStreamResponse, StreamEvents, engine_error, usage_of
from latlab.server.telemetry import Telemetry
from latlab.server.timing import server_timing

RETRY_AFTER_MAX_S = 60  # the longest Retry-After OpenAI's Python client honours
# The tenant of a request for fair share (--fair-share): this header, else the `user` field.
TENANT_HEADER = "x-tenant-id"
log = logging.getLogger("latlab.serve")


class OpenAIServing:
    def __init__(self, engine: AsyncEngine, settings: ServeConfig,
                 telemetry: Telemetry) -> None:
        self.engine = engine
        self.settings = settings
        self.telemetry = telemetry
        self.max_model_len = engine.info.config.max_model_len
        self.prompts = PromptBuilder(engine.info.tokenizer, self.max_model_len,
                                     engine.info.model_config.vocab_size)
        self._ignored: set[str] = set()  # unknown request fields already logged

    async def completions(self, request: Request) -> Any:
        received = _begin(request, "completion")
        data = await self._read(request)
        with self._admitted():
            body, ids = await self.prompts.completion(data)
            stream = self._submit(body, ids, body.output_limit or 16, received,
                                  request.headers.get(TENANT_HEADER))
        return await self._respond(request, "completion", body, stream, len(ids))

    async def chat(self, request: Request) -> Any:
        received = _begin(request, "chat")
        data = await self._read(request)
        with self._admitted():
            body, ids = await self.prompts.chat(data)
            stream = self._submit(body, ids, body.output_limit, received,
                                  request.headers.get(TENANT_HEADER))
        return await self._respond(request, "chat", body, stream, len(ids))

    @contextmanager
    def _admitted(self) -> Iterator[None]:
        """A waiting slot from when the body is in until the engine has the request; when
        the queue is full, 429 with the seconds it takes to serve what waits now."""
        try:
            with self.engine.admitting():
                yield
        except QueueFull as e:
            self.telemetry.requests.labels("rejected").inc()
            raise ApiError(429, f"the server is at capacity: {e}", type="rate_limit_error",
                           code="rate_limit_exceeded",
                           headers={"Retry-After": str(retry_after_s(
                               self.engine.num_waiting, self.telemetry.finish_rate()))}
                           ) from None
        except EngineNotReady as e:
            self.telemetry.requests.labels("unavailable").inc()
            raise ApiError(503, str(e), type="service_unavailable",
                           headers={"Retry-After": "1"}) from None

    async def _read(self, request: Request) -> bytes:
        """The body, already whole (`connections.WholeRequests`: bounded in size and time);
        a client that left raises starlette's ClientDisconnect."""
        return await request.body()

    def _submit(self, body: GenerationRequest, ids: list[int], max_tokens: int | None,
                received: int, tenant: str | None) -> RequestStream:
        name = self.settings.model_name
        if body.model is not None and body.model != name:
            raise ApiError(404, f"the model {body.model!r} does not exist; this server serves "
                           f"{name!r}", param="model", code="model_not_found")
        if not ids:
            raise ApiError(400, "the prompt is empty", param="prompt")
        unheard = [name for name in body.ignored if name not in self._ignored]
        if unheard:  # once per field name: the log says what latlab serve did not act on
            self._ignored.update(unheard)
            log.warning("ignored request fields latlab serve does not know: %s",
                        ", ".join(unheard))
        if max_tokens is None:
            max_tokens = max(1, self.max_model_len - len(ids))
        if len(ids) + max_tokens > self.max_model_len:
            raise ApiError(400, f"This model's maximum context length is {self.max_model_len} "
                           f"tokens. However, you requested {len(ids) + max_tokens} tokens "
                           f"({len(ids)} in the prompt, {max_tokens} in the completion).",
                           param="max_tokens", code="context_length_exceeded")
        if body.min_tokens > max_tokens:
            raise ApiError(400, f"min_tokens ({body.min_tokens}) is more than max_tokens "
                           f"({max_tokens})", param="min_tokens",
                           code="min_tokens_above_max_tokens")
        try:
            params = body.sampling_params(max_tokens)
        except ValueError as e:
            raise ApiError(400, str(e)) from None
        return self.engine.submit(ids, params, received_ns=received, priority=body.priority,
                                  tenant=body.user if tenant is None else tenant, admitted=True)

    async def _respond(self, request: Request, api: Api, body: GenerationRequest,
                       stream: RequestStream, num_prompt_tokens: int) -> Any:
        rid = request.state.request_id
        if body.stream and self.engine.info.config.max_queue_delay is not None:
            try:  # hold the response until the request is scheduled: a refusal is still a 503
                await stream.started()
            except (EngineRequestError, EngineNotReady, RequestFailed) as e:
                raise self._refused(e) from None
        if body.stream:
            events = StreamEvents(api, rid, self.settings.model_name, body, stream,
                                  self.telemetry, num_prompt_tokens)
            return EngineStreamResponse(events.sse(), media_type="text/event-stream",
                                        headers={"Cache-Control": "no-cache"})
        return await self._collect(request, api, rid, stream)

    async def _collect(self, request: Request, api: Api, rid: str,
                       stream: RequestStream) -> JSONResponse:
        task = asyncio.ensure_future(_drain(stream))
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            left = not task.done()
            if left:
                task.cancel()
                stream.abort()
                self.telemetry.requests.labels("abort").inc()
        if left:
            return JSONResponse({}, status_code=499)  # nobody is listening any more
        try:
            text, last = task.result()
        except (EngineRequestError, EngineNotReady, RequestFailed) as e:
            raise self._refused(e) from None
        last.times.completed = time.perf_counter_ns()
        self.telemetry.observe_request(rid, last.times, last.num_prompt_tokens,
                                       last.num_output_tokens, str(last.finish_reason),
                                       (last.num_accepted_tokens, last.num_draft_tokens))
        usage = Usage(**usage_of(last))
        reason, name = str(last.finish_reason), self.settings.model_name
        if api == "chat":
            response: Any = ChatCompletionResponse(
                id=rid, model=name, usage=usage, choices=[ChatChoice(
                    message=AssistantMessage(content=text), finish_reason=reason)])
        else:
            response = CompletionResponse(id=rid, model=name, usage=usage, choices=[
                CompletionChoice(text=text, finish_reason=reason)])
        return JSONResponse(response.model_dump(), headers={
            "Server-Timing": server_timing(last.times).to_header()})

    def _refused(self, e: EngineRequestError | EngineNotReady | RequestFailed) -> ApiError:
        if isinstance(e, QueueTimeout):
            self.telemetry.requests.labels("queue_timeout").inc()
        return engine_error(e)


def retry_after_s(waiting: int, finish_rate: float | None) -> int:
    """When to come back after a 429: the seconds it takes to serve the `waiting` requests at
    the rate requests finished lately, 1 to `RETRY_AFTER_MAX_S` (a client told 1 s by a
    server whose queue takes a minute only comes back to be refused again)."""
    if not finish_rate:
        return 1  # nothing has finished yet: no rate to go by
    return max(1, min(RETRY_AFTER_MAX_S, math.ceil(waiting / finish_rate)))


async def _drain(stream: RequestStream) -> tuple[str, RequestOutput]:
    parts, last = [], None
    async for out in stream:
        parts.append(out.text)
        last = out
    return "".join(parts), last


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _begin(request: Request, api: Api) -> int:
    """The receipt stamp (the outermost middleware's, before routing and the body), the
    request id (the client's X-Request-Id, else a new one), and a body that is not JSON
    refused."""
    received = getattr(request.state, "received_ns", None) or time.perf_counter_ns()
    request.state.request_id = (request.headers.get("x-request-id")
                                or f"{'chatcmpl' if api == 'chat' else 'cmpl'}-{uuid.uuid4().hex}")
    require_json(request)
    return received
