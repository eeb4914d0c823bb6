"""Ollama's native API (`/api/generate`, `/api/chat`): the request body and its stream, one
JSON object per line, the last with `done: true` and the server's durations (ns): model load,
prompt evaluation (prefill), evaluation (decode) and the total (`server_timing.ollama`).
Ollama cannot ignore the end of sequence: `num_predict` caps the output, it does not hold it.
"""

from __future__ import annotations

from typing import Any

import orjson

from latlab.load.request.config import ClientConfig
from latlab.load.request.server_timing import ollama
from latlab.load.request.sse import StreamFault, too_large
from latlab.load.workload.requests import RequestSpec
from latlab.records.timeline import Outcome, RequestTimeline


def ollama_body(spec: RequestSpec, model: str, config: ClientConfig) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "stream": config.stream,
                            "options": {"num_predict": spec.max_tokens}}
    if spec.messages is not None:
        body["messages"] = spec.messages
    else:
        body["prompt"] = spec.prompt
        body["raw"] = True  # the prompt as given, no template around it
    return body


class NdjsonParser:
    """Turns an Ollama stream into token events on a timeline (the interface of
    `sse.StreamParser`: `feed` each socket read with its arrival time, then `finish`)."""

    __slots__ = ("r", "chat", "buf", "final", "text", "max_event_bytes")
    without_done = False  # the final object ends an NDJSON stream: no end marker to miss

    def __init__(self, r: RequestTimeline, chat: bool, keep_text: bool = False,
                 max_event_bytes: int | None = None) -> None:
        self.r, self.chat, self.max_event_bytes = r, chat, max_event_bytes
        self.buf = b""
        self.text: list[str] | None = [] if keep_text else None
        self.final: dict[str, Any] | None = None

    def feed(self, chunk: bytes, t: int) -> None:
        buf = self.buf + chunk if self.buf else chunk
        *lines, self.buf = buf.split(b"\n")
        for line in lines:
            if line.strip():
                self._line(line, t)
        if self.max_event_bytes is not None and len(self.buf) > self.max_event_bytes:
            raise too_large("a line of the stream", self.max_event_bytes, "--max-event-mib")

    def _line(self, line: bytes, t: int) -> None:
        try:
            obj = orjson.loads(line)
            text = (obj.get("message") or {}).get("content") if self.chat else obj.get("response")
        except (orjson.JSONDecodeError, AttributeError):
            raise StreamFault(Outcome.BAD_PAYLOAD, f"malformed line: {line[:200]!r}") from None
        if "error" in obj:
            raise StreamFault(Outcome.STREAM_BROKEN, f"server error: {obj['error']}")
        if text:
            self.r.add_token_event(t)
            if self.text is not None:
                self.text.append(text)
        if obj.get("done"):
            self.final, self.r.usage_ns, self.r.done_ns = obj, t, t

    def finish(self) -> None:
        if self.buf.strip():
            self._line(self.buf, self.r.last_token_ns or 0)
        final = self.final
        if final is None:
            raise StreamFault(Outcome.STREAM_BROKEN, "stream ended before its final object")
        r = self.r
        if isinstance(final.get("prompt_eval_count"), int):
            r.prompt_tokens = final["prompt_eval_count"]
        if isinstance(final.get("eval_count"), int):
            r.completion_tokens, r.tokens_from_usage = final["eval_count"], True
        r.server = ollama(final)
