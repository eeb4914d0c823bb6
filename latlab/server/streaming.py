"""Server-sent events of a streamed completion or chat completion.

One event per engine step that adds text (an event may carry several tokens when text was
held back); the events of the steps that came while the response was writing go out in one
write. Chat streams open with a role-only delta; with `stream_options.include_usage` a final
event carries `usage` and the `server_timing` object; `continuous_usage_stats` puts the
cumulative usage in every event. The stream ends with `data: [DONE]`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any, Literal

import orjson
from fastapi.responses import StreamingResponse

from latlab.engine.outputs import RequestOutput
from latlab.server.async_engine import (
    EngineNotReady,
    EngineRequestError,
    QueueTimeout,
    RequestFailed,
    RequestStream,
)
from latlab.server.schemas import ApiError, GenerationRequest, Usage
from latlab.server.telemetry import Telemetry
from latlab.server.timing import server_timing

Api = Literal["completion", "chat"]


class EngineStreamResponse(StreamingResponse):
    """Closes its generator however the response ends, so a disconnect aborts the request."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()


class StreamEvents:
    """The SSE events of one streamed response: one per engine step that adds text."""

    def __init__(self, api: Api, rid: str, model: str, body: GenerationRequest,
                 stream: RequestStream, telemetry: Telemetry, num_prompt_tokens: int) -> None:
        self.api, self.stream, self.telemetry = api, stream, telemetry
        self.num_prompt_tokens = num_prompt_tokens
        self.include_usage, self.continuous = body.include_usage, body.continuous_usage
        self.head = {"id": rid,
                     "object": "chat.completion.chunk" if api == "chat" else "text_completion",
                     "created": int(time.time()), "model": model}

    async def sse(self) -> AsyncIterator[bytes]:
        try:
            if self.api == "chat":
                yield self._chunk({"role": "assistant"}, None, 0)
            previous_ns = last = None
            async for out in self.stream:
                events, error = [], None
                while out is not None:  # and the outputs queued meanwhile: one write
                    if previous_ns is not None:
                        self.telemetry.itl.observe((out.token_time_ns - previous_ns) / 1e9)
                    previous_ns, last = out.token_time_ns, out
                    if out.text or out.finished:
                        events.append(self._event(out))
                    try:
                        out = self.stream.next_ready()
                    except (EngineRequestError, EngineNotReady, RequestFailed) as e:
                        error, out = e, None  # after the text before it
                if events:
                    yield b"".join(events)
                if error is not None:
                    raise error
            last.times.completed = time.perf_counter_ns()
            if self.include_usage:
                yield _sse({**self.head, "choices": [], "usage": usage_of(last),
                            "server_timing": server_timing(last.times).to_json()})
            yield b"data: [DONE]\n\n"
            self.telemetry.observe_request(self.head["id"], last.times,
                                           last.num_prompt_tokens, last.num_output_tokens,
                                           str(last.finish_reason),
                                           (last.num_accepted_tokens, last.num_draft_tokens))
        except (EngineRequestError, EngineNotReady, RequestFailed) as e:
            if isinstance(e, RequestFailed):
                self.telemetry.requests.labels("error").inc()
            yield _sse(engine_error(e).body())
            yield b"data: [DONE]\n\n"
        finally:
            if not self.stream.finished:
                self.stream.abort()
                self.telemetry.requests.labels("abort").inc()

    def _event(self, out: RequestOutput) -> bytes:
        reason = str(out.finish_reason) if out.finished else None
        content = ({"content": out.text} if out.text else {}) if self.api == "chat" else out.text
        return self._chunk(content, reason, out.num_output_tokens)

    def _chunk(self, content: dict[str, str] | str, finish_reason: str | None,
               completion_tokens: int) -> bytes:
        """A chunk with a chat `delta` or a completion `text`; cumulative usage if asked."""
        choice = {"index": 0, "delta" if self.api == "chat" else "text": content,
                  "logprobs": None, "finish_reason": finish_reason}
        chunk = {**self.head, "choices": [choice]}
        if self.continuous:
            chunk["usage"] = {"prompt_tokens": self.num_prompt_tokens,
                              "completion_tokens": completion_tokens,
                              "total_tokens": self.num_prompt_tokens + completion_tokens}
        return _sse(chunk)


def engine_error(e: EngineRequestError | EngineNotReady | RequestFailed) -> ApiError:
    if isinstance(e, EngineRequestError):
        return ApiError(400, str(e))
    if isinstance(e, RequestFailed):
        return ApiError(500, f"the engine failed this request: {e}", type="server_error")
    if isinstance(e, QueueTimeout):
        return ApiError(503, str(e), type="service_unavailable", code="queue_timeout",
                        headers={"Retry-After": str(e.retry_after_s)})
    return ApiError(503, str(e), type="service_unavailable")


def usage_of(out: RequestOutput) -> dict[str, Any]:
    """OpenAI's usage; with speculative decoding, the drafts accepted and rejected in
    `completion_tokens_details` (OpenAI's fields for predicted outputs)."""
    usage = Usage.of(out.num_prompt_tokens, out.num_output_tokens,
                     out.num_cached_tokens).model_dump(exclude_none=True)
    if out.num_draft_tokens:
        usage["completion_tokens_details"] = {
            "accepted_prediction_tokens": out.num_accepted_tokens,
            "rejected_prediction_tokens": out.num_draft_tokens - out.num_accepted_tokens}
    return usage


def _sse(data: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"
