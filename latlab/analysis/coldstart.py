"""Cold start from the probes of each start: the first request against the warm median after
it, the requests after idle gaps, and the spread over the starts (`coldstart.json`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from latlab.metrics.request import request_metrics
from latlab.records.coldstart import (
    ColdstartRecord,
    Excess,
    FirstRequest,
    IdleProbe,
    IdleSpread,
    Spread,
    Start,
    WarmBaseline,
)
from latlab.records.timeline import RequestTimeline


def summarize_start(i: int, ready_s: float | None, records: Sequence[RequestTimeline],
                    warm_requests: int, idle_gaps_s: Sequence[float]) -> Start:
    """Start `i`'s first request, its warm baseline (the median of the `warm_requests` after
    it) and the probes after each idle gap, each with its excess over the baseline."""
    metrics = [request_metrics(r) for r in records]
    first = metrics[0]
    warm = metrics[1:1 + warm_requests]
    baseline = {name: _median([getattr(m, name) for m in warm]) for name in ("ttft", "e2e")}

    def excess(value: float | None, name: str) -> float | None:
        return None if value is None or baseline[name] is None else value - baseline[name]

    idle = [IdleProbe(gap_s=gap, id=r.id, ok=r.ok, ttft=m.ttft, e2e=m.e2e,
                      excess_ttft=excess(m.ttft, "ttft"), excess_e2e=excess(m.e2e, "e2e"))
            for gap, r, m in zip(idle_gaps_s, records[1 + warm_requests:],
                                 metrics[1 + warm_requests:])]
    head = records[0]
    return Start(
        run=i + 1, ready_s=ready_s,
        first=FirstRequest(id=head.id, ok=head.ok, error=head.error, ttft=first.ttft,
                           e2e=first.e2e),
        warm=WarmBaseline(**baseline, n=sum(1 for m in warm if m.e2e is not None),
                          ids=[r.id for r in records[1:1 + warm_requests]]),
        excess=Excess(ttft=excess(first.ttft, "ttft"), e2e=excess(first.e2e, "e2e")),
        idle=idle, error=None if head.ok else f"first request failed: {head.outcome}: {head.error}")


def spread(values: Sequence[float | None]) -> Spread:
    """Median, min and max over the starts that have the value."""
    present = [v for v in values if v is not None]
    if not present:
        return Spread(n=0, median=None, min=None, max=None)
    return Spread(n=len(present), median=float(np.median(present)), min=min(present),
                  max=max(present))


SUMMARY_FIELDS = {"first_ttft": ("first", "ttft"), "warm_ttft": ("warm", "ttft"),
                  "excess_ttft": ("excess", "ttft"), "first_e2e": ("first", "e2e"),
                  "warm_e2e": ("warm", "e2e"), "excess_e2e": ("excess", "e2e")}


def coldstart_record(target: dict[str, Any], starts: Sequence[Start],
                     idle_gaps_s: Sequence[float], interrupted: bool) -> ColdstartRecord:
    """coldstart.json: every start and the spread of each measure over them."""
    summary = {"ready_s": spread([s.ready_s for s in starts])}
    for key, (part, field) in SUMMARY_FIELDS.items():
        summary[key] = spread([getattr(getattr(s, part), field) for s in starts])
    idle = [IdleSpread(gap_s=gap, **{k: spread([getattr(s.idle[j], k) for s in starts
                                                 if len(s.idle) > j])
                                     for k in ("ttft", "excess_ttft", "e2e", "excess_e2e")})
            for j, gap in enumerate(idle_gaps_s)]
    return ColdstartRecord(target=target, runs=list(starts), summary=summary, idle=idle,
                           interrupted=interrupted)


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return float(np.median(present)) if present else None
