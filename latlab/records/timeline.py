"""The core record: one `RequestTimeline` per request, successful or not.

Client timestamps are `time.perf_counter_ns()` of the load-generator process (CLOCK_MONOTONIC,
shared by every process on the machine); the run's wall-clock anchor maps them to dates.
Server timings are durations on the server's own clock, so no clock synchronisation is needed.
Missing values are `None`, never 0. What the server says of a request's stages is its
`ServerTiming` (`records.server_timing`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any

from latlab.records.server_timing import ServerTiming

NS_PER_MS = 1e6


def ms_between(later: int | None, earlier: int | None) -> float | None:
    """Milliseconds from `earlier` to `later` (nanosecond stamps); None if either is missing."""
    if later is None or earlier is None:
        return None
    return (later - earlier) / NS_PER_MS


class Outcome(StrEnum):
    """How a request ended. Everything but `OK` is a failure class."""

    OK = "ok"
    HTTP_4XX = "http_4xx"
    HTTP_429 = "http_429"
    HTTP_5XX = "http_5xx"
    TIMEOUT = "timeout"
    CONNECTION_REFUSED = "connection_refused"
    CONNECTION_RESET = "connection_reset"
    STREAM_BROKEN = "stream_broken"
    BAD_PAYLOAD = "bad_payload"
    EMPTY = "empty"  # a 200 answer that carried no token and no usage
    UNFINISHED = "unfinished"  # still in flight when the run's time (duration + drain) ran out
    CANCELLED = "cancelled"  # the run was interrupted (Ctrl-C, SIGTERM): not the server's failure
    CLIENT_ERROR = "client_error"
    # A response, or one event of it, over bench's --max-response-mib / --max-event-mib: bench
    # stopped reading it (a server sending without end cannot take the client's memory).
    TOO_LARGE = "too_large"


@dataclass(slots=True)
class ConnectionTiming:
    """Phases of acquiring a connection (ns). `new` is False when a pooled one was reused.
    `rtt_ns` is the round trip the kernel measured on the new connection's handshake
    (TCP_INFO, Linux): the network's alone, where `connect_ns` holds the client's own
    delays too."""

    new: bool
    pool_wait_ns: int | None = None
    dns_ns: int | None = None
    connect_ns: int | None = None
    tls_ns: int | None = None
    rtt_ns: int | None = None

    @property
    def setup_ns(self) -> int:
        """DNS + TCP + TLS of a new connection (0 for a reused one)."""
        return sum(v for v in (self.dns_ns, self.connect_ns, self.tls_ns) if v is not None)


@dataclass(slots=True)
class SessionStep:
    """Where a request sits in a session: a chat's turn, or an agent task's model call.

    `turn` counts from 1 to the `turns` planned. `after_ns` is when the session's previous
    request ended (None for turn 1); between it and this request's `scheduled` lies the
    user's think time (`chat`) or the tool step (`agent`: `tool_start_ns` to `tool_end_ns`,
    `tool_error` when the tool failed; the rest of the gap is the orchestration's)."""

    id: str
    turn: int
    turns: int
    kind: str = "chat"
    after_ns: int | None = None
    tool_start_ns: int | None = None
    tool_end_ns: int | None = None
    tool_error: str | None = None


@dataclass(slots=True)
class TraceStep:
    """Where a replayed trace's request comes from (`--trace`): its row (0 for the trace's
    first request, in the file's order) and what the row asked for, before --length-scale —
    its time (seconds after the trace's first request), its prompt and output tokens, and
    its prompt's blocks (`hash_ids`: each a 512-token block; equal ids, equal text)."""

    row: int
    time_s: float
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    hash_ids: list[int] | None = None


@dataclass(slots=True)
class RequestTimeline:
    """Everything latlab knows about one request: workload, client events, server timings."""

    id: str
    index: int
    worker: int = 0
    node: str | None = None  # the Ray node that sent it (`--ray`); None on one machine

    # What the workload asked for.
    api: str = "completions"
    prompt_tokens_planned: int | None = None
    max_tokens: int | None = None
    fitted: bool = False  # max_tokens lowered to fit the server's context
    tenant: str | None = None
    priority: int | None = None

    # Client events (perf_counter_ns of the load generator).
    scheduled_ns: int | None = None
    sent_ns: int | None = None
    headers_ns: int | None = None
    first_token_ns: int | None = None
    last_token_ns: int | None = None
    usage_ns: int | None = None
    done_ns: int | None = None
    connection: ConnectionTiming | None = None
    token_ns: list[int] = field(default_factory=list)
    token_counts: list[int] = field(default_factory=list)

    # Outcome.
    outcome: Outcome = Outcome.OK
    status: int | None = None
    error: str | None = None

    # Token counts: from the server's usage when offered, else counted by the client (flagged).
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    tokens_from_usage: bool = False

    server: ServerTiming | None = None
    server_request_id: str | None = None

    # How it was sent: the W3C trace id of its `traceparent`, and the retries on a fresh
    # connection after a pooled one turned out closed (their time is client wait).
    trace_id: str | None = None
    retries: int = 0

    # A session's request (None for an independent one), and a reasoning stream's first
    # reasoning token and first answer token (None unless the stream marked reasoning).
    session: SessionStep | None = None
    first_reasoning_ns: int | None = None
    first_answer_ns: int | None = None
    trace: TraceStep | None = None  # a replayed trace's row (--trace)

    @property
    def ok(self) -> bool:
        return self.outcome == Outcome.OK

    @property
    def origin_ns(self) -> int | None:
        """When the request's clock starts: its scheduled time, else its send time."""
        return self.scheduled_ns if self.scheduled_ns is not None else self.sent_ns

    @property
    def end_ns(self) -> int | None:
        """When the request stopped occupying the target, as far as the client knows: its
        end, else its last sign of life; None if it was never sent."""
        for t in (self.done_ns, self.last_token_ns, self.headers_ns, self.sent_ns):
            if t is not None:
                return t
        return None

    @property
    def output_tokens(self) -> int | None:
        """Generated tokens: the server's usage count, else the sum of per-event counts."""
        if self.completion_tokens is not None:
            return self.completion_tokens
        return sum(self.token_counts) if self.token_counts else None

    def add_token_event(self, t_ns: int, n_tokens: int = 1) -> None:
        if self.first_token_ns is None:
            self.first_token_ns = t_ns
        self.last_token_ns = t_ns
        self.token_ns.append(t_ns)
        self.token_counts.append(n_tokens)

    def to_json(self) -> dict[str, Any]:
        data = {name: getattr(self, name) for name in _RECORD_FIELDS}
        data["outcome"] = str(self.outcome)
        data["connection"] = _flat(self.connection)
        data["server"] = self.server.to_json() if self.server else None
        data["session"] = _flat(self.session)
        data["trace"] = _flat(self.trace)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RequestTimeline:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["outcome"] = Outcome(values.get("outcome", "ok"))
        if values.get("connection"):
            values["connection"] = ConnectionTiming(**values["connection"])
        values["server"] = ServerTiming.from_json(values.get("server"))
        if values.get("session"):
            values["session"] = SessionStep(**values["session"])
        if values.get("trace"):
            values["trace"] = TraceStep(**values["trace"])
        return cls(**values)


_RECORD_FIELDS = tuple(f.name for f in fields(RequestTimeline))


def _flat(record: ConnectionTiming | SessionStep | TraceStep | None) -> dict[str, Any] | None:
    """A record of plain values as a dict (`asdict` deep-copies: the hot path writes one a
    request)."""
    return None if record is None else {f.name: getattr(record, f.name) for f in fields(record)}
