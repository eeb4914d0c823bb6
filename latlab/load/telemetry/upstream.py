"""The engine behind a gateway: its spans joined to the client's requests without the
gateway's help, and the gateway's hop around each one.

A gateway (LiteLLM, nginx, Envoy) may drop the client's `traceparent` and the engine's timings
on the way back. The engine's spans still arrive; what survives the gateway joins them, in
this order:

    trace id       the gateway passed `traceparent` on (nginx does)
    request id     the engine's request id is, or holds, the client's `X-Request-Id`
    response id    the engine's request id came back as the response's id
    prompt length  what survives no gateway: a span whose prompt (and output) token counts are
    and time order the request's, lying inside the request's [sent, done] on the client's
                   clock, the earliest such span not taken, requests in the order they were sent

Spans are on the engine's wall clock; the client's clock anchor (`config.json` → clock) maps
them onto the client's monotonic clock. For an engine on the client's host that is one clock;
elsewhere NTP's error enters the hop (the join says so). The hop, per joined request:

    gateway_intake  = engine received − sent        the gateway's intake, the network to it
    gateway_forward = client first token − engine first token   the first token's way back
    gateway_tail    = done − engine finished        the gateway's tail after the engine
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from latlab.records.spans import Span
from latlab.records.timeline import NS_PER_MS, RequestTimeline, ServerTiming

# A span may start this much before `sent` or end after `done` on the client's clock: the
# anchor's two reads are microseconds apart, the exporter rounds nothing.
CLOCK_SLACK_NS = 2_000_000
ID = "gen_ai.request.id"
PROMPT, OUTPUT = "gen_ai.usage.prompt_tokens", "gen_ai.usage.completion_tokens"
TTFT = "gen_ai.latency.time_to_first_token"  # seconds
_WORD = re.compile(r"[0-9A-Za-z]+")
MAX_WORDS = 16  # of a request id searched for ids inside it


class JoinedBy(StrEnum):
    TRACE = "trace id"
    REQUEST_ID = "request id"
    RESPONSE_ID = "response id"
    ORDER = "prompt length and time order"


@dataclass(frozen=True, slots=True)
class Joined:
    """A request's spans and what joined them."""

    spans: list[Span]
    by: JoinedBy


def join(records: Sequence[RequestTimeline], spans: Sequence[Span], anchor_ns: int | None
         ) -> dict[str, Joined]:
    """Each request's spans (see the module's docstring for the order tried); `anchor_ns` is
    unix ns − the client's perf_counter ns (None: no clock anchor, so no join by time)."""
    by_trace: dict[str, list[Span]] = defaultdict(list)
    by_id: dict[str, list[Span]] = defaultdict(list)
    for s in spans:
        by_trace[s.trace_id].append(s)
        rid = s.attributes.get(ID)
        if isinstance(rid, str):
            by_id[rid].append(s)
    out: dict[str, Joined] = {}
    wanted = {r.id for r in records if r.id not in by_id
              and not (r.trace_id and r.trace_id in by_trace)}
    within: dict[str, list[Span]] = {}  # a wanted id as whole words of a span's request id
    for rid, found in by_id.items() if wanted else ():
        for piece in _pieces(rid):
            if piece in wanted:
                within.setdefault(piece, found)
    for r in records:
        if r.trace_id and r.trace_id in by_trace:
            out[r.id] = Joined(by_trace[r.trace_id], JoinedBy.TRACE)
        elif found := by_id.get(r.id) or within.get(r.id):
            out[r.id] = Joined(found, JoinedBy.REQUEST_ID)  # vLLM's `cmpl-<id>-0`
        elif r.server_request_id and (found := _named_in(r.server_request_id, by_id)):
            out[r.id] = Joined(found, JoinedBy.RESPONSE_ID)
    if anchor_ns is not None:
        taken = {id(s) for j in out.values() for s in j.spans}
        rest = [r for r in records if r.id not in out and r.ok]
        out |= _by_order(rest, [s for s in spans if id(s) not in taken and ID in s.attributes],
                         anchor_ns)
    return out


def _named_in(response_id: str, by_id: dict[str, list[Span]]) -> list[Span] | None:
    """The spans whose request id is the response's id, or whole words inside it
    (`chatcmpl-<id>`; the longest such)."""
    if found := by_id.get(response_id):
        return found
    inside = [p for p in _pieces(response_id) if len(p) >= 8 and p in by_id]
    return by_id[max(inside, key=len)] if inside else None


def _pieces(rid: str) -> list[str]:
    """Every run of whole words in `rid` (`cmpl-ab12-3-0`: `ab12-3`, `3-0`, ...): an id found
    inside another is found whole, never `ab12-1` inside `ab12-10`."""
    words = [m.span() for m in _WORD.finditer(rid)][:MAX_WORDS]
    return [rid[words[i][0]:words[j][1]] for i in range(len(words))
            for j in range(i, len(words))]


def _by_order(records: Sequence[RequestTimeline], spans: Sequence[Span], anchor_ns: int
              ) -> dict[str, Joined]:
    """Requests joined to model spans of their prompt's length (and output's, where both are
    known) inside their [sent, done]: the earliest such span not yet taken, in send order."""
    pool: dict[int, list[Span]] = defaultdict(list)
    for s in sorted(spans, key=lambda s: s.start_ns):
        tokens = s.attributes.get(PROMPT)
        if isinstance(tokens, int):
            pool[tokens].append(s)
    starts = {k: [s.start_ns for s in v] for k, v in pool.items()}
    taken: set[int] = set()
    out = {}
    for r in sorted(records, key=lambda r: r.sent_ns or 0):
        tokens = r.prompt_tokens if r.prompt_tokens is not None else r.prompt_tokens_planned
        if r.sent_ns is None or r.done_ns is None or tokens not in pool:
            continue
        low = r.sent_ns + anchor_ns - CLOCK_SLACK_NS
        high = r.done_ns + anchor_ns + CLOCK_SLACK_NS
        candidates = pool[tokens]
        for i in range(bisect_left(starts[tokens], low), len(candidates)):
            s = candidates[i]
            if s.start_ns > high:
                break
            output = s.attributes.get(OUTPUT)
            if (id(s) in taken or s.end_ns > high or (
                    isinstance(output, int) and r.completion_tokens is not None
                    and output != r.completion_tokens)):
                continue
            taken.add(id(s))
            out[r.id] = Joined([s], JoinedBy.ORDER)
            break
    return out


def with_hop(timing: ServerTiming, r: RequestTimeline, engine: Span, anchor_ns: int
             ) -> ServerTiming:
    """`timing` with the gateway's hop around `engine`, the engine's span of request `r`."""
    received = engine.start_ns - anchor_ns
    finished = engine.end_ns - anchor_ns
    first = next((e.time_ns for e in engine.events if e.name == "first_token"), None)
    ttft = engine.attributes.get(TTFT)
    if first is None and isinstance(ttft, (int, float)):
        first = engine.start_ns + int(ttft * 1e9)
    if r.sent_ns is not None:
        timing.gateway_intake = max(0.0, (received - r.sent_ns) / NS_PER_MS)
    if first is not None and r.first_token_ns is not None:
        timing.gateway_forward = max(0.0, (r.first_token_ns - (first - anchor_ns)) / NS_PER_MS)
    if r.done_ns is not None:
        timing.gateway_tail = max(0.0, (r.done_ns - finished) / NS_PER_MS)
    return timing
