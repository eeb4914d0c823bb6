"""Rates over the measurement window: offered, sent, achieved, tokens, concurrency, and
whether the target fell behind (see `records.summary.Throughput`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from latlab.records.columns import MISSING, per_request, present
from latlab.records.summary import Throughput
from latlab.records.table import OUTCOMES, RequestTable, as_table
from latlab.records.timeline import Outcome, RequestTimeline
from latlab.records.window import Window

SHORTFALL = 0.95
BURST_SHARE = 0.1
BACKLOG_NOISE_MIN = 3
BACKLOG_NOISE_SIGMAS = 3.0
NOT_CONNECTED = (Outcome.CONNECTION_REFUSED, Outcome.CONNECTION_RESET)


def throughput(t: RequestTable, chosen: np.ndarray, window: Window,
               users: int | None = None) -> Throughput:
    """The rates of the requests of `t` over `window`; `chosen` marks those scheduled in it;
    `users`: a closed loop's (it cannot fall behind: it sends when the server lets it)."""
    seconds = window.duration_s or math.nan
    completed = int(np.count_nonzero(t.ok & inside(t.done_ns, window)))
    prompts = np.nan_to_num(t.prompt_tokens)
    prompt_tokens = int(prompts[inside(t.sent_ns, window) & (prompts > 0)].sum())
    # Per-event counts in the window, scaled to the server's usage count when they disagree.
    in_window = per_request(np.where(inside(t.token_ns, window), t.token_counts, 0),
                            t.token_offsets)
    events = t.event_tokens
    usage = np.nan_to_num(t.completion_tokens)
    scale = np.where(usage > 0, usage / np.maximum(events, 1), 1.0)
    output_tokens = float((in_window * scale)[events > 0].sum())
    # A request seen without its token events (observed from spans): its usage when it ended.
    unseen = (events == 0) & t.ok & inside(t.done_ns, window)
    output_tokens += float(usage[unseen].sum())

    # The offered load spans the window unless the arrivals stopped inside it (a run stopped
    # by count drains its last requests inside the window): then it ends at the last arrival.
    origin = t.origin_ns
    continued = bool((present(origin) & (origin >= window.end_ns)).any())
    last = int(origin[chosen].max()) + 1 if chosen.any() else window.start_ns + 1
    arrivals = Window(window.start_ns, window.end_ns if continued else min(window.end_ns, last))
    burst = arrivals.duration_s < BURST_SHARE * window.duration_s
    offered = None if burst else int(chosen.sum()) / arrivals.duration_s
    sent = None if burst else _sent_rate(t, chosen, arrivals)

    sent_at = present(t.sent_ns)
    starts, ends = t.sent_ns[sent_at], t.end_ns[sent_at]
    busy_ns = int(np.maximum(0, np.minimum(ends, window.end_ns)
                             - np.maximum(starts, window.start_ns)).sum())
    backlog = (int(np.count_nonzero((starts <= arrivals.end_ns) & (arrivals.end_ns < ends)))
               - int(np.count_nonzero((starts <= window.start_ns) & (window.start_ns < ends))))
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
        fell_behind=(users is None and offered is not None and achieved < SHORTFALL * offered
                     and backlog > noise),
        users=users,
    )


def inside(times: np.ndarray, window: Window) -> np.ndarray:
    """Where a timestamp column falls in `window` (never where it is missing)."""
    return (times >= window.start_ns) & (times < window.end_ns) & present(times)


def attempted_ns(t: RequestTable) -> np.ndarray:
    """When the client sent each request, or tried to: a request refused a connection was
    attempted when it failed (the target's fault, not the client's); MISSING: neither."""
    refused = np.isin(t.outcome, [OUTCOMES.index(str(o)) for o in NOT_CONNECTED])
    return np.where(present(t.sent_ns), t.sent_ns, np.where(refused, t.done_ns, MISSING))


def _sent_rate(t: RequestTable, chosen: np.ndarray, arrivals: Window) -> float:
    """The rate at which the client sent what the schedule offered in `arrivals`: the
    requests it sent (or tried to), over the arrivals' span stretched to the last of those
    sends; a client that keeps the schedule sends at the offered rate."""
    sends = attempted_ns(t)[chosen]
    sends = sends[present(sends)]
    end = max(arrivals.end_ns, int(sends.max()) + 1 if len(sends) else arrivals.end_ns)
    return len(sends) / ((end - arrivals.start_ns) / 1e9)


def zero_gap_share(records: Sequence[RequestTimeline] | RequestTable,
                   window: Window | None = None) -> float | None:
    """Share of gaps between a request's token events that are exactly zero (same read),
    over the requests scheduled in `window` (all without one)."""
    t = as_table(records)
    chosen = np.ones(len(t), bool) if window is None else inside(t.origin_ns, window)
    zero = np.zeros(len(t.token_ns), np.int64)  # at j: the gap from event j − 1 is zero
    zero[1:] = np.diff(t.token_ns) == 0
    zero[t.token_offsets[:-1][t.events > 0]] = 0  # a request's first event has no gap
    gaps = int(np.maximum(t.events - 1, 0)[chosen].sum())
    return int(per_request(zero, t.token_offsets)[chosen].sum()) / gaps if gaps else None
