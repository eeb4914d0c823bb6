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
"""

from __future__ import annotations

from collections import defaultdict
from typing import Sequence

from latlab.records.spans import Span


def application_of(spans: Sequence[Span], llm: Span | None, llm_total_ms: float | None
                   ) -> tuple[float, dict[str, float], str] | None:
    """(the application's total ms, its components in ms, its service name), or None when
    the trace has no application above the model server (its root is the model's span)."""
    ids = {s.span_id for s in spans}
    roots = [s for s in spans if s.parent_span_id not in ids]
    servers = [s for s in roots if s.kind == "server"] or roots
    if not servers:
        return None
    root = max(servers, key=lambda s: s.duration_ms)
    if llm is not None and (root is llm or root.service == llm.service):
        return None
    children = [s for s in spans if s.parent_span_id == root.span_id]
    if not children:
        return None
    call = _ancestor_under(llm, root, spans) if llm is not None else None
    llm_ms = llm_total_ms if llm_total_ms is not None else (llm.duration_ms if llm else 0.0)
    busy = ((call.start_ns, max(call.end_ns, call.start_ns + int(llm_ms * 1e6)))
            if call is not None else None)
    groups: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for s in children:
        if s is not call:
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
