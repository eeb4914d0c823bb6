"""Who may hold a connection, and how long a request may take to arrive.

uvicorn reads a request's headers and body with no deadline (a connection that sends half its
headers stays open for good) and takes every connection it is offered. Production servers
bound both: nginx (`client_header_timeout`, `client_body_timeout`, `limit_conn` per address),
Apache (`mod_reqtimeout`: `header=20-40,MinRate=500`), Node (`headersTimeout`). latlab serve
does as Apache does: a request's headers must arrive within `--header-timeout` seconds and its
body within `--body-timeout`, each extended by one second per `--min-rate` bytes received, so
a slow client that keeps sending is served and a stalled one is cut off (408). Connections are
capped in total and per client address (beyond either, a new one is answered 503 and closed),
and so are the requests still being read: past `--max-reading`, the one that has been
reading longest is cut off, so stalled clients cannot hold the slots real ones need, nor more
memory than `--max-reading` bodies.

`GuardedH11Protocol` is uvicorn's h11 protocol reporting to one `ConnectionGuard` per server;
the guard's counters are Prometheus metrics of /metrics. `WholeRequests` hands the app a
request only once its body is in (at most `max_body_bytes`, else 413), as nginx buffers a
request before it proxies it: a client still sending costs its connection, not a handler.
"""

from __future__ import annotations

import asyncio
import functools
import random
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import h11
import orjson
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from latlab.records.engine import ServeConfig

SWEEP_S = 0.25  # how often the deadlines are checked: a cut-off comes at most this late
# Each deadline is stretched by up to this share of its base, at random: clients that stalled
# together are not all cut off in one loop turn, to come back all at once.
JITTER = 0.5
HEADERS, BODY = "headers", "body"


@dataclass(slots=True)
class Reading:
    """A request being read: its phase, since when, the bytes received in that phase, and its
    deadline's stretch (a share of the base, below `JITTER`)."""

    phase: str
    started: float
    received: int = 0
    stretch: float = field(default_factory=lambda: JITTER * random.random())


class ConnectionGuard(Collector):
    """The connections of one server: how many each address holds, which requests are still
    being read, and their deadlines (checked every `SWEEP_S`)."""

    def __init__(self, settings: ServeConfig) -> None:
        self.settings = settings
        self.max_connections = settings.max_connections
        self.per_client: Counter[str] = Counter()
        self.open = 0
        self.reading: dict[GuardedH11Protocol, Reading] = {}  # oldest first
        self.refused: Counter[str] = Counter()  # by reason
        self.cut: Counter[str] = Counter()  # by reason
        self._sweeping: asyncio.TimerHandle | None = None

    def admit(self, host: str) -> str | None:
        """Count a new connection from `host`; why it is refused, None when it is not."""
        refused = ("max_connections" if self.open >= self.max_connections
                   else "max_connections_per_client"
                   if self.per_client[host] >= self.settings.max_connections_per_client
                   else None)
        if refused is not None:
            self.refused[refused] += 1
            return refused
        self.open += 1
        self.per_client[host] += 1
        return None

    def release(self, host: str) -> None:
        self.open -= 1
        self.per_client[host] -= 1
        if not self.per_client[host]:
            del self.per_client[host]

    def start(self, protocol: GuardedH11Protocol, phase: str) -> None:
        """`protocol`'s request enters `phase`; past --max-reading the oldest is cut off."""
        self.reading.pop(protocol, None)
        self.reading[protocol] = Reading(phase, time.monotonic())
        if len(self.reading) > self.settings.max_reading:
            oldest = next(iter(self.reading))
            self._cut(oldest, "evicted")
        if self._sweeping is None:
            self._sweeping = asyncio.get_running_loop().call_later(SWEEP_S, self._sweep)

    def stop(self, protocol: GuardedH11Protocol) -> None:
        self.reading.pop(protocol, None)

    def deadline(self, r: Reading) -> float:
        base = (self.settings.header_timeout_s if r.phase == HEADERS
                else self.settings.body_timeout_s)
        rate = self.settings.min_rate
        return r.started + base * (1 + r.stretch) + (r.received / rate if rate else 0.0)

    def _sweep(self) -> None:
        now = time.monotonic()
        for protocol, r in [(p, r) for p, r in self.reading.items() if now > self.deadline(r)]:
            self._cut(protocol, f"{r.phase}_timeout")
        self._sweeping = (asyncio.get_running_loop().call_later(SWEEP_S, self._sweep)
                          if self.reading else None)

    def _cut(self, protocol: GuardedH11Protocol, reason: str) -> None:
        r = self.reading.pop(protocol)
        self.cut[reason] += 1
        protocol.cut_off(r, reason)

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("latlab_connections_open", "HTTP connections open.",
                                value=self.open)
        yield GaugeMetricFamily("latlab_requests_reading", "Requests whose headers or body "
                                "are still arriving.", value=len(self.reading))
        refused = CounterMetricFamily("latlab_connections_refused", "Connections refused at "
                                      "once (503): over --max-connections or "
                                      "--max-connections-per-client.", labels=["reason"])
        for reason in ("max_connections", "max_connections_per_client"):
            refused.add_metric([reason], self.refused[reason])
        yield refused
        cut = CounterMetricFamily("latlab_requests_cut_off", "Requests cut off while arriving "
                                  "(408): too slow for --header-timeout or --body-timeout at "
                                  "--min-rate, or evicted past --max-reading.",
                                  labels=["reason"])
        for reason in ("headers_timeout", "body_timeout", "evicted"):
            cut.add_metric([reason], self.cut[reason])
        yield cut


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol under a `ConnectionGuard`: admitted or refused when it
    connects, its request tracked from its first byte (or the connection) until the last
    byte of its body."""

    def __init__(self, *args: Any, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.guard = guard
        self.host: str | None = None  # set once admitted

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        host = self.client[0] if self.client else ""
        refused = self.guard.admit(host)
        if refused is not None:
            limit = (self.guard.max_connections if refused == "max_connections"
                     else self.guard.settings.max_connections_per_client)
            self._answer(503, f"too many connections (--{refused.replace('_', '-')} {limit})",
                         "service_unavailable", "too_many_connections", retry_after=1)
            return
        self.host = host
        self.guard.start(self, HEADERS)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.host is not None:
            self.guard.stop(self)
            self.guard.release(self.host)
            self.host = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.host is None:
            return  # refused: its answer is on its way, the rest is not read
        reading = self.guard.reading.get(self)
        if reading is None and self.conn.their_state is h11.IDLE:
            self.guard.start(self, HEADERS)  # the next request on a kept-alive connection
            reading = self.guard.reading.get(self)
        if reading is not None:
            reading.received += len(data)
        super().data_received(data)
        if reading is None or self.transport.is_closing():
            return
        state = self.conn.their_state
        if state is h11.SEND_BODY and reading.phase == HEADERS:
            self.guard.start(self, BODY)
        elif state is not h11.IDLE and state is not h11.SEND_BODY:
            self.guard.stop(self)  # the whole request is in

    def cut_off(self, reading: Reading, reason: str) -> None:
        """408 and close: the request did not arrive in time, or was evicted."""
        took = time.monotonic() - reading.started
        why = ("evicted: more requests were arriving than --max-reading allows"
               if reason == "evicted" else
               f"the request's {reading.phase} did not arrive in time ({took:.1f} s for "
               f"{reading.received} bytes; see --{reading.phase.removesuffix('s')}-timeout and "
               "--min-rate)")
        if self.cycle is not None and reading.phase == BODY:
            self.cycle.scope["state"]["cut_off"] = reason  # the handler's read ends on it
        self._answer(408, why, "invalid_request_error", "request_timeout")

    def _answer(self, status: int, message: str, kind: str, code: str,
                retry_after: int | None = None) -> None:
        """Write a whole JSON error response and close, whatever the request's state."""
        if self.transport.is_closing():
            return
        body = orjson.dumps({"error": {"message": message, "type": kind, "param": None,
                                       "code": code}})
        phrase = {408: b"Request Timeout", 503: b"Service Unavailable"}[status]
        head = [b"HTTP/1.1 %d %s" % (status, phrase), b"content-type: application/json",
                b"content-length: %d" % len(body), b"connection: close"]
        if retry_after is not None:
            head.append(b"retry-after: %d" % retry_after)
        self.transport.write(b"\r\n".join(head) + b"\r\n\r\n" + body)
        self.transport.close()


class WholeRequests:
    """ASGI middleware: the app below sees a request once its whole body has arrived, at most
    `max_body_bytes` (else 413 here). A request cut off before (`GuardedH11Protocol.cut_off`
    has answered it) ends here unseen; one whose client left is handed on as a disconnect."""

    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app, self.max_body_bytes = app, max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length", b"")
        body = bytearray()
        while not (length.isdigit() and int(length) > self.max_body_bytes):
            message = await receive()
            if message["type"] == "http.disconnect":
                if scope.get("state", {}).get("cut_off") is None:  # it left: the app says so
                    await self.app(scope, functools.partial(_next, [message], receive), send)
                return
            body += message.get("body", b"")
            if len(body) > self.max_body_bytes:
                break
            if not message.get("more_body", False):
                whole: list[Message] = [{"type": "http.request", "body": bytes(body),
                                         "more_body": False}]
                return await self.app(scope, functools.partial(_next, whole, receive), send)
        error = orjson.dumps({"error": {
            "message": f"the request body is larger than {self.max_body_bytes} bytes",
            "type": "invalid_request_error", "param": None, "code": "request_too_large"}})
        await send({"type": "http.response.start", "status": 413, "headers": [
            (b"content-type", b"application/json"), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": error})


async def _next(whole: list[Message], receive: Receive) -> Message:
    """The whole body first, then what the connection says (a disconnect)."""
    return whole.pop() if whole else await receive()
