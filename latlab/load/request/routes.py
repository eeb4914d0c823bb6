"""The APIs a request can go to (`--api`): each route's path, the body it sends and the parser
that reads its stream. OpenAI's completions and chat (server-sent events), Ollama's native
generate and chat (`ollama`: one JSON object per line) and SGLang's native `/generate`
(`sglang`: server-sent events of its own objects).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from latlab.load.request.config import ClientConfig
from latlab.load.request.ollama import NdjsonParser, ollama_body
from latlab.load.request.sglang import SglangParser, sglang_body
from latlab.load.request.sse import StreamParser
from latlab.load.workload.requests import RequestSpec
from latlab.records.target import ServerKind
from latlab.records.timeline import RequestTimeline
from latlab.records.workload import Api

USAGE = {"include_usage": True}
CONTINUOUS_USAGE = {"include_usage": True, "continuous_usage_stats": True}

class StreamReader(Protocol):
    """Turns a stream's bytes into token events on a timeline: `feed` each socket read with
    its arrival time, then `finish` (which raises `sse.StreamFault` for a broken stream)."""

    text: list[str] | None  # the answer's pieces, when kept
    without_done: bool  # complete, though the stream's end marker never came

    def feed(self, chunk: bytes, t: int) -> None: ...

    def finish(self) -> None: ...


BodyBuilder = Callable[[RequestSpec, str, ClientConfig], dict[str, Any]]
ParserFactory = Callable[[RequestTimeline, bool, bool, "int | None"], StreamReader]


@dataclass(frozen=True)
class Route:
    """One API: its path, whether it takes messages (chat) or a prompt, how its body is built
    (from the request, the model and the client's config) and which parser reads its stream
    (built with the timeline, `chat`, whether to keep the text and the event cap)."""

    path: str
    chat: bool
    body: BodyBuilder
    parser: ParserFactory
    event_stream: bool = True  # its streams must be text/event-stream (NDJSON's need not)


def openai_body(spec: RequestSpec, model: str, config: ClientConfig, chat: bool
                ) -> dict[str, Any]:
    """OpenAI's completions (`prompt`) or chat (`messages`) body, with the fields latlab adds
    where a server takes them (`ignore_eos`, `min_tokens`, cumulative usage per chunk,
    llama.cpp's `timings_per_token`)."""
    body: dict[str, Any] = {"model": model, "stream": config.stream,
                            "max_tokens": spec.max_tokens}
    if config.stream:
        body["stream_options"] = CONTINUOUS_USAGE if config.continuous_usage else USAGE
        if config.kind == ServerKind.LLAMACPP:
            body["timings_per_token"] = True  # tokens per chunk, from predicted_n
    if chat:
        body["messages"] = spec.messages
    else:
        body["prompt"] = spec.prompt
    if config.ignore_eos:
        body["ignore_eos"] = True
        body["min_tokens"] = spec.max_tokens
    if spec.tenant is not None:
        body["user"] = spec.tenant
    if spec.priority is not None:
        body["priority"] = spec.priority
    return body


def completions_body(spec: RequestSpec, model: str, config: ClientConfig) -> dict[str, Any]:
    return openai_body(spec, model, config, chat=False)


def chat_body(spec: RequestSpec, model: str, config: ClientConfig) -> dict[str, Any]:
    return openai_body(spec, model, config, chat=True)


ROUTES: dict[Api, Route] = {
    "completions": Route("/v1/completions", False, completions_body, StreamParser),
    "chat": Route("/v1/chat/completions", True, chat_body, StreamParser),
    "ollama": Route("/api/generate", False, ollama_body, NdjsonParser, event_stream=False),
    "ollama-chat": Route("/api/chat", True, ollama_body, NdjsonParser, event_stream=False),
    "sglang": Route("/generate", False, sglang_body, SglangParser),
}
