"""Rates over the measurement window: offered, sent, achieved, tokens, concurrency, and
whether the target fell behind (see `records.summary.Throughput`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

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
BLOCK_ROWS = 1 << 16  # requests counted at a time


def throughput(t: RequestTable, chosen: np.ndarray, window: Window,
               users: int | None = None) -> Throughput:
    """The rates of the requests of `t` over `window`; `chosen` marks those scheduled in it;
    `users`: a closed loop's (it cannot fall behind: it sends when the server lets it).
    Counted a block of `BLOCK_ROWS` requests at a time (two passes: the sends, the time busy
    and the backlog need the arrivals' end), so that its intermediate columns are a block's;
    the one sum whose order could change its last bits is taken over the blocks' joined."""
    seconds = window.duration_s or math.nan
    completed = prompt_tokens = chosen_count = 0
    unseen_tokens, scaled, continued, last = 0.0, [], False, None
    for lo, hi in _blocks(len(t)):
        b, picked = t.block(lo, hi), chosen[lo:hi]
        completed += int(np.count_nonzero(b.ok & inside(b.done_ns, window)))
        prompts = np.nan_to_num(b.prompt_tokens)
        prompt_tokens += int(prompts[inside(b.sent_ns, window) & (prompts > 0)].sum())
        # Per-event counts in the window, scaled to the server's usage count when they disagree.
        in_window = per_request(np.where(inside(b.token_ns, window), b.token_counts, 0),
                                b.token_offsets)
        events = b.event_tokens
        usage = np.nan_to_num(b.completion_tokens)
        scale = np.where(usage > 0, usage / np.maximum(events, 1), 1.0)
        scaled.append((in_window * scale)[events > 0])
        # A request seen without its token events (observed from spans): its usage when it
        # ended (whole token counts: their sum is exact in any order).
        unseen = (events == 0) & b.ok & inside(b.done_ns, window)
        unseen_tokens += float(usage[unseen].sum())
        # The offered load spans the window unless the arrivals stopped inside it (a run
        # stopped by count drains its last requests inside the window): then it ends at the
        # last arrival.
        origin = b.origin_ns
        continued = continued or bool((present(origin) & (origin >= window.end_ns)).any())
        if picked.any():
            arrived = int(origin[picked].max()) + 1
            last = arrived if last is None else max(last, arrived)
        chosen_count += int(np.count_nonzero(picked))
    output_tokens = float(np.concatenate(scaled).sum()) if scaled else 0.0
    output_tokens += unseen_tokens
    last = window.start_ns + 1 if last is None else last
    arrivals = Window(window.start_ns, window.end_ns if continued else min(window.end_ns, last))
    burst = arrivals.duration_s < BURST_SHARE * window.duration_s
    offered = None if burst else chosen_count / arrivals.duration_s

    sends, last_send, busy_ns, backlog = 0, None, 0, 0
    for lo, hi in _blocks(len(t)):
        b, picked = t.block(lo, hi), chosen[lo:hi]
        attempts = attempted_ns(b)[picked]
        attempts = attempts[present(attempts)]
        sends += len(attempts)
        if len(attempts):
            latest = int(attempts.max())
            last_send = latest if last_send is None else max(last_send, latest)
        sent_at = present(b.sent_ns)
        starts, ends = b.sent_ns[sent_at], b.end_ns[sent_at]
        busy_ns += int(np.maximum(0, np.minimum(ends, window.end_ns)
                                  - np.maximum(starts, window.start_ns)).sum())
        backlog += (int(np.count_nonzero((starts <= arrivals.end_ns) & (arrivals.end_ns < ends)))
                    - int(np.count_nonzero((starts <= window.start_ns)
                                           & (window.start_ns < ends))))
    sent = None if burst else _sent_rate(sends, last_send, arrivals)
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


def _blocks(n: int) -> list[tuple[int, int]]:
    return [(lo, min(lo + BLOCK_ROWS, n)) for lo in range(0, max(n, 1), BLOCK_ROWS)]


def inside(times: np.ndarray, window: Window) -> np.ndarray:
    """Where a timestamp column falls in `window` (never where it is missing)."""
    return (times >= window.start_ns) & (times < window.end_ns) & present(times)


def attempted_ns(t: RequestTable) -> np.ndarray:
    """When the client sent each request, or tried to: a request refused a connection was
    attempted when it failed (the target's fault, not the client's); MISSING: neither."""
    refused = np.isin(t.outcome, [OUTCOMES.index(str(o)) for o in NOT_CONNECTED])
    return np.where(present(t.sent_ns), t.sent_ns, np.where(refused, t.done_ns, MISSING))


def _sent_rate(sends: int, last_send: int | None, arrivals: Window) -> float:
    """The rate at which the client sent what the schedule offered in `arrivals`: the
    `sends` it made (or tried to), the last at `last_send`, over the arrivals' span
    stretched to that last send; a client that keeps the schedule sends at the offered
    rate."""
    end = max(arrivals.end_ns, last_send + 1 if last_send is not None else arrivals.end_ns)
    return sends / ((end - arrivals.start_ns) / 1e9)


@dataclass(frozen=True, slots=True)
class ZeroGaps:
    """The gaps between the token events of some requests: how many, and how many were 0 (the
    event came in the same socket read as the one before)."""

    zero: int
    gaps: int

    @property
    def share(self) -> float | None:
        return self.zero / self.gaps if self.gaps else None


def zero_gaps(records: Sequence[RequestTimeline] | RequestTable,
              rows: np.ndarray | None = None) -> ZeroGaps:
    """The gaps between each request's token events, and the zero ones, over the requests
    where `rows` is true (all without it)."""
    t = as_table(records)
    chosen = np.ones(len(t), bool) if rows is None else rows
    same = np.zeros(len(t.token_ns), bool)  # at j: event j came in event j − 1's read
    same[1:] = t.token_ns[1:] == t.token_ns[:-1]
    same[t.token_offsets[:-1][t.events > 0]] = False  # a request's first event has no gap
    return ZeroGaps(int(per_request(same, t.token_offsets)[chosen].sum()),
                    int(np.maximum(t.events - 1, 0)[chosen].sum()))


def zero_gap_share(records: Sequence[RequestTimeline] | RequestTable,
                   window: Window | None = None) -> float | None:
    """Share of gaps between a request's token events that are exactly zero (same read),
    over the requests scheduled in `window` (all without one)."""
    t = as_table(records)
    return zero_gaps(t, None if window is None else inside(t.origin_ns, window)).share
