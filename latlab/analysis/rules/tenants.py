"""Noisy neighbours: a heavy tenant's requests slow a light tenant's."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from latlab.analysis.advice import fair_queueing, joined
from latlab.analysis.findings import Finding, Severity, Unevaluated, mean
from latlab.analysis.requests import in_flight_at
from latlab.metrics.stats import percentile
from latlab.records.columns import present
from latlab.units import ms

if TYPE_CHECKING:
    from latlab.analysis.run_analysis import RunAnalysis

TENANT_SIZE_RATIO, TENANT_SLOWDOWN, TENANT_MIN_MS, TENANT_MIN_REQUESTS = 2.0, 1.5, 10.0, 5


def noisy_neighbour(a: RunAnalysis) -> Finding | Unevaluated | None:
    t, requests = a.table, a.requests
    codes, names = t.tenant.codes, t.tenant.names
    present_codes = np.unique(codes[codes >= 0])
    if len(present_codes) < 2:
        return Unevaluated("noisy_neighbour", "needs requests from ≥ 2 tenants "
                                                  "(tenant labels in the workload)")
    tokens = np.nan_to_num(requests.prompt_tokens) + np.nan_to_num(t.output_tokens)
    size = {names[c]: mean(tokens[codes == c]) for c in present_codes}
    heavy, light = max(size, key=size.get), min(size, key=size.get)
    if size[heavy] < TENANT_SIZE_RATIO * max(size[light], 1):
        return None
    sent = t.tenant.mask(heavy) & present(t.sent_ns)
    ttft = requests.metrics.ttft
    timed = t.tenant.mask(light) & ~np.isnan(ttft)
    busy = in_flight_at(t.sent_ns[sent], t.end_ns[sent], t.sent_ns[timed]) > 0
    alone, crowded = ttft[timed][~busy], ttft[timed][busy]
    if min(len(alone), len(crowded)) < TENANT_MIN_REQUESTS:
        return Unevaluated("noisy_neighbour", f"needs ≥ {TENANT_MIN_REQUESTS} requests of "
                           f"tenant {light!r} both with and without {heavy!r}'s requests in flight")
    quiet, busy = percentile(np.sort(alone), 50), percentile(np.sort(crowded), 50)
    if busy < TENANT_SLOWDOWN * quiet or busy - quiet < TENANT_MIN_MS:
        return None
    evidence = [f"{light!r} TTFT p50: {ms(quiet)} alone, {ms(busy)} while {heavy!r} has requests "
                f"in flight ({busy / quiet:.1f}×)",
                f"mean tokens per request: {heavy!r} {size[heavy]:.0f}, "
                f"{light!r} {size[light]:.0f}"]
    evidence += [f"tenant {g.label!r}: TTFT p50 {ms(g.ttft['p50'])}, p99 {ms(g.ttft['p99'])}"
                 for g in a.by_tenant if g.ttft.n]
    fix, tries = joined(fair_queueing(a))
    return Finding("noisy_neighbour", Severity.WARNING,
                   f"heavy tenant {heavy!r} slows light tenant {light!r}", evidence,
                   where="queue and batching: head-of-line blocking behind big requests",
                   fix=fix, tries=tries, metric=("ttft", "p50"),
                   impact=len(crowded) / len(t))
