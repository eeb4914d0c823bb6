"""The server's OpenTelemetry spans of a run (`spans.jsonl`, one span a line, appended as they
arrive) and what joining them to the requests gave (`server_timings.jsonl`, summary.json →
`spans`).

A span is kept in one shape whatever it came in as (OTLP protobuf or JSON, an OTel collector's
file exporter, the OTel SDK's console JSON): ids in lower-case hex, times in unix ns on the
server's clock, attributes as plain values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from pydantic import BaseModel, ConfigDict

SPANS = "spans.jsonl"
SERVER_TIMINGS = "server_timings.jsonl"
NO_EVENTS: tuple[SpanEvent, ...] = ()  # one empty sequence for every span read without them


@dataclass(slots=True)
class SpanEvent:
    name: str
    time_ns: int
    attributes: dict[str, object] = field(default_factory=dict)


@dataclass(slots=True)
class Span:
    """One span (a plain class, not a validated model: a busy service sends tens of
    thousands a second, and those from OTLP are typed already; `from_json` checks a file's)."""

    trace_id: str
    span_id: str
    name: str
    start_ns: int
    end_ns: int
    parent_span_id: str | None = None
    kind: str | None = None
    # A dict, or while `latlab observe` holds it the compact mapping of the attributes it reads
    attributes: Mapping[str, object] = field(default_factory=dict)
    events: Sequence[SpanEvent] = field(default_factory=list)  # NO_EVENTS: not decoded
    service: str | None = None
    status: str | None = None  # "ok" or "error" when the span set one

    @property
    def duration_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6

    def to_json(self) -> dict[str, Any]:
        if isinstance(self.attributes, dict):
            return asdict(self)
        return asdict(replace(self, attributes=dict(self.attributes)))

    @classmethod
    def from_json(cls, data: Any) -> Span:
        """A span of latlab's spans.jsonl; `ValueError` says what is wrong with it."""
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        for key, kind in _REQUIRED.items():
            if not isinstance(data.get(key), kind) or isinstance(data.get(key), bool):
                raise ValueError(f"`{key}` is missing or not {_KIND[kind]}")
        events = data.get("events") or []
        if not isinstance(events, list) or not all(
                isinstance(e, dict) and isinstance(e.get("name"), str)
                and isinstance(e.get("time_ns"), int) for e in events):
            raise ValueError("`events` must be a list of {name, time_ns, attributes}")
        attributes = data.get("attributes") or {}
        if not isinstance(attributes, dict):
            raise ValueError("`attributes` must be an object")
        return cls(data["trace_id"], data["span_id"], data["name"], data["start_ns"],
                   data["end_ns"], _text(data.get("parent_span_id")), _text(data.get("kind")),
                   attributes, [SpanEvent(e["name"], e["time_ns"], e.get("attributes") or {})
                                for e in events], _text(data.get("service")),
                   _text(data.get("status")))


_REQUIRED = {"trace_id": str, "span_id": str, "name": str, "start_ns": int, "end_ns": int}
_KIND = {str: "a string", int: "an integer"}


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


class SpanJoin(BaseModel):
    """How the spans joined the requests: how many arrived and matched, by which adapter and
    by what (trace id, request id, response id, prompt length and time order),
    and the server clock's offset from the client's (server − client, ms) with the
    half-width of the interval every matched request allows (None: no span bounded it)."""

    model_config = ConfigDict(extra="ignore")

    spans: int
    requests_joined: int
    requests_with_trace: int
    sources: dict[str, int] = {}
    joined_by: dict[str, int] = {}  # requests per way of joining (`upstream.JoinedBy`)
    clock_offset_ms: float | None = None
    clock_offset_uncertainty_ms: float | None = None
    notes: list[str] = []
