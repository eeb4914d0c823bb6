"""The per-request metrics of one timeline, exactly as `formulas.FORMULAS` defines them."""

from __future__ import annotations

from dataclasses import dataclass

from latlab.records.timeline import NS_PER_MS, RequestTimeline, ms_between


@dataclass(slots=True)
class RequestMetrics:
    """TTFT, E2E (from send and from schedule), TPOT, ITL and gaps; `None` where undefined."""

    ttft: float | None
    ttft_sched: float | None
    e2e: float | None
    e2e_sched: float | None
    tpot: float | None
    lateness: float | None
    itl: list[float]
    chunk_gaps: list[float]
    output_tokens: int | None

    @property
    def itl_mean(self) -> float | None:
        return sum(self.itl) / len(self.itl) if self.itl else None

    @property
    def itl_max(self) -> float | None:
        return max(self.itl, default=None)


def request_metrics(r: RequestTimeline) -> RequestMetrics:
    ok = r.ok
    output_tokens = r.output_tokens
    tpot = None
    if ok and output_tokens is not None and output_tokens >= 2:
        span = ms_between(r.last_token_ns, r.first_token_ns)
        tpot = span / (output_tokens - 1) if span is not None else None
    itl: list[float] = []
    gaps: list[float] = []
    times, counts = r.token_ns, r.token_counts
    for i in range(1, len(times)):
        gap = (times[i] - times[i - 1]) / NS_PER_MS
        gaps.append(gap)
        k = max(counts[i], 1)
        itl.extend([gap / k] * k)
    return RequestMetrics(
        ttft=ms_between(r.first_token_ns, r.sent_ns),
        ttft_sched=ms_between(r.first_token_ns, r.scheduled_ns),
        e2e=ms_between(r.done_ns, r.sent_ns) if ok else None,
        e2e_sched=ms_between(r.done_ns, r.scheduled_ns) if ok else None,
        tpot=tpot,
        lateness=ms_between(r.sent_ns, r.scheduled_ns),
        itl=itl,
        chunk_gaps=gaps,
        output_tokens=output_tokens,
    )
