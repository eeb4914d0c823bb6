"""An application in front of the model, from its OpenTelemetry spans: a RAG service, an
agent's API. latlab's `traceparent` reaches the application, whose server span is then the
root of the request's trace; the spans under it (retrieval, reranking, a database, the call
to the model) tell where its time went, and the model server's own span, when it exports
one, nests under the application's call to it.

    total        = the application's server span (received → response complete)
    NAME         = the spans directly under it called NAME, their union outside the model call
    other        = total − the model server's total − every NAME: the application's own work
                   and its network to the model server

Names are the spans' own, so an unknown span is still a component ("vector search",
"POST"). The model call is the child whose subtree holds the model server's span; while it
streams (an HTTP client span ends at the response headers) it is taken to last at least the
model server's total.

An application is only there when the trace says where the model is (a model server's or
a GenAI client span under the root, of another service) or when the user names its spans
(`--app-span`): then only the named spans are components. Generic HTTP plumbing is never an
application's work: OpenTelemetry's ASGI instrumentation opens a span for every receive and
send of a response (`POST /x http receive` is its disconnect listener, open for the whole
stream), and middleware spans wrap the handler. A model server traced only by such generic
instrumentation is not an application (`spans.timing_of` keeps the client's view).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from latlab.load.telemetry.conventions import ASGI_EVENT
from latlab.records.spans import Span

GENERIC_SUFFIXES = ("http receive", "http send")


def generic(s: Span) -> bool:
    """HTTP plumbing (an ASGI receive or send, a middleware), never an application's work."""
    name = s.name.strip().lower()
    return (name.endswith(GENERIC_SUFFIXES) or "middleware" in name
            or ASGI_EVENT in s.attributes)


def root_of(spans: Sequence[Span]) -> Span | None:
    """The trace's outermost span: the longest server span without a parent in the trace."""
    ids = {s.span_id for s in spans}
    roots = [s for s in spans if s.parent_span_id not in ids]
    servers = [s for s in roots if s.kind == "server"] or roots
    return max(servers, key=lambda s: s.duration_ms) if servers else None


def application_of(spans: Sequence[Span], llm: Span | None, llm_total_ms: float | None,
                   named: Sequence[str] = ()) -> tuple[float, dict[str, float], str] | None:
    """(the application's total ms, its components in ms, its service name), or None when
    the trace has no application above the model server (its root is the model's span).
    With `named` span names only those are components."""
    root = root_of(spans)
    if root is None:
        return None
    if llm is not None and (root is llm or (root.service == llm.service
                                            and llm.kind != "client")):
        return None  # the model server's own trace
    children = [s for s in spans if s.parent_span_id == root.span_id and not generic(s)
                and (not named or s.name in named or s is llm)]
    if not children:
        return None
    call = _ancestor_under(llm, root, spans) if llm is not None else None
    llm_ms = llm_total_ms if llm_total_ms is not None else (llm.duration_ms if llm else 0.0)
    busy = ((call.start_ns, max(call.end_ns, call.start_ns + int(llm_ms * 1e6)))
            if call is not None else None)
    groups: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for s in children:
        if s is not call and s is not llm:
            start, end = max(s.start_ns, root.start_ns), min(s.end_ns, root.end_ns)
            if end > start:
                groups[s.name].append((start, end))
    parts = {name: _union_ns(intervals, busy) / 1e6 for name, intervals in groups.items()}
    parts = {name: ms for name, ms in parts.items() if ms > 0}
    total = root.duration_ms
    parts["other"] = total - llm_ms - sum(parts.values())
    return total, parts, root.service or "unknown"


def _ancestor_under(span: Span, root: Span, spans: Sequence[Span]) -> Span | None:
    """The child of `root` whose subtree holds `span` (None when it is not under `root`)."""
    by_id = {s.span_id: s for s in spans}
    node = span
    while node.parent_span_id is not None and node.parent_span_id in by_id:
        if node.parent_span_id == root.span_id:
            return node
        node = by_id[node.parent_span_id]
    return None


def _union_ns(intervals: list[tuple[int, int]], busy: tuple[int, int] | None) -> int:
    """The length of the union of `intervals`, less what of it falls inside `busy`."""
    merged: list[list[int]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    total = sum(b - a for a, b in merged)
    if busy is not None:
        total -= sum(max(0, min(b, busy[1]) - max(a, busy[0])) for a, b in merged)
    return total
