"""The HTTP side: send one request and fill its `RequestTimeline` as the bytes arrive.

Streams are parsed by `sse.StreamParser` (OpenAI's server-sent events) or
`ollama.NdjsonParser` (Ollama's native API); a non-streamed answer is one event when its
body is complete. `sent` is taken when the connection is ready, just before the request bytes
are written: the connection phases (pool wait, DNS, connect) lie between `scheduled` and
`sent` and are recorded in `connection`; a request that never got a connection has no
`sent`. Every request carries a W3C `traceparent` (its own trace id) and `X-Request-Id`, so
the server's spans and logs join it. A request whose pooled connection turns out closed
before any response byte is sent again once on a fresh connection (llama.cpp closes
connections it called keep-alive): its first attempt's time stays as client wait, and
`retries` counts it. Every failure becomes an outcome class of the record, never an exception.
"""

from __future__ import annotations

import asyncio
import html
import re
import secrets
from dataclasses import dataclass
from time import perf_counter_ns
from typing import Any

import aiohttp
import orjson

from latlab.load.request.connection import connection_trace
from latlab.load.request.ollama import NdjsonParser, ollama_body
from latlab.load.request.server_timing import ServerKind, from_event, from_headers
from latlab.load.request.sse import StreamFault, StreamParser, apply_usage, too_large
from latlab.load.request.stamps import StampingConnector, read_stamped
from latlab.load.workload.requests import RequestSpec
from latlab.records.bench import MAX_EVENT_MIB, MAX_RESPONSE_MIB, MIB
from latlab.records.timeline import Outcome, RequestTimeline

ERROR_BODY_BYTES = 2048
ERROR_MESSAGE_CHARS = 300
_HTML_HIDDEN = re.compile(r"<(head|script|style)\b.*?</\1>", re.I | re.S)
_HTML_TAG = re.compile(r"<[^>]+>")
STALE = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, ConnectionResetError)


@dataclass(frozen=True)
class Route:
    path: str
    chat: bool
    ollama: bool = False


ROUTES = {"completions": Route("/v1/completions", False),
          "chat": Route("/v1/chat/completions", True),
          "ollama": Route("/api/generate", False, True),
          "ollama-chat": Route("/api/chat", True, True)}


class Client:
    """One aiohttp session with a pool of `pool_size` connections (0: unbounded); without
    `keepalive` every request opens its own connection. A response is read up to
    `max_response_bytes`, an event of it up to `max_event_bytes` (else `too_large`): what
    one request holds is bounded whatever the server sends."""

    def __init__(self, url: str, model: str, api: str = "completions", *,
                 api_key: str | None = None, pool_size: int = 0, timeout_s: float = 600.0,
                 ignore_eos: bool = True, continuous_usage: bool = True, stream: bool = True,
                 keepalive: bool = True, kind: ServerKind = ServerKind.AUTO,
                 max_event_bytes: int = int(MAX_EVENT_MIB * MIB),
                 max_response_bytes: int = int(MAX_RESPONSE_MIB * MIB)) -> None:
        self.route = ROUTES[api]
        self.max_event_bytes, self.max_response_bytes = max_event_bytes, max_response_bytes
        self.url = url.rstrip("/") + self.route.path
        self.model = model
        self.ignore_eos, self.stream, self.keepalive, self.kind = (ignore_eos, stream,
                                                                   keepalive, kind)
        self.stream_options = {"include_usage": True}
        if continuous_usage:
            self.stream_options["continuous_usage_stats"] = True
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self._pool_size = pool_size
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._fresh: aiohttp.ClientSession | None = None  # one connection per request

    def _new_session(self, keepalive: bool) -> aiohttp.ClientSession:
        connector = StampingConnector(limit=self._pool_size, limit_per_host=0,
                                         ttl_dns_cache=300, force_close=not keepalive)
        return aiohttp.ClientSession(connector=connector, timeout=self._timeout,
                                     trace_configs=[connection_trace()],
                                     skip_auto_headers=("User-Agent",))

    async def __aenter__(self) -> Client:
        self._session = self._new_session(self.keepalive)
        return self

    async def __aexit__(self, *exc: object) -> None:
        for session in (self._session, self._fresh):
            if session is not None:
                await session.close()

    def body(self, spec: RequestSpec) -> dict[str, Any]:
        if self.route.ollama:
            return ollama_body(self.model, spec, self.stream)
        body: dict[str, Any] = {"model": self.model, "stream": self.stream,
                                "max_tokens": spec.max_tokens}
        if self.stream:
            body["stream_options"] = self.stream_options
            if self.kind == ServerKind.LLAMACPP:
                body["timings_per_token"] = True  # tokens per chunk, from predicted_n
        if self.route.chat:
            body["messages"] = spec.messages
        else:
            body["prompt"] = spec.prompt
        if self.ignore_eos:
            body["ignore_eos"] = True
            body["min_tokens"] = spec.max_tokens
        if spec.tenant is not None:
            body["user"] = spec.tenant
        if spec.priority is not None:
            body["priority"] = spec.priority
        return body

    async def send(self, spec: RequestSpec, r: RequestTimeline) -> str | None:
        """Send `spec` and record everything in `r`; never raises but for cancellation.
        A session's request (`spec.session`) returns the answer's text (to carry into the
        next turn), others None."""
        data = orjson.dumps(self.body(spec))
        r.trace_id = secrets.token_hex(16)
        headers = self.headers | {"X-Request-Id": r.id,
                                  "traceparent": f"00-{r.trace_id}-{secrets.token_hex(8)}-01"}
        session = self._session
        keep = spec.session is not None
        answer = None
        try:
            while True:
                try:
                    answer = await self._attempt(session, data, headers, r, keep)
                    if r.ok and not r.token_ns and r.completion_tokens is None:
                        r.outcome, r.error = Outcome.EMPTY, "HTTP 200 without a token or usage"
                    break
                except STALE:
                    if not _stale(r) or r.retries:
                        raise
                    r.retries += 1
                    r.sent_ns = r.connection = None
                    session = self._fresh = self._fresh or self._new_session(False)
        except asyncio.CancelledError:
            r.outcome, r.error = Outcome.CANCELLED, "cancelled before the response ended"
            raise
        except StreamFault as e:
            r.outcome, r.error = e.outcome, str(e)
        except Exception as e:  # every failure becomes a classified record
            r.outcome, r.error = _classify(e, r.headers_ns is not None), describe(e)
        finally:
            if r.done_ns is None or not r.ok:
                r.done_ns = perf_counter_ns()
        return answer

    async def _attempt(self, session: aiohttp.ClientSession, data: bytes,
                       headers: dict[str, str], r: RequestTimeline, keep: bool) -> str | None:
        async with session.post(self.url, data=data, headers=headers,
                                trace_request_ctx=r) as resp:
            r.headers_ns = perf_counter_ns()
            r.status = resp.status
            r.server_request_id = resp.headers.get("X-Request-Id")
            r.server = from_headers(resp.headers)
            content_type = resp.content_type
            if resp.status != 200:
                await self._http_error(resp, r)
            elif not self.stream:
                return await self._read_body(resp, r)
            elif self.route.ollama or content_type.startswith("text/event-stream"):
                return await self._read_stream(resp, r, keep)
            else:
                r.outcome = Outcome.BAD_PAYLOAD
                r.error = f"not a stream: Content-Type {content_type!r}"
        return None

    async def _http_error(self, resp: aiohttp.ClientResponse, r: RequestTimeline) -> None:
        status = resp.status
        if status == 429:
            r.outcome = Outcome.HTTP_429
        elif status >= 500:
            r.outcome = Outcome.HTTP_5XX
        else:
            r.outcome = Outcome.HTTP_4XX
        body = error_message(await resp.content.read(ERROR_BODY_BYTES))
        r.error = f"HTTP {status} {resp.reason or ''}".rstrip() + (f": {body}" if body else "")

    async def _read_stream(self, resp: aiohttp.ClientResponse, r: RequestTimeline,
                           keep: bool) -> str | None:
        parser = (NdjsonParser if self.route.ollama else StreamParser)(
            r, self.route.chat, keep, self.max_event_bytes)
        limit, received = self.max_response_bytes, 0

        def feed(piece: bytes, t: int) -> None:
            nonlocal received
            received += len(piece)
            if received > limit:
                raise too_large("the response", limit, "--max-response-mib")
            parser.feed(piece, t)

        await read_stamped(resp, feed)
        parser.finish()
        return "".join(parser.text) if parser.text is not None else None

    async def _read_body(self, resp: aiohttp.ClientResponse, r: RequestTimeline) -> str | None:
        """A non-streamed answer: one event, when the whole body has arrived."""
        raw = await read_at_most(resp, self.max_response_bytes, "--max-response-mib")
        t = perf_counter_ns()
        try:
            obj = orjson.loads(raw)
            usage = obj.get("usage") or {}
        except (orjson.JSONDecodeError, AttributeError):
            raise StreamFault(Outcome.BAD_PAYLOAD, f"not a JSON body: {raw[:200]!r}") from None
        apply_usage(r, usage)
        r.server = from_event(obj) or r.server
        r.add_token_event(t, max(r.completion_tokens or 1, 1))
        r.usage_ns = r.done_ns = t
        return answer_text(obj)


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


def answer_text(body: dict[str, Any]) -> str | None:
    """The answer of a non-streamed response: its first choice's text or message content
    (Ollama's: `response`, `message.content`)."""
    choices = body.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    if isinstance(first, dict):
        text = first.get("text") or (first.get("message") or {}).get("content")
    else:
        text = body.get("response") or (body.get("message") or {}).get("content")
    return text if isinstance(text, str) else None


def error_message(body: bytes, limit: int = ERROR_MESSAGE_CHARS) -> str:
    """An error response in one short line: the message of a JSON error (OpenAI's
    `error.message`, TGI's `error`, FastAPI's `detail`), the visible text of an HTML page's
    body, else the text itself; whitespace collapsed, cut at `limit` characters."""
    text = body.decode("utf-8", "replace").strip()
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        obj = None
    if isinstance(obj, dict):
        inner = obj.get("error")
        found = (inner.get("message") if isinstance(inner, dict) else inner) or \
            obj.get("message") or obj.get("detail")
        text = found if isinstance(found, str) else text
    elif text.lstrip().startswith("<"):
        text = html.unescape(_HTML_TAG.sub(" ", _HTML_HIDDEN.sub(" ", text)))
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _stale(r: RequestTimeline) -> bool:
    """Whether `r` failed on a reused connection before any response byte arrived."""
    return r.headers_ns is None and r.connection is not None and not r.connection.new


def _classify(e: Exception, after_headers: bool) -> Outcome:
    if isinstance(e, asyncio.TimeoutError):
        return Outcome.TIMEOUT
    if isinstance(e, aiohttp.ClientConnectorError):
        return Outcome.CONNECTION_REFUSED
    if isinstance(e, aiohttp.ClientPayloadError):
        return Outcome.STREAM_BROKEN
    if isinstance(e, (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, ConnectionError)):
        return Outcome.STREAM_BROKEN if after_headers else Outcome.CONNECTION_RESET
    if isinstance(e, aiohttp.ClientResponseError):
        return Outcome.BAD_PAYLOAD
    return Outcome.CLIENT_ERROR


def describe(e: Exception) -> str:
    """An exception in one line: its class and message."""
    text = str(e) or repr(e)
    return f"{type(e).__name__}: {text}"
