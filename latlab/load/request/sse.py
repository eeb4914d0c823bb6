"""Server-sent events of an OpenAI-style stream, parsed as they arrive.

Every read from the socket gets one timestamp, shared by the SSE events it completes:
events that arrive together have a zero gap, which is the truth. A role-only delta, empty
text or a usage-only event is not a token event; a reasoning delta (`reasoning_content`,
`reasoning`) is one, and the first reasoning and first answer token are stamped apart; an event's
token count is the growth of the cumulative per-chunk usage when the server offers it (vLLM's
`continuous_usage_stats`), else 1, or the growth of llama.cpp's cumulative `timings.predicted_n`
(`timings_per_token`). After the first token, an event without text whose cumulative count grew
carries those tokens (a last token that decodes to no text). The last usage seen is the request's,
and the last server timings any event carried (`server_timing.from_event`: latlab's, llama.cpp's).

A stream ends with `data: [DONE]`; one that ends without it after an event with a
`finish_reason` or a usage-only event (`transformers serve` ends so, and OpenAI's schema does
not require [DONE]) is complete all the same, done when that last event arrived
(`without_done` says so); any other end is a broken stream.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

from latlab.load.request.server_timing import from_event, llamacpp_cached
from latlab.records.timeline import Outcome, RequestTimeline, ServerTiming


class StreamFault(Exception):
    """A stream that went wrong: its outcome class and what was seen."""

    def __init__(self, outcome: Outcome, message: str) -> None:
        super().__init__(message)
        self.outcome = outcome


class StreamParser:
    """Turns the bytes of an OpenAI-style SSE stream into token events on a timeline.

    `feed` takes each socket read with its arrival time; `finish` applies the usage and
    server timings and raises `StreamFault` for a stream that ended before its answer did
    (no [DONE], no finish_reason). An event still unfinished past `max_event_bytes` is a
    `too_large` fault: what the parser holds is bounded whatever the server sends."""

    __slots__ = ("r", "chat", "buf", "cumulative_base", "usage", "timing", "cached", "done",
                 "answer_ns", "text", "ended_ns", "last_ns", "without_done", "max_event_bytes")

    def __init__(self, r: RequestTimeline, chat: bool, keep_text: bool = False,
                 max_event_bytes: int | None = None) -> None:
        self.r = r
        self.chat = chat
        self.max_event_bytes = max_event_bytes
        self.answer_ns: int | None = None  # the first token that is not reasoning
        self.text: list[str] | None = [] if keep_text else None  # the answer, when kept
        self.buf = b""
        self.cumulative_base: int | None = None  # usage.completion_tokens at the last token event
        self.usage: dict[str, Any] | None = None
        self.timing: ServerTiming | None = None
        self.cached: int | None = None
        self.done = False
        self.ended_ns: int | None = None  # an event that ends an answer (finish_reason, usage only)
        self.last_ns: int | None = None  # the last event's arrival
        self.without_done = False  # complete, though [DONE] never came

    def feed(self, chunk: bytes, t: int) -> None:
        buf = self.buf + chunk if self.buf else chunk
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        view = memoryview(buf)
        pos = 0
        while (end := buf.find(b"\n\n", pos)) >= 0:
            start, pos = pos, end + 2
            if buf.startswith(b"data: {", start) and buf.find(b"\n", start, end) < 0:
                self._event(view[start + 6:end], t)  # the common case, without a copy
                continue
            data = _data(buf[start:end])
            if data is None:
                continue
            if data.strip() == b"[DONE]":
                self.done, self.r.done_ns = True, t
            elif data[:1] == b"{":
                self._event(data, t)
            else:
                raise StreamFault(Outcome.BAD_PAYLOAD, f"malformed event: {_cut(data)}")
        self.buf = buf[pos:] if pos else buf
        if self.max_event_bytes is not None and len(self.buf) > self.max_event_bytes:
            raise too_large("an SSE event", self.max_event_bytes, "--max-event-mib")

    def _event(self, data: bytes | memoryview, at: int) -> None:
        r = self.r
        self.last_ns = at
        try:
            obj = orjson.loads(data)
            choices = obj.get("choices")
            u = obj.get("usage")
            t = obj.get("timings")
            cumulative = (u.get("completion_tokens") if u
                          else t.get("predicted_n") if t else None)
            reasoning = False
            if choices:
                c = choices[0]
                if c.get("finish_reason"):
                    self.ended_ns = at
                if self.chat:
                    d = c.get("delta")
                    token = d and (d.get("content") or d.get("tool_calls"))
                    if d and not token:
                        token = d.get("reasoning_content") or d.get("reasoning")
                        reasoning = bool(token)
                else:
                    token = c.get("text")
            else:
                token = None
                if u is None and "error" in obj:
                    raise StreamFault(Outcome.STREAM_BROKEN, f"server error event: {_cut(data)}")
                if u:
                    self.ended_ns = at
        except (orjson.JSONDecodeError, AttributeError, TypeError, IndexError):
            raise StreamFault(Outcome.BAD_PAYLOAD, f"malformed event: {_cut(data)}") from None
        if token:
            k = 1
            if cumulative is not None:
                base = self.cumulative_base
                if base is not None:
                    k = cumulative - base if cumulative > base else 1
                elif not r.token_ns and cumulative > 0:
                    k = cumulative
                self.cumulative_base = cumulative
            r.add_token_event(at, k)
            if reasoning:
                if r.first_reasoning_ns is None:
                    r.first_reasoning_ns = at
            else:
                if self.answer_ns is None:
                    self.answer_ns = at
                if self.text is not None and isinstance(token, str):
                    self.text.append(token)
        elif (cumulative is not None and self.cumulative_base is not None
              and cumulative > self.cumulative_base and choices):
            r.add_token_event(at, cumulative - self.cumulative_base)  # tokens without text
            self.cumulative_base = cumulative
        if u:
            self.usage, r.usage_ns = u, at
        if t or u:
            self.timing = from_event(obj) or self.timing
            self.cached = llamacpp_cached(obj) if t else self.cached
        if r.server_request_id is None:
            r.server_request_id = obj.get("id")

    def finish(self) -> None:
        if self.r.first_reasoning_ns is not None:
            self.r.first_answer_ns = self.answer_ns
        if self.usage:
            apply_usage(self.r, self.usage)
        if self.cached is not None and self.r.cached_tokens is None:
            self.r.cached_tokens = self.cached
        if self.timing:
            self.r.server = self.timing
        if self.done:
            return
        if self.ended_ns is not None and not self.buf.strip():
            self.without_done, self.r.done_ns = True, self.last_ns
            return
        raise StreamFault(Outcome.STREAM_BROKEN, "stream ended before [DONE]"
                          + (f" (unparsed: {_cut(self.buf)})" if self.buf.strip()
                             else ", with no finish_reason"))


def too_large(what: str, limit: int, flag: str) -> StreamFault:
    size = f"{limit / (1 << 20):g} MiB" if limit >= 1 << 20 else f"{limit} bytes"
    return StreamFault(Outcome.TOO_LARGE, f"{what} ran past {size} ({flag}): stopped "
                       "reading it")


def _data(event: bytes) -> bytes | None:
    """The data of an SSE event with several lines, comments or fields; None without data."""
    lines = [line[5:] for line in event.split(b"\n") if line[:5] == b"data:"]
    if not lines:
        return None
    return b"\n".join(line[1:] if line[:1] == b" " else line for line in lines)


def apply_usage(r: RequestTimeline, usage: dict[str, Any]) -> None:
    """A usage object's counts: prompt and completion tokens, and the prompt tokens the server
    took from its cache (`prompt_tokens_details.cached_tokens`, OpenAI's, vLLM's, SGLang's,
    llama.cpp's and latlab's; `prompt_cache_hit_tokens`, DeepSeek's)."""
    if not isinstance(usage, dict):
        return
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if isinstance(prompt, int):
        r.prompt_tokens = prompt
    if isinstance(completion, int):
        r.completion_tokens = completion
        r.tokens_from_usage = True
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        r.cached_tokens = details["cached_tokens"]
    elif isinstance(usage.get("prompt_cache_hit_tokens"), int):
        r.cached_tokens = usage["prompt_cache_hit_tokens"]


def _cut(data: bytes | memoryview, limit: int = 200) -> str:
    text = bytes(data).decode("utf-8", "replace")
    return text if len(text) <= limit else text[:limit] + "…"


async def read_at_most(resp: aiohttp.ClientResponse, limit: int,
                       flag: str = "latlab's own cap") -> bytes:
    """`resp`'s whole body, or a `too_large` fault once it runs past `limit` bytes."""
    length = resp.content_length
    if length is not None and length > limit:
        raise too_large("the response", limit, flag)
    body = bytearray()
    async for chunk in resp.content.iter_any():
        body += chunk
        if len(body) > limit:
            raise too_large("the response", limit, flag)
    return bytes(body)
