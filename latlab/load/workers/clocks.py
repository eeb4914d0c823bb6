"""Another machine's monotonic clock against this one's, and moving its stamps over.

Each node's `perf_counter_ns` counts from its own boot, so a node's stamps mean nothing on
the driver until shifted by the node's offset. The offset is estimated as NTP and Cristian
do: read the remote clock between two local reads; the remote reading lies within that
round trip, so `offset = remote − (t1 + t2) / 2` is off by at most half of it. Of several
round trips, the one with the smallest delay gives the tightest bound.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from time import perf_counter_ns

from latlab.records.health import WorkerHealth
from latlab.records.timeline import RequestTimeline

ROUND_TRIPS = 16


@dataclass(frozen=True)
class Offset:
    """The remote clock minus the local one; the true value lies within ± `uncertainty_ns`."""

    offset_ns: int
    uncertainty_ns: int


def estimate_offset(remote_now: Callable[[], int], round_trips: int = ROUND_TRIPS) -> Offset:
    """The remote clock's offset from `round_trips` readings of `remote_now()` (a call that
    returns the remote `perf_counter_ns`), keeping the one with the shortest round trip."""
    best: tuple[int, int] | None = None
    for _ in range(round_trips):
        t1 = perf_counter_ns()
        remote = remote_now()
        t2 = perf_counter_ns()
        if best is None or t2 - t1 < best[0]:
            best = (t2 - t1, remote - (t1 + t2) // 2)
    assert best is not None, "round_trips must be at least 1"
    return Offset(offset_ns=best[1], uncertainty_ns=(best[0] + 1) // 2)


def shift_record(r: RequestTimeline, delta_ns: int) -> RequestTimeline:
    """`r` with every stamp moved by `delta_ns`: each `*_ns` field of the record and of its
    session step (durations, such as the connection phases, stay as they are)."""
    for part in (r, r.session) if delta_ns else ():
        for f in fields(part) if part is not None else ():
            value = getattr(part, f.name)
            if f.name.endswith("_ns") and isinstance(value, int):
                setattr(part, f.name, value + delta_ns)
            elif f.name.endswith("_ns") and isinstance(value, list):
                setattr(part, f.name, [t + delta_ns for t in value])
    return r


def shift_health(h: WorkerHealth, delta_ns: int) -> WorkerHealth:
    """`h` with the stamps of its samples moved by `delta_ns`."""
    if delta_ns:
        h.loop_lag_at_ns = [t + delta_ns for t in h.loop_lag_at_ns]
        h.dispatch_at_ns = [t + delta_ns for t in h.dispatch_at_ns]
    return h
