"""Receive the server's OpenTelemetry spans (OTLP/HTTP, protobuf or JSON) while a run goes on,
and read spans from files afterwards, all into `records.spans.Span`.

    with SpanReceiver(run.path / SPANS, port=4318) as receiver:   # POST /v1/traces
        ... the load ...; receiver.count

Decoding uses `opentelemetry-proto`'s messages. OTLP/JSON writes trace and span ids in hex
where protobuf's JSON mapping expects base64, so they are converted before parsing. A file
may hold OTLP/JSON requests one per line (an OTel collector's file exporter), the OTel SDK's
console JSON (`latlab serve --otel-file`), or latlab's own spans.jsonl.
"""

from __future__ import annotations

import asyncio
import base64
import os
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator

import orjson
from aiohttp import web
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest, ExportTraceServiceResponse)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from latlab.records.folder import RunFolder
from latlab.records.spans import Span, SpanEvent

SPAN_POLL_S = 0.1
SPAN_QUIET_S = 1.0  # longer than an exporter's batch delay (latlab serve: 0.5 s)

MAX_BODY = 64 << 20
KINDS = {0: None, 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}
_ID_KEYS = ("traceId", "spanId", "parentSpanId")


class SpanReceiver:
    """An OTLP/HTTP trace receiver on a loopback port, in its own thread, appending every
    span it decodes to `path` the moment it arrives (one write per request of spans)."""

    def __init__(self, path: Path, host: str = "127.0.0.1", port: int = 0) -> None:
        self.path, self.host, self.port = path, host, port
        self.count = 0
        self.errors = 0
        self.trace_ids: set[str] = set()
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="latlab-otlp")
        self._fd = -1

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}/v1/traces"

    def __enter__(self) -> SpanReceiver:
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        os.close(self._fd)

    async def _start(self) -> None:
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_post("/v1/traces", self._traces)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]

    async def _traces(self, request: web.Request) -> web.Response:
        body = await request.read()
        protobuf = request.content_type == "application/x-protobuf"
        try:
            message = (ExportTraceServiceRequest.FromString(body) if protobuf
                       else parse_otlp_json(orjson.loads(body)))
        except Exception as e:  # noqa: BLE001 - a sender's bad body is its 400, not our crash
            self.errors += 1
            return web.Response(status=400, text=f"not an OTLP trace export: {e}")
        spans = list(spans_of(message))
        if spans:
            os.write(self._fd, b"".join(orjson.dumps(s.model_dump()) + b"\n" for s in spans))
            self.count += len(spans)
            self.trace_ids = self.trace_ids | {s.trace_id for s in spans}  # one rebinding
        reply = ExportTraceServiceResponse()
        if protobuf:
            return web.Response(body=reply.SerializeToString(),
                                content_type="application/x-protobuf")
        return web.json_response(json_format.MessageToDict(reply))


def parse_otlp_json(data: dict[str, Any]) -> ExportTraceServiceRequest:
    """An OTLP/JSON export request (hex ids) as the protobuf message."""
    def fix(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: (base64.b64encode(bytes.fromhex(v)).decode()
                        if k in _ID_KEYS and isinstance(v, str) and v else fix(v))
                    for k, v in node.items()}
        return [fix(v) for v in node] if isinstance(node, list) else node

    return json_format.ParseDict(fix(data), ExportTraceServiceRequest(),
                                 ignore_unknown_fields=True)


def spans_of(message: ExportTraceServiceRequest) -> Iterator[Span]:
    for resource_spans in message.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        service = resource.get("service.name")
        for scope_spans in resource_spans.scope_spans:
            for s in scope_spans.spans:
                yield Span(
                    trace_id=s.trace_id.hex(), span_id=s.span_id.hex(),
                    parent_span_id=s.parent_span_id.hex() or None, name=s.name,
                    kind=KINDS.get(s.kind), start_ns=s.start_time_unix_nano,
                    end_ns=s.end_time_unix_nano, attributes=_attributes(s.attributes),
                    events=[SpanEvent(name=e.name, time_ns=e.time_unix_nano,
                                      attributes=_attributes(e.attributes)) for e in s.events],
                    service=str(service) if service is not None else None)


def _attributes(pairs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs}


def _value(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [_value(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return _attributes(v.kvlist_value.values)
    return getattr(v, which) if which else None


def read_spans(path: Path) -> list[Span]:
    """Every span in a file: latlab's spans.jsonl, OTLP/JSON lines, or the OTel SDK's
    console JSON; `ValueError` names the line it cannot read."""
    spans: list[Span] = []
    for n, line in enumerate(Path(path).read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        try:
            data = orjson.loads(line)
            if "resourceSpans" in data:
                spans += spans_of(parse_otlp_json(data))
            elif "context" in data:
                spans.append(_sdk_span(data))
            else:
                spans.append(Span.model_validate(data))
        except Exception as e:  # noqa: BLE001 - say which line, whatever went wrong
            raise ValueError(f"{path}: line {n}: not a span ({type(e).__name__}: {e})") from None
    return spans


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
                events=[SpanEvent(name=e["name"], time_ns=ns(e["timestamp"]),
                                  attributes=e.get("attributes") or {})
                        for e in data.get("events") or []],
                service=(data.get("resource") or {}).get("attributes", {}).get("service.name"))


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
