"""Noisy neighbours: a heavy tenant's requests slow a light tenant's."""

from __future__ import annotations

from typing import TYPE_CHECKING

from latlab.analysis.budget import Row, in_flight_at, prompt_tokens
from latlab.analysis.findings import Finding, Severity, Unevaluated, mean
from latlab.metrics.stats import percentile
from latlab.units import ms

if TYPE_CHECKING:
    from latlab.analysis.analyze import RunAnalysis

TENANT_SIZE_RATIO, TENANT_SLOWDOWN, TENANT_MIN_MS, TENANT_MIN_REQUESTS = 2.0, 1.5, 10.0, 5


def noisy_neighbour(a: RunAnalysis) -> Finding | Unevaluated | None:
    tenants: dict[str, list[Row]] = {}
    for r in a.rows:
        if r.record.tenant is not None:
            tenants.setdefault(r.record.tenant, []).append(r)
    if len(tenants) < 2:
        return Unevaluated("noisy_neighbour", "needs requests from ≥ 2 tenants "
                                                  "(tenant labels in the workload)")
    size = {t: mean([(prompt_tokens(r) or 0) + (r.record.output_tokens or 0) for r in rs])
            for t, rs in tenants.items()}
    heavy, light = max(size, key=size.get), min(size, key=size.get)
    if size[heavy] < TENANT_SIZE_RATIO * max(size[light], 1):
        return None
    sent = [r.record for r in tenants[heavy] if r.record.sent_ns is not None]
    timed = [r for r in tenants[light] if r.metrics.ttft is not None]
    busy = in_flight_at([r.sent_ns for r in sent], [r.end_ns for r in sent],
                        [r.record.sent_ns for r in timed]) > 0
    alone = [r.metrics.ttft for r, b in zip(timed, busy) if not b]
    crowded = [r.metrics.ttft for r, b in zip(timed, busy) if b]
    if min(len(alone), len(crowded)) < TENANT_MIN_REQUESTS:
        return Unevaluated("noisy_neighbour", f"needs ≥ {TENANT_MIN_REQUESTS} requests of "
                           f"tenant {light!r} both with and without {heavy!r}'s requests in flight")
    quiet, busy = percentile(sorted(alone), 50), percentile(sorted(crowded), 50)
    if busy < TENANT_SLOWDOWN * quiet or busy - quiet < TENANT_MIN_MS:
        return None
    evidence = [f"{light!r} TTFT p50: {ms(quiet)} alone, {ms(busy)} while {heavy!r} has requests "
                f"in flight ({busy / quiet:.1f}×)",
                f"mean tokens per request: {heavy!r} {size[heavy]:.0f}, {light!r} {size[light]:.0f}"]
    evidence += [f"tenant {g.label!r}: TTFT p50 {ms(g.ttft['p50'])}, p99 {ms(g.ttft['p99'])}"
                 for g in a.by_tenant if g.ttft.n]
    return Finding("noisy_neighbour", Severity.WARNING,
                   f"heavy tenant {heavy!r} slows light tenant {light!r}", evidence,
                   where="queue and batching: head-of-line blocking behind big requests",
                   fix="per-tenant isolation: fair queueing, per-tenant concurrency limits",
                   impact=len(crowded) / len(a.rows))
