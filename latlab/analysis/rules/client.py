"""The load generator as the bottleneck: from its self-check, else from late sends."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from latlab.analysis.decompose import UNAVAILABLE
from latlab.analysis.findings import Finding, Severity, Unevaluated
from latlab.metrics.stats import percentile, tail_exceeds
from latlab.metrics.throughput import zero_gap_share
from latlab.units import ms, pct

if TYPE_CHECKING:
    from latlab.analysis.run_analysis import RunAnalysis

CLIENT_LATE_MS, CLIENT_LATE_SHARE = 10.0, 0.05


def client_bottleneck(a: RunAnalysis) -> Finding | Unevaluated | None:
    """From the load generator's self-check when it wrote one, else from the records; critical
    when the client's wait before sending reaches CLIENT_LATE_SHARE of the mean E2E."""
    parts = a.requests.parts
    rows = a.ok & (parts.quality["client_wait"] != UNAVAILABLE)
    waits = np.sort(parts.value("client_wait", rows))
    p99 = percentile(waits, 99) if len(waits) else 0.0
    share = p99 / a.mean.total if a.mean.total > 0 else 0.0
    late = [f"client wait (sent − scheduled − connection setup): p50 "
            f"{ms(percentile(waits, 50))}, p99 {ms(p99)} ({pct(share)} of the mean E2E)"
            ] if len(waits) else []
    where = "the load generator: requests left late, so latencies from send understate " \
            "what users would see"
    fix = "add client workers (--workers), raise the concurrency cap or lower the rate"
    # critical only on evidence: a p99 resting on one late send is not a verdict
    severe = a.mean.total > 0 and tail_exceeds(waits, 99, CLIENT_LATE_SHARE * a.mean.total)
    severity = Severity.CRITICAL if severe else Severity.WARNING
    client = a.client
    if client is not None:
        if not client.bottleneck:
            return None
        evidence = list(client.reasons)
        evidence += late + ["client self-check: " + ", ".join(_numbers(client.model_dump()))]
        return Finding("client_bottleneck", severity, "the load generator itself is the bottleneck",
                       evidence, where=where, fix=fix, impact=share)
    if not rows.any():
        return Unevaluated("client_bottleneck", "needs scheduled send times or the client "
                                                "self-check (summary.json → client)")
    if not tail_exceeds(waits, 99, max(CLIENT_LATE_MS, CLIENT_LATE_SHARE * a.mean.total)):
        return None
    bursts = zero_gap_share(a.table)
    if bursts is not None:
        late.append(f"{pct(bursts)} of token events arrived in zero-gap bursts")
    if a.config.concurrency:
        late.append(f"includes waiting for a free slot under --max-concurrency "
                    f"{a.config.concurrency}")
    return Finding("client_bottleneck", severity,
                   f"requests left the client late (p99 {ms(p99)} after their schedule)", late,
                   where=where, fix=fix, impact=share)


def _numbers(section: dict, prefix: str = "") -> list[str]:
    """`name=value` for every number in the section, one level of nesting deep."""
    out = []
    for key, value in section.items():
        if isinstance(value, dict) and not prefix:
            out += _numbers(value, f"{key}.")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out.append(f"{prefix}{key}={value:.3g}")
    return out
