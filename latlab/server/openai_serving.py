"""`/v1/completions` and `/v1/chat/completions`: parse, tokenize, submit, stream or collect.

Timestamps: `received` is taken when the handler starts (before the body is read), so
`preprocess` covers reading, validation, the chat template and tokenization.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from latlab.engine.engine import RequestOutput
from latlab.server.async_engine import (AsyncEngine, EngineNotReady, EngineRequestError,
                                        QueueFull, RequestStream)
from latlab.server.schemas import (ApiError, AssistantMessage, ChatChoice,
                                   ChatCompletionRequest, ChatCompletionResponse,
                                   CompletionChoice, CompletionRequest, CompletionResponse,
                                   GenerationRequest, Usage)
from latlab.server.streaming import (Api, EngineStreamResponse, StreamEvents, engine_error,
                                     usage_of)
from latlab.server.telemetry import Telemetry
from latlab.server.timing import server_timing


@dataclass
class ServerSettings:
    served_model_name: str
    api_key: str | None = None
    max_body_bytes: int = 4 << 20
    otel_file: Path | None = None
    otlp_endpoint: str | None = None


class OpenAIServing:
    def __init__(self, engine: AsyncEngine, settings: ServerSettings,
                 telemetry: Telemetry) -> None:
        self.engine = engine
        self.settings = settings
        self.telemetry = telemetry
        self.tokenizer = engine.engine.tokenizer
        self.max_model_len = engine.engine.config.max_model_len
        self.vocab_size = engine.engine.model_config.vocab_size

    async def completions(self, request: Request) -> Any:
        received = _begin(request, "completion")
        body = await self._read(request, CompletionRequest)
        prompt = body.prompt
        if prompt and isinstance(prompt[0], (list, str)) and not isinstance(prompt, str):
            if len(prompt) != 1:
                raise ApiError(400, "latlab serve takes one prompt per request", param="prompt")
            prompt = prompt[0]
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if any(not 0 <= t < self.vocab_size for t in ids):
            raise ApiError(400, f"prompt token ids must be in [0, {self.vocab_size})",
                           param="prompt")
        return await self._serve(request, "completion", body, ids, body.max_tokens or 16,
                                 received)

    async def chat(self, request: Request) -> Any:
        received = _begin(request, "chat")
        body = await self._read(request, ChatCompletionRequest)
        messages = [{"role": m.role, "content": m.text} for m in body.messages]
        try:
            prompt = self.tokenizer.apply_chat_template(messages)
        except jinja2.TemplateError as e:
            raise ApiError(400, f"the model's chat template rejects these messages: {e}",
                           param="messages") from None
        ids = self.tokenizer.encode(prompt)
        max_tokens = body.max_completion_tokens or body.max_tokens
        return await self._serve(request, "chat", body, ids, max_tokens, received)

    async def _read(self, request: Request, model: type[BaseModel]) -> Any:
        limit = self.settings.max_body_bytes
        too_large = ApiError(413, f"the request body is larger than {limit} bytes",
                             code="request_too_large")
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:
            raise too_large
        data = bytearray()
        async for chunk in request.stream():
            data += chunk
            if len(data) > limit:
                raise too_large
        try:
            return model.model_validate_json(bytes(data))
        except ValidationError as e:
            raise _invalid(e) from None

    async def _serve(self, request: Request, api: Api, body: GenerationRequest,
                     ids: list[int], max_tokens: int | None, received: int) -> Any:
        name = self.settings.served_model_name
        if body.model is not None and body.model != name:
            raise ApiError(404, f"the model {body.model!r} does not exist; this server serves "
                           f"{name!r}", param="model", code="model_not_found")
        if not ids:
            raise ApiError(400, "the prompt is empty", param="prompt")
        if max_tokens is None:
            max_tokens = max(1, self.max_model_len - len(ids))
        if len(ids) + max_tokens > self.max_model_len:
            raise ApiError(400, f"This model's maximum context length is {self.max_model_len} "
                           f"tokens. However, you requested {len(ids) + max_tokens} tokens "
                           f"({len(ids)} in the prompt, {max_tokens} in the completion).",
                           param="max_tokens", code="context_length_exceeded")
        try:
            params = body.sampling_params(max_tokens)
        except ValueError as e:
            raise ApiError(400, str(e)) from None
        try:
            stream = self.engine.submit(ids, params, received_ns=received,
                                        priority=body.priority, tenant=body.user)
        except QueueFull as e:
            self.telemetry.requests.labels("rejected").inc()
            raise ApiError(429, f"the server is at capacity: {e}", type="rate_limit_error",
                           code="rate_limit_exceeded", headers={"Retry-After": "1"}) from None
        except EngineNotReady as e:
            self.telemetry.requests.labels("unavailable").inc()
            raise ApiError(503, str(e), type="service_unavailable",
                           headers={"Retry-After": "1"}) from None
        rid = request.state.request_id
        if body.stream:
            events = StreamEvents(api, rid, name, body, stream, self.telemetry, len(ids))
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
            if not task.done():
                task.cancel()
                stream.abort()
                self.telemetry.requests.labels("abort").inc()
        if task.cancelled():
            return JSONResponse({}, status_code=499)  # nobody is listening any more
        try:
            text, last = task.result()
        except (EngineRequestError, EngineNotReady) as e:
            raise engine_error(e) from None
        last.times.completed = time.perf_counter_ns()
        self.telemetry.observe_request(rid, last.times, last.num_prompt_tokens,
                                       last.num_output_tokens, str(last.finish_reason))
        usage = Usage(**usage_of(last))
        reason, name = str(last.finish_reason), self.settings.served_model_name
        if api == "chat":
            response: Any = ChatCompletionResponse(
                id=rid, model=name, usage=usage, choices=[ChatChoice(
                    message=AssistantMessage(content=text), finish_reason=reason)])
        else:
            response = CompletionResponse(id=rid, model=name, usage=usage, choices=[
                CompletionChoice(text=text, finish_reason=reason)])
        return JSONResponse(response.model_dump(), headers={
            "Server-Timing": server_timing(last.times).to_header()})


def _invalid(e: ValidationError) -> ApiError:
    """A 400 naming the first bad field; for a field of several types, the types it takes."""
    errors = e.errors(include_url=False)
    first = errors[0]
    if first["type"] == "json_invalid":
        return ApiError(400, f"the body is not valid JSON: {first['msg']}")
    loc = [p for p in first["loc"] if not _is_type_tag(p)]
    param = ".".join(map(str, loc)) or None
    tags = [str(err["loc"][len(loc)]) for err in errors
            if len(err["loc"]) > len(loc) and list(err["loc"][: len(loc)]) == loc
            and _is_type_tag(err["loc"][len(loc)])]
    if len(tags) > 1:
        message = (f"{type(first['input']).__name__} is not accepted; "
                   f"it takes {', '.join(dict.fromkeys(tags))}")
    else:
        message = first["msg"].removeprefix("Value error, ")
    return ApiError(400, f"{param}: {message}" if param else message, param=param)


def _is_type_tag(part: object) -> bool:
    """Pydantic's name for one branch of a union in an error location (`str`, `list[int]`)."""
    return isinstance(part, str) and (part in ("str", "int", "float", "bool") or "[" in part)


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
    """The receipt stamp (the outermost middleware's) and the request id: the client's
    X-Request-Id, else a new one."""
    received = getattr(request.state, "received_ns", None) or time.perf_counter_ns()
    request.state.request_id = (request.headers.get("x-request-id")
                                or f"{'chatcmpl' if api == 'chat' else 'cmpl'}-{uuid.uuid4().hex}")
    return received
