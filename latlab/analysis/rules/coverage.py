"""Rules about what the measurement covers: a cold start at the beginning of the run, and
time that neither the client nor the server accounts for."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from latlab.analysis.budget import prompt_buckets
from latlab.analysis.decompose import SERVER_STAGES
from latlab.analysis.findings import Finding, Severity, Unevaluated, mean
from latlab.metrics.stats import percentile
from latlab.units import ms, pct

if TYPE_CHECKING:
    from latlab.analysis.run_analysis import RunAnalysis

UNATTRIBUTED_SHARE = 0.05
COLD_REQUESTS, COLD_MIN_REQUESTS, COLD_FACTOR, COLD_EXCESS_MS = 3, 20, 3.0, 50.0
BURST_MS = 20.0


def _started_together(sent: np.ndarray) -> int:
    """How many requests were sent within BURST_MS of the first one (`sent` in send order)."""
    return int(np.count_nonzero(sent - sent[0] <= BURST_MS * 1e6))


def unattributed(a: RunAnalysis) -> Finding | None:
    if a.mean is None or not a.has_server_timings:
        return None
    share = a.mean.share("unattributed")
    if abs(share) < UNATTRIBUTED_SHARE:
        return None
    server = a.table.server
    timed = np.flatnonzero(a.ok & a.table.has_server & ~np.isnan(server["total"]))
    gaps = server["total"][timed] - sum(np.nan_to_num(server[st][timed])
                                        for st in (*SERVER_STAGES, "postprocess"))
    evidence = [f"unattributed: {ms(a.mean.components['unattributed'])} of a mean "
                f"{ms(a.mean.total)} ({pct(share)}); "
                f"{pct(a.tail.share('unattributed'))} of the tail"]
    if len(gaps):
        evidence.append(f"server total minus its stages: {ms(mean(gaps))} per request")
    return Finding("unattributed", Severity.WARNING,
                   f"{pct(share)} of the time is unattributed", evidence,
                   where="time neither the client nor the server's stage timings account for",
                   fix="make the server report every stage (and total), or look for proxies "
                       "between client and server",
                   impact=abs(share))


def cold_start(a: RunAnalysis) -> Finding | Unevaluated | None:
    """The first requests of the whole run (warmup included) against the later ones."""
    t, requests = a.table, a.requests
    ttft = requests.metrics.ttft
    rows = np.flatnonzero(requests.parts.decomposed & ~np.isnan(ttft))
    rows = rows[np.argsort(t.sent_ns[rows], kind="stable")]
    if len(rows) < COLD_MIN_REQUESTS:
        return Unevaluated("cold_start", f"needs ≥ {COLD_MIN_REQUESTS} successful requests to "
                                         f"set a warm baseline (has {len(rows)})")
    together = _started_together(t.sent_ns[rows])
    if together > COLD_REQUESTS:
        return Unevaluated("cold_start", f"the first {together} requests started together: "
                                         "their prefills shared the server, so their slowness "
                                         "is that burst, not a cold server (`latlab coldstart` "
                                         "measures cold starts)")
    # the server's own work when it says, else the client's TTFT
    prefill = t.server["prefill"]
    compute = np.where(t.has_server & ~np.isnan(prefill),
                       prefill + np.nan_to_num(t.server["preprocess"]), ttft)
    buckets = prompt_buckets(requests.prompt_tokens)
    cold, warm = rows[:COLD_REQUESTS], rows[COLD_REQUESTS:]
    evidence, excess = [], 0.0
    for i in cold:
        peers = warm[buckets[warm] == buckets[i]]
        baseline = np.sort(compute[peers if len(peers) >= 5 else warm])
        value, median = float(compute[i]), percentile(baseline, 50)
        if value >= COLD_FACTOR * median and value > percentile(baseline, 99) \
                and value - median >= COLD_EXCESS_MS:
            excess += value - median
            evidence.append(f"request #{t.index[i]}: {ms(value)} against a warm median of "
                            f"{ms(median)} (p99 {ms(percentile(baseline, 99))})")
    if not evidence:
        return None
    what = "prefill + preprocess (server)" if a.has_server_timings else "TTFT"
    evidence.insert(0, f"compared: {what} of the first {COLD_REQUESTS} requests sent")
    return Finding("cold_start", Severity.WARNING,
                   f"the first requests were slow: {ms(excess)} of cold-start excess", evidence,
                   where="cold start (lazy loading, compilation, caches filling)",
                   fix="warm the server up before taking traffic, keep instances warm",
                   impact=excess / (a.mean.total * len(rows)))
