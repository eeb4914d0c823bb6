"""Latency that grows with the traffic over the day: the busiest windows against the quietest
("fine at night, latency explodes at peak hours"). It reads a run's time windows, or the
windows `latlab observe` kept of a service's own traffic (`peak_finding`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from latlab.analysis.findings import Finding, Severity, Unevaluated, mean
from latlab.units import ms, pct

if TYPE_CHECKING:
    from latlab.analysis.run_analysis import RunAnalysis

MIN_WINDOWS = 3
PEAK_RATE_RATIO = 1.5  # the busiest third of the windows: this many times the quietest's rate
PEAK_LATENCY_GROWTH = 2.0  # ... and its p99 E2E is this many times theirs
EXPLODES = 5.0  # from this growth on it is critical

FIXES = {
    "queue & overhead": "scale out ahead of the peak (autoscale on queue depth, or on a "
                        "schedule), admission control, priorities for interactive traffic",
    "decode": "cap the running batch (max sequences) per instance, add capacity for the peak",
    "prefill": "prefix caching, chunked prefill, add capacity for the peak",
    "network": "more bandwidth or closer clients: the link saturates at peak",
    "gateway": "the gateway in front of the engine slows at peak: give it more workers or CPU",
    "application": "the application's own work grows with load: profile it at peak",
}


@dataclass(slots=True)
class Slice:
    """A time window: its label, rate (requests/s), p99 E2E (ms) and each bucket's share of
    its mean E2E."""

    label: str
    rate: float
    p99: float
    shares: dict[str, float]


def peak_hours(a: RunAnalysis) -> Finding | Unevaluated | None:
    slices = [Slice(g.label, g.n / g.seconds, g.e2e["p99"], {b: g.budget.share(b)
                                                            for b in g.budget.buckets()})
              for g in a.over_time if g.budget is not None and g.e2e["p99"] is not None
              and g.seconds]
    return peak_finding(slices)


def peak_finding(slices: Sequence[Slice]) -> Finding | Unevaluated | None:
    """Latency against rate over `slices`: the busiest third against the quietest."""
    if len(slices) < MIN_WINDOWS:
        return Unevaluated("peak_hours", f"needs ≥ {MIN_WINDOWS} time windows with successful "
                                         "requests")
    ordered = sorted(slices, key=lambda s: s.rate)
    k = max(1, len(ordered) // 3)
    quiet, busy = ordered[:k], ordered[-k:]
    rq, rb = mean([s.rate for s in quiet]), mean([s.rate for s in busy])
    lq, lb = mean([s.p99 for s in quiet]), mean([s.p99 for s in busy])
    if rb < PEAK_RATE_RATIO * rq or lb < PEAK_LATENCY_GROWTH * lq:
        return None
    buckets = {b for s in slices for b in s.shares}
    share = {b: (mean([s.shares.get(b, 0.0) for s in quiet]),
                 mean([s.shares.get(b, 0.0) for s in busy])) for b in buckets}
    worst = max(share, key=lambda b: share[b][1] - share[b][0])
    before, at_peak = share[worst]
    evidence = [f"busiest {k} window{'s' * (k > 1)} ({', '.join(s.label for s in busy)}): "
                f"{rb:.3g} req/s, p99 E2E {ms(lb)}",
                f"quietest {k} window{'s' * (k > 1)} ({', '.join(s.label for s in quiet)}): "
                f"{rq:.3g} req/s, p99 E2E {ms(lq)}",
                f"{worst}: {pct(before)} of the mean E2E when quiet, {pct(at_peak)} at peak"]
    return Finding("peak_hours", Severity.CRITICAL if lb >= EXPLODES * lq else Severity.WARNING,
                   f"latency explodes at peak hours: p99 E2E {ms(lb)} at {rb:.3g} req/s "
                   f"against {ms(lq)} at {rq:.3g} req/s", evidence, where=worst,
                   fix=FIXES.get(worst, "add capacity for the peak"), impact=at_peak)
