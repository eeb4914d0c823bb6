"""SGLang's native API (`/generate`): the request body and its stream, server-sent events of
`{"text", "output_ids", "meta_info"}` ending in `data: [DONE]`.

`meta_info` carries, in every event, the completion tokens so far (an event's tokens are their
growth) and, once the request finished, its `finish_reason`, prompt, cached and completion
tokens and the server's durations (`server_timing.sglang`). `text` is the whole answer so far
(or, with `--incremental-streaming-output`, each event's piece: both are read).
"""

from __future__ import annotations

from typing import Any

import orjson

from latlab.load.request.config import ClientConfig
from latlab.load.request.server_timing import sglang
from latlab.load.request.sse import StreamFault, StreamParser, _cut
from latlab.load.workload.requests import RequestSpec
from latlab.records.timeline import Outcome, RequestTimeline


def sglang_body(spec: RequestSpec, model: str, config: ClientConfig) -> dict[str, Any]:
    """SGLang's `/generate` body (it serves one model: `model` is not sent)."""
    params: dict[str, Any] = {"max_new_tokens": spec.max_tokens}
    if config.ignore_eos:
        params |= {"ignore_eos": True, "min_new_tokens": spec.max_tokens}
    body: dict[str, Any] = {"text": spec.prompt, "sampling_params": params,
                            "stream": config.stream}
    if spec.priority is not None:
        body["priority"] = spec.priority
    return body


def usage(meta: dict[str, Any]) -> dict[str, Any]:
    """`meta_info`'s token counts as an OpenAI usage object."""
    return {"prompt_tokens": meta.get("prompt_tokens"),
            "completion_tokens": meta.get("completion_tokens"),
            "prompt_tokens_details": {"cached_tokens": meta.get("cached_tokens")}}


class SglangParser(StreamParser):
    """`sse.StreamParser`'s framing and end, SGLang's events."""

    __slots__ = ("answer",)

    def __init__(self, r: RequestTimeline, chat: bool, keep_text: bool = False,
                 max_event_bytes: int | None = None) -> None:
        super().__init__(r, chat, keep_text, max_event_bytes)
        self.answer = ""

    def _event(self, data: bytes | memoryview, at: int) -> None:
        r = self.r
        self.last_ns = at
        try:
            obj = orjson.loads(data)
            meta = obj.get("meta_info") or {}
            count = meta.get("completion_tokens")
            text = obj.get("text")
        except (orjson.JSONDecodeError, AttributeError):
            raise StreamFault(Outcome.BAD_PAYLOAD, f"malformed event: {_cut(data)}") from None
        if "error" in obj:
            raise StreamFault(Outcome.STREAM_BROKEN, f"server error event: {_cut(data)}")
        base = self.cumulative_base or 0
        if isinstance(count, int) and count > base:
            r.add_token_event(at, count - base)
            self.cumulative_base = count
        if isinstance(text, str) and self.text is not None:
            self.answer = text if text.startswith(self.answer) else self.answer + text
            self.text[:] = [self.answer]
        if r.server_request_id is None and isinstance(meta.get("id"), str):
            r.server_request_id = meta["id"]
        if meta.get("finish_reason") is not None:
            self.ended_ns = r.usage_ns = at
            self.usage, self.timing = usage(meta), sglang(meta)
