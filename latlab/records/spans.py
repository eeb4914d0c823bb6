"""The server's OpenTelemetry spans of a run (`spans.jsonl`, one span a line, appended as they
arrive) and what joining them to the requests gave (`server_timings.jsonl`, summary.json →
`spans`).

A span is kept in one shape whatever it came in as (OTLP protobuf or JSON, an OTel collector's
file exporter, the OTel SDK's console JSON): ids in lower-case hex, times in unix ns on the
server's clock, attributes as plain values.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

SPANS = "spans.jsonl"
SERVER_TIMINGS = "server_timings.jsonl"


class SpanEvent(BaseModel):
    name: str
    time_ns: int
    attributes: dict[str, object] = {}


class Span(BaseModel):
    trace_id: str
    span_id: str
    parent_span_id: str | None = None
    name: str
    kind: str | None = None
    start_ns: int
    end_ns: int
    attributes: dict[str, object] = {}
    events: list[SpanEvent] = []
    service: str | None = None

    @property
    def duration_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


class SpanJoin(BaseModel):
    """How the spans joined the requests: how many arrived and matched, by which adapter,
    and the server clock's offset from the client's (server − client, ms) with the
    half-width of the interval every matched request allows (None: no span bounded it)."""

    model_config = ConfigDict(extra="ignore")

    spans: int
    requests_joined: int
    requests_with_trace: int
    sources: dict[str, int] = {}
    clock_offset_ms: float | None = None
    clock_offset_uncertainty_ms: float | None = None
    notes: list[str] = []
