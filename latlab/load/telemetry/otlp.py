"""Receive the server's OpenTelemetry spans (OTLP/HTTP, protobuf or JSON) while a run goes on,
and read spans from files afterwards, all into `records.spans.Span`.

    with SpanReceiver(run.path / SPANS, port=4318) as receiver:   # POST /v1/traces
        ... the load ...; receiver.count

or hands each request's spans to `on_spans` (in the receiver's thread) as they arrive
(`latlab observe`, with only the attributes it reads: `kept`), refusing them while
`accepting()` says no (503 and Retry-After, which OTLP exporters retry: memory stays bounded
when the spans come faster than they are explained). A body that is not an OTLP trace export
is answered 400 and counted (`rejected`, `first_rejection`); gzip bodies (a Collector's
default) are decompressed.

Protobuf bodies are decoded with `opentelemetry-proto`'s messages; OTLP/JSON is read from the
JSON itself (`json_spans`: protobuf's JSON parser is pure Python, and OTLP/JSON writes ids in
hex where its mapping expects base64). A file may hold OTLP/JSON requests one per line (an
OTel collector's file exporter), the OTel SDK's console JSON (`latlab serve --otel-file`), or
latlab's own spans.jsonl.
"""

from __future__ import annotations

import asyncio
import base64
import os
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from latlab.load.telemetry.attributes import Kept
from latlab.load.telemetry.otlp_json import KINDS, STATUS, json_spans
from latlab.records.folder import RunFolder
from latlab.records.spans import NO_EVENTS, Span, SpanEvent

SPAN_POLL_S = 0.1
SPAN_QUIET_S = 1.0  # longer than an exporter's batch delay (latlab serve: 0.5 s)

MAX_BODY = 64 << 20
RETRY_AFTER_S = 1


class SpanReceiver:
    """An OTLP/HTTP trace receiver on a port of `host`, in its own thread, appending every
    span it decodes to `path` the moment it arrives (one write per request of spans) and
    handing them to `on_spans`."""

    def __init__(self, path: Path | None = None, host: str = "127.0.0.1", port: int = 0,
                 on_spans: Callable[[list[Span]], None] | None = None,
                 accepting: Callable[[], bool] | None = None, events: bool = True,
                 kept: Kept | None = None) -> None:
        self.path, self.host, self.port, self.on_spans = path, host, port, on_spans
        self.accepting, self.events, self.kept = accepting, events, kept
        self.count = 0
        self.throttled = 0
        self.rejected = 0
        self.first_rejection: str | None = None
        self.trace_ids: set[str] = set()  # with a `path` only (a bench run's, bounded)
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="latlab-otlp")
        self._fd = -1

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}/v1/traces"

    def __enter__(self) -> SpanReceiver:
        if self.path is not None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop()

    def _stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    async def _start(self) -> None:
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_post("/v1/traces", self._traces)
        runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await runner.setup()
        self._runner = runner
        site = web.TCPSite(runner, self.host, self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]

    async def _traces(self, request: web.Request) -> web.Response:
        if self.accepting is not None and not self.accepting():
            self.throttled += 1  # OTLP: a retryable refusal; the exporter sends it again later
            return web.Response(status=503, headers={"Retry-After": str(RETRY_AFTER_S)},
                                text="latlab is behind: retry later")
        protobuf = request.content_type == "application/x-protobuf"
        try:
            body = await request.read()
            spans = (list(spans_of(ExportTraceServiceRequest.FromString(body), self.events,
                                   self.kept))
                     if protobuf
                     else json_spans(orjson.loads(body)))
        except Exception as e:  # noqa: BLE001 - a sender's bad body is its 400, not our crash
            self.rejected += 1
            reason = f"not an OTLP trace export ({type(e).__name__}: {e})"
            self.first_rejection = self.first_rejection or reason
            return web.Response(status=400, text=reason)
        if spans:
            if self._fd >= 0:
                os.write(self._fd, b"".join(orjson.dumps(s.to_json()) + b"\n" for s in spans))
                self.trace_ids = self.trace_ids | {s.trace_id for s in spans}  # one rebinding
            self.count += len(spans)
            if self.on_spans is not None:
                self.on_spans(spans)
        reply = ExportTraceServiceResponse()
        if protobuf:
            return web.Response(body=reply.SerializeToString(),
                                content_type="application/x-protobuf")
        return web.json_response(json_format.MessageToDict(reply))


def spans_of(message: ExportTraceServiceRequest, events: bool = True,
             kept: Kept | None = None) -> Iterator[Span]:
    """The message's spans; without their events unless `events` (observe reads none); with
    only the `kept` attributes where given (`attributes.Kept`: what observe holds). An id
    the message repeats (a trace's, a parent's) is one string."""
    ids: dict[bytes, str] = {}

    def hex_id(raw: bytes) -> str:
        text = ids.get(raw)
        if text is None:
            text = ids[raw] = raw.hex()
        return text

    for resource_spans in message.resource_spans:
        service = _attributes(resource_spans.resource.attributes).get("service.name")
        service = str(service) if service is not None else None
        for scope_spans in resource_spans.scope_spans:
            for s in scope_spans.spans:
                yield Span(hex_id(s.trace_id), hex_id(s.span_id), _shared(s.name),
                           s.start_time_unix_nano, s.end_time_unix_nano,
                           hex_id(s.parent_span_id) or None, KINDS.get(s.kind),
                           _attributes(s.attributes) if kept is None else
                           kept.of((kv.key, _decoded(kv.value)) for kv in s.attributes
                                   if kv.key in kept.keys),
                           [SpanEvent(e.name, e.time_unix_nano, _attributes(e.attributes))
                            for e in s.events] if events else NO_EVENTS, service,
                           STATUS.get(s.status.code))


def _attributes(pairs: Any) -> dict[str, Any]:
    return {_shared(kv.key): _decoded(kv.value) for kv in pairs}


def _decoded(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    return getattr(v, which) if which in _SCALARS else _value(v)


_SCALARS = frozenset({"string_value", "int_value", "double_value", "bool_value"})
_NAMES: dict[str, str] = {}
MAX_NAMES = 10_000


def _shared(name: str) -> str:
    """One string object per attribute key or span name (protobuf gives a new one each time:
    a span waiting in `latlab observe` held its keys' copies, a third of its memory); at most
    `MAX_NAMES` kept, for a sender whose names never repeat."""
    if len(_NAMES) < MAX_NAMES:
        return _NAMES.setdefault(name, name)
    return _NAMES.get(name, name)


def _value(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [_value(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return _attributes(v.kvlist_value.values)
    if which == "bytes_value":  # as OTLP/JSON writes it: a span stays JSON
        return base64.b64encode(v.bytes_value).decode()
    return getattr(v, which) if which else None


def read_spans(path: Path) -> list[Span]:
    """Every span in a file: latlab's spans.jsonl, OTLP/JSON lines, or the OTel SDK's
    console JSON; `ValueError` names the line it cannot read."""
    def fail(n: int, reason: str) -> None:
        raise ValueError(f"{path}: line {n}: not a span ({reason})")

    return list(iter_spans(path, fail))


def iter_spans(path: Path, on_error: Callable[[int, str], None]) -> Iterator[Span]:
    """The spans of a file line by line (as `read_spans`); a line it cannot read is given to
    `on_error(line number, reason)` and skipped."""
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                data = orjson.loads(line)
                if isinstance(data, dict) and "resourceSpans" in data:
                    spans = json_spans(data)
                elif isinstance(data, dict) and "context" in data:
                    spans = [_sdk_span(data)]
                else:
                    spans = [Span.from_json(data)]
            except Exception as e:  # noqa: BLE001 - say which line, whatever went wrong
                on_error(n, f"{type(e).__name__}: {e}")
                continue
            yield from spans


def _sdk_span(data: dict[str, Any]) -> Span:
    """The OTel SDK's `ReadableSpan.to_json()`: 0x-prefixed ids, ISO 8601 UTC times."""
    def ns(text: str) -> int:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
        return int(moment.timestamp()) * 1_000_000_000 + moment.microsecond * 1000

    context = data["context"]
    return Span(trace_id=context["trace_id"].removeprefix("0x"),
                span_id=context["span_id"].removeprefix("0x"),
                parent_span_id=(data.get("parent_id") or "").removeprefix("0x") or None,
                name=data["name"], kind=str(data.get("kind", "")).removeprefix("SpanKind.").lower(),
                start_ns=ns(data["start_time"]), end_ns=ns(data["end_time"]),
                attributes=data.get("attributes") or {},
                events=[SpanEvent(e["name"], ns(e["timestamp"]), e.get("attributes") or {})
                        for e in data.get("events") or []],
                service=(data.get("resource") or {}).get("attributes", {}).get("service.name"),
                status={"OK": "ok", "ERROR": "error"}.get(
                    (data.get("status") or {}).get("status_code")))


def await_spans(receiver: SpanReceiver, run: RunFolder, wait_s: float) -> list[str]:
    """Wait (at most `wait_s`) until a span has arrived for every successful request's
    trace and none for `SPAN_QUIET_S` (exporters send in batches, seconds after the request
    ended, and an application's spans come in other batches than its model server's)."""
    wanted = {r.trace_id for r in run.read_records(raw=True) if r.ok and r.trace_id}
    deadline = time.monotonic() + wait_s
    count, quiet_since = receiver.count, time.monotonic()
    while time.monotonic() < deadline:
        if receiver.count != count:
            count, quiet_since = receiver.count, time.monotonic()
        elif (wanted <= receiver.trace_ids
              and time.monotonic() - quiet_since >= SPAN_QUIET_S):
            break
        time.sleep(SPAN_POLL_S)
    if receiver.count:
        return []
    return [f"no span arrived at {receiver.endpoint} in {wait_s:g} s after the load: point "
            "the server's OTLP/HTTP trace exporter there"]
