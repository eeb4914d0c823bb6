"""The HTTP side: send one request and fill its `RequestTimeline` as the bytes arrive.

The API's `routes.Route` builds the body and names the parser of its stream (OpenAI's
server-sent events, Ollama's NDJSON, SGLang's events); a non-streamed answer is one event when
its body is complete. `sent` is
taken when the connection is ready, just before the request bytes are written: the
connection phases (pool wait, DNS, connect) lie between `scheduled` and `sent` and are
recorded in `connection`; a request that never got a connection has no `sent`. Every
request carries a W3C `traceparent` (its own trace id) and `X-Request-Id`, so the server's
spans and logs join it. A request whose pooled connection turns out closed before any
response byte is sent again once on a fresh connection (llama.cpp closes connections it
called keep-alive): its first attempt's time stays as client wait, and `retries` counts it.
A 400/422 that names latlab's nonstandard fields drops them for the run and sends the
request again without them (`fields`). Every failure becomes an outcome class of the
record, never an exception.
"""

from __future__ import annotations

import asyncio
import secrets
from time import perf_counter_ns
from typing import Any

import aiohttp
import orjson

from latlab.load.request.config import ClientConfig
from latlab.load.request.connection import connection_trace
from latlab.load.request.errors import classify, describe, error_message
from latlab.load.request.fields import Adaptations, refused_fields, without
from latlab.load.request.routes import ROUTES
from latlab.load.request.server_timing import from_event, from_headers
from latlab.load.request.sglang import usage as sglang_usage
from latlab.load.request.sse import StreamFault, apply_usage, read_at_most, too_large
from latlab.load.request.stamps import StampingConnector, read_stamped
from latlab.load.request.tls import for_aiohttp, ssl_context
from latlab.load.target import gateway
from latlab.load.workload.requests import RequestSpec
from latlab.records.timeline import Outcome, RequestTimeline

ERROR_BODY_BYTES = 2048
ERROR_NOTE_CHARS = 160
STALE = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, ConnectionResetError)


class Refused(Exception):
    """A 400/422 answer that named `fields` of latlab's the server does not take."""

    def __init__(self, fields: list[str], message: str) -> None:
        super().__init__(message)
        self.fields, self.message = fields, message


class Client:
    """One aiohttp session asking `model` at `url` as `config` says: a pool of
    `config.pool_size` connections (0: unbounded), or without `keepalive` one connection per
    request. A response is read up to `max_response_bytes`, an event of it up to
    `max_event_bytes` (else `too_large`): what one request holds is bounded whatever the
    server sends."""

    def __init__(self, url: str, model: str, config: ClientConfig) -> None:
        self.config = config
        self.route = ROUTES[config.api]
        self.url = url.rstrip("/") + self.route.path
        self.model = model
        self.headers = {"Content-Type": "application/json"}
        if config.api_key:
            self.headers["Authorization"] = f"Bearer {config.api_key}"
        self._timeout = aiohttp.ClientTimeout(total=config.timeout_s)
        self._ssl = for_aiohttp(ssl_context(config.ca_cert, config.insecure))
        self._session: aiohttp.ClientSession | None = None
        self._fresh: aiohttp.ClientSession | None = None  # one connection per request
        self.learned = Adaptations()  # fields the server refused, streams without [DONE]
        self._answered = False  # whether an answer's headers were looked at for a gateway

    def _new_session(self, keepalive: bool) -> aiohttp.ClientSession:
        connector = StampingConnector(limit=self.config.pool_size, limit_per_host=0,
                                      ttl_dns_cache=300, force_close=not keepalive,
                                      ssl=self._ssl)
        return aiohttp.ClientSession(connector=connector, timeout=self._timeout,
                                     trace_configs=[connection_trace()],
                                     skip_auto_headers=("User-Agent",))

    async def __aenter__(self) -> Client:
        self._session = self._new_session(self.config.keepalive)
        return self

    async def __aexit__(self, *exc: object) -> None:
        for session in (self._session, self._fresh):
            if session is not None:
                await session.close()

    def body(self, spec: RequestSpec) -> dict[str, Any]:
        """The request's body, less the fields the server refused."""
        body = self.route.body(spec, self.model, self.config)
        return without(body, self.learned.refused.keys()) if self.learned.refused else body

    async def send(self, spec: RequestSpec, r: RequestTimeline) -> str | None:
        """Send `spec` and record everything in `r`; never raises but for cancellation.
        A session's request (`spec.session`) returns the answer's text (to carry into the
        next turn), others None."""
        body = self.body(spec)
        data = orjson.dumps(body)
        r.trace_id = secrets.token_hex(16)
        headers = self.headers | {"X-Request-Id": r.id,
                                  "traceparent": f"00-{r.trace_id}-{secrets.token_hex(8)}-01"}
        session = self._session
        keep = spec.session is not None
        answer = None
        try:
            while True:
                try:
                    answer = await self._attempt(session, body, data, headers, r, keep)
                    if r.ok and not r.token_ns and r.completion_tokens is None:
                        r.outcome, r.error = Outcome.EMPTY, "HTTP 200 without a token or usage"
                    break
                except STALE:
                    if not _stale(r) or r.retries:
                        raise
                    r.retries += 1
                    r.sent_ns = r.connection = None
                    session = self._fresh = self._fresh or self._new_session(False)
                except Refused as e:
                    self._drop(e, r)
                    body = self.body(spec)
                    data = orjson.dumps(body)
        except asyncio.CancelledError:
            r.outcome, r.error = Outcome.CANCELLED, "cancelled before the response ended"
            raise
        except StreamFault as e:
            r.outcome, r.error = e.outcome, str(e)
        except Exception as e:  # every failure becomes a classified record
            r.outcome, r.error = classify(e, r.headers_ns is not None), describe(e)
        finally:
            if r.done_ns is None or not r.ok:
                r.done_ns = perf_counter_ns()
        return answer

    def _drop(self, refusal: Refused, r: RequestTimeline) -> None:
        """Leave the refused fields out of the run's requests and reset `r` to be sent again
        (its refused attempt's time stays as client wait)."""
        for name in refusal.fields:
            self.learned.refused.setdefault(name, refusal.message)
        self.learned.resent += 1
        r.outcome, r.error = Outcome.OK, None
        r.status = r.server = r.server_request_id = r.sent_ns = r.headers_ns = None
        r.connection = None

    async def _attempt(self, session: aiohttp.ClientSession, body: dict[str, Any], data: bytes,
                       headers: dict[str, str], r: RequestTimeline, keep: bool) -> str | None:
        async with session.post(self.url, data=data, headers=headers,
                                trace_request_ctx=r) as resp:
            r.headers_ns = perf_counter_ns()
            r.status = resp.status
            r.server_request_id = resp.headers.get("X-Request-Id")
            if not self._answered and resp.status == 200:
                self._answered = True
                self.learned.gateway = gateway.detect(resp.headers)
            r.server = from_headers(resp.headers)
            content_type = resp.content_type
            if resp.status != 200:
                await self._http_error(resp, r, body)
            elif not self.config.stream:
                return await self._read_body(resp, r)
            elif not self.route.event_stream or content_type.startswith("text/event-stream"):
                return await self._read_stream(resp, r, keep)
            else:
                r.outcome = Outcome.BAD_PAYLOAD
                r.error = f"not a stream: Content-Type {content_type!r}"
        return None

    async def _http_error(self, resp: aiohttp.ClientResponse, r: RequestTimeline,
                          body: dict[str, Any]) -> None:
        """Classify an error answer; raise `Refused` when it refuses fields of `body`."""
        status = resp.status
        if status == 429:
            r.outcome = Outcome.HTTP_429
        elif status >= 500:
            r.outcome = Outcome.HTTP_5XX
        else:
            r.outcome = Outcome.HTTP_4XX
        raw = await resp.content.read(ERROR_BODY_BYTES)
        message = error_message(raw)
        r.error = (f"HTTP {status} {resp.reason or ''}".rstrip()
                   + (f": {message}" if message else ""))
        refused = refused_fields(status, raw.decode("utf-8", "replace"), body)
        if refused:
            raise Refused(refused, r.error[:ERROR_NOTE_CHARS])

    async def _read_stream(self, resp: aiohttp.ClientResponse, r: RequestTimeline,
                           keep: bool) -> str | None:
        parser = self.route.parser(r, self.route.chat, keep, self.config.max_event_bytes)
        limit, received = self.config.max_response_bytes, 0

        def feed(piece: bytes, t: int) -> None:
            nonlocal received
            received += len(piece)
            if received > limit:
                raise too_large("the response", limit, "--max-response-mib")
            parser.feed(piece, t)

        await read_stamped(resp, feed)
        parser.finish()
        if parser.without_done:
            self.learned.without_done += 1
        return "".join(parser.text) if parser.text is not None else None

    async def _read_body(self, resp: aiohttp.ClientResponse, r: RequestTimeline) -> str | None:
        """A non-streamed answer: one event, when the whole body has arrived."""
        raw = await read_at_most(resp, self.config.max_response_bytes, "--max-response-mib")
        t = perf_counter_ns()
        try:
            obj = orjson.loads(raw)
            usage = obj.get("usage") or sglang_usage(obj.get("meta_info") or {})
        except (orjson.JSONDecodeError, AttributeError):
            raise StreamFault(Outcome.BAD_PAYLOAD, f"not a JSON body: {raw[:200]!r}") from None
        apply_usage(r, usage)
        r.server = from_event(obj) or r.server
        r.add_token_event(t, max(r.completion_tokens or 1, 1))
        r.usage_ns = r.done_ns = t
        return answer_text(obj)


def answer_text(body: dict[str, Any]) -> str | None:
    """The answer of a non-streamed response: its first choice's text or message content
    (Ollama's: `response`, `message.content`; SGLang's: `text`)."""
    choices = body.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    if isinstance(first, dict):
        text = first.get("text") or (first.get("message") or {}).get("content")
    else:
        text = (body.get("response") or body.get("text")
                or (body.get("message") or {}).get("content"))
    return text if isinstance(text, str) else None


def _stale(r: RequestTimeline) -> bool:
    """Whether `r` failed on a reused connection before any response byte arrived."""
    return r.headers_ns is None and r.connection is not None and not r.connection.new
