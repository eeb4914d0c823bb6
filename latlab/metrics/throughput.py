"""Rates over the measurement window: offered, sent, achieved, tokens, concurrency, and
whether the target fell behind (see `records.summary.Throughput`)."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from latlab.records.summary import Throughput
from latlab.records.timeline import Outcome, RequestTimeline
from latlab.records.window import Window

SHORTFALL = 0.95
BURST_SHARE = 0.1
BACKLOG_NOISE_MIN = 3
BACKLOG_NOISE_SIGMAS = 3.0
NOT_CONNECTED = (Outcome.CONNECTION_REFUSED, Outcome.CONNECTION_RESET)


def throughput(records: Sequence[RequestTimeline], chosen: Sequence[RequestTimeline],
               window: Window) -> Throughput:
    """The rates of `records` over `window`; `chosen` are the requests scheduled in it."""
    seconds = window.duration_s or math.nan
    output_tokens = 0.0
    prompt_tokens = 0
    completed = 0
    for r in records:
        if r.ok and r.done_ns in window:
            completed += 1
        if r.sent_ns in window and r.prompt_tokens:
            prompt_tokens += r.prompt_tokens
        event_total = sum(r.token_counts)
        if not event_total:
            continue
        in_window = sum(c for t, c in zip(r.token_ns, r.token_counts) if t in window)
        # Scale per-event counts to the server's usage count when they disagree.
        scale = (r.completion_tokens / event_total) if r.completion_tokens else 1.0
        output_tokens += in_window * scale

    # The offered load spans the window unless the arrivals stopped inside it (a run stopped
    # by count drains its last requests inside the window): then it ends at the last arrival.
    continued = any(r.origin_ns is not None and r.origin_ns >= window.end_ns for r in records)
    last = max((r.origin_ns for r in chosen), default=window.start_ns) + 1
    arrivals = Window(window.start_ns, window.end_ns if continued else min(window.end_ns, last))
    burst = arrivals.duration_s < BURST_SHARE * window.duration_s
    offered = None if burst else len(chosen) / arrivals.duration_s
    sent = None if burst else _sent_rate(chosen, arrivals)

    spans = [(r.sent_ns, r.end_ns) for r in records if r.sent_ns is not None]
    busy_ns = sum(max(0, min(end, window.end_ns) - max(start, window.start_ns))
                  for start, end in spans)
    backlog = (sum(1 for s, e in spans if s <= arrivals.end_ns < e)
               - sum(1 for s, e in spans if s <= window.start_ns < e))
    concurrency = busy_ns / 1e9 / seconds
    achieved = completed / seconds
    noise = max(BACKLOG_NOISE_MIN, BACKLOG_NOISE_SIGMAS * math.sqrt(2 * max(concurrency, 1.0)))
    return Throughput(
        window_s=window.duration_s,
        offered_rate=offered,
        sent_rate=sent,
        achieved_rate=achieved,
        output_tokens_per_s=output_tokens / seconds,
        total_tokens_per_s=(output_tokens + prompt_tokens) / seconds,
        mean_concurrency=concurrency,
        backlog_growth=backlog,
        fell_behind=offered is not None and achieved < SHORTFALL * offered and backlog > noise,
    )


def attempted_ns(r: RequestTimeline) -> int | None:
    """When the client sent the request, or tried to: a request refused a connection was
    attempted when it failed (the target's fault, not the client's)."""
    if r.sent_ns is not None:
        return r.sent_ns
    return r.done_ns if r.outcome in NOT_CONNECTED else None


def _sent_rate(chosen: Sequence[RequestTimeline], arrivals: Window) -> float:
    """The rate at which the client sent what the schedule offered in `arrivals`: the
    requests it sent (or tried to), over the arrivals' span stretched to the last of those
    sends; a client that keeps the schedule sends at the offered rate."""
    sends = [t for r in chosen if (t := attempted_ns(r)) is not None]
    end = max([arrivals.end_ns, *(t + 1 for t in sends)])
    return len(sends) / ((end - arrivals.start_ns) / 1e9)


def zero_gap_share(records: Sequence[RequestTimeline],
                   window: Window | None = None) -> float | None:
    """Share of gaps between a request's token events that are exactly zero (same read),
    over the requests scheduled in `window` (all without one)."""
    gaps = zeros = 0
    for r in records:
        if window is not None and r.origin_ns not in window:
            continue
        t = r.token_ns
        if len(t) > 1:
            gaps += len(t) - 1
            zeros += int(np.count_nonzero(np.diff(t) == 0))
    return zeros / gaps if gaps else None
