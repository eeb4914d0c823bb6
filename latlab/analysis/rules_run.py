"""Diagnosis rules about the run as a whole: failures, rejections, the client, overload,
unattributed time and cold starts. Each takes the analysis and returns a `Finding`, an
`Unevaluated` (what it would need) or None (evaluated, nothing to report)."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from latlab.analysis.budget import prompt_bucket, prompt_tokens
from latlab.analysis.decompose import SERVER_STAGES, Quality
from latlab.analysis.findings import Finding, Severity, Unevaluated, mean, ms, pct
from latlab.metrics import percentile, zero_gap_share
from latlab.records.timeline import Outcome

if TYPE_CHECKING:
    from latlab.analysis.run import RunAnalysis

FAILURE_WARNING, FAILURE_CRITICAL = 0.01, 0.10
CLIENT_LATE_MS, CLIENT_LATE_SHARE = 10.0, 0.05
SHORTFALL = 0.9
QUEUE_DOMINATES = 0.5
UNATTRIBUTED_SHARE = 0.05
COLD_REQUESTS, COLD_MIN_REQUESTS, COLD_FACTOR, COLD_EXCESS_MS = 3, 20, 3.0, 50.0

FAILURE_FIXES = {
    "timeout": "lower the load or find what the server waits on (see the queue share); "
               "raise the client timeout only if the SLO allows",
    "connection_refused": "check the server is up and its listen backlog and connection limits",
    "connection_reset": "check proxies' and the server's connection limits and idle timeouts",
    "http_5xx": "read the server's logs around the failed requests",
    "http_4xx": "fix the request payload (model name, max_tokens, context length)",
    "stream_broken": "look for proxies or the server closing streams mid-response",
}


def _severity(share: float) -> Severity:
    if share >= FAILURE_CRITICAL:
        return Severity.CRITICAL
    return Severity.WARNING if share >= FAILURE_WARNING else Severity.INFO


def failures(a: RunAnalysis) -> Finding | None:
    records = a.records
    failed = [r for r in records if not r.ok and r.outcome != Outcome.HTTP_429]
    if not failed:
        return None
    share = len(failed) / len(records)
    classes = Counter(str(r.outcome) for r in failed)
    examples = {str(r.outcome): r.error for r in failed if r.error}
    evidence = [f"{len(failed)} of {len(records)} requests failed ({pct(share)})"]
    evidence += [f"{cls}: {n}" + (f" (e.g. {examples[cls][:120]})" if cls in examples else "")
                 for cls, n in classes.most_common()]
    top = classes.most_common(1)[0][0]
    return Finding("failures", _severity(share), f"{pct(share)} of requests failed", evidence,
                   where="requests that never completed (infinitely slow in the failure-adjusted "
                         "percentiles)",
                   fix=FAILURE_FIXES.get(top, "look at the error messages in requests.jsonl"),
                   impact=share)


def rejections(a: RunAnalysis) -> Finding | None:
    records = a.records
    rejected = sum(1 for r in records if r.outcome == Outcome.HTTP_429)
    if not rejected:
        return None
    share = rejected / len(records)
    return Finding("rejections", _severity(share),
                   f"the server rejected {pct(share)} of requests (HTTP 429)",
                   [f"{rejected} of {len(records)} requests got 429 Too Many Requests"],
                   where="admission control: the server refused work it could not serve in time",
                   fix="offer less load or add capacity; clients should retry with backoff "
                       "(compare the failure-adjusted percentiles)",
                   impact=share)


def client_bottleneck(a: RunAnalysis) -> Finding | Unevaluated | None:
    """From the load generator's self-check when it wrote one, else from the records; critical
    when the client's wait before sending reaches CLIENT_LATE_SHARE of the mean E2E."""
    rows = [r for r in a.decomposed if r.parts.quality("client_wait") != Quality.UNAVAILABLE]
    waits = sorted(r.parts.ms("client_wait") for r in rows)
    p99 = percentile(waits, 99) if waits else 0.0
    share = p99 / a.mean.total if a.mean.total > 0 else 0.0
    late = [f"client wait (sent − scheduled − connection setup): p50 "
            f"{ms(percentile(waits, 50))}, p99 {ms(p99)} ({pct(share)} of the mean E2E)"] if waits else []
    where = "the load generator: requests left late, so latencies from send understate " \
            "what users would see"
    fix = "add client workers (--workers), raise the concurrency cap or lower the rate"
    severity = Severity.CRITICAL if share >= CLIENT_LATE_SHARE else Severity.WARNING
    client = a.client
    if client is not None and "bottleneck" in client:
        if not client["bottleneck"]:
            return None
        evidence = [str(reason) for reason in client.get("reasons") or []]
        evidence += late + ["client self-check: " + ", ".join(_numbers(client))]
        return Finding("client_bottleneck", severity, "the load generator itself is the bottleneck",
                       evidence, where=where, fix=fix, impact=share)
    if not rows:
        return Unevaluated("client_bottleneck", "needs scheduled send times or the client "
                                                "self-check (summary.json → client)")
    if p99 < CLIENT_LATE_MS or share < CLIENT_LATE_SHARE:
        return None
    bursts = zero_gap_share(a.records)
    if bursts is not None:
        late.append(f"{pct(bursts)} of token events arrived in zero-gap bursts")
    if a.config.get("concurrency"):
        late.append(f"includes waiting for a free slot under --max-concurrency "
                    f"{a.config['concurrency']}")
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


OVERLOAD_WHERE = {
    "queue & overhead": ("queue: the server accepts more work than it can serve",
                         "admission control (cap the queue, reject early with 429), priorities, "
                         "or more capacity; offer at most the achieved rate"),
    "decode": ("decode: the running batch grew until every step slowed down",
               "cap the running batch (max sequences) or concurrency per instance, add capacity"),
    "prefill": ("prefill: prompts arrive faster than they can be prefilled",
                "prefix caching, shorter prompts, more capacity"),
    "network": ("network: the link cannot carry the load", "move closer, more bandwidth"),
    "first token (unsplit)": ("before the first token (no server timings split it)",
                              "offer at most the achieved rate; add server timings to see more"),
}


def explodes_at_peak(a: RunAnalysis) -> Finding | Unevaluated | None:
    """Achieved below offered; the finding names the bucket the p99 tail spends most in."""
    t = a.summary.get("throughput")
    if isinstance(t, dict) and "offered_rate" in t and t["offered_rate"] is None:
        return None  # a burst: every request offered at once, nothing to fall behind of
    if not isinstance(t, dict) or not t.get("offered_rate"):
        return Unevaluated("explodes_at_peak", "needs the offered and achieved request rates "
                                               "(a measurement window: summary.json → throughput)")
    offered, achieved = t["offered_rate"], t.get("achieved_rate") or 0.0
    if not t.get("fell_behind", achieved < SHORTFALL * offered):
        return None
    if not a.has_server_timings:
        return Unevaluated("explodes_at_peak", f"achieved {achieved:.2f} of {offered:.2f} req/s "
                           "offered; needs server timings to tell where the time goes")
    buckets = a.tail.buckets()
    worst = max(buckets, key=buckets.get)
    share, tail = a.mean.share(worst), a.tail.share(worst)
    evidence = [f"achieved {achieved:.2f} req/s of {offered:.2f} offered ({pct(achieved / offered)})"
                + (f"; {t['backlog_growth']} more requests in flight at the last arrival "
                   "than at the window's start" if "backlog_growth" in t else ""),
                f"{worst}: {pct(share)} of the mean E2E, {pct(tail)} of the p99 tail's",
                f"up to {max(r.in_flight for r in a.rows)} requests in flight"]
    windows = [g for g in a.over_time if g.budget is not None]
    if len(windows) >= 2:
        first, last = windows[0], windows[-1]
        evidence.append(f"{worst} per request: {ms(first.budget.bucket(worst))} in {first.label} "
                        f"→ {ms(last.budget.bucket(worst))} in {last.label}")
    where, fix = OVERLOAD_WHERE[worst]
    title = (f"overloaded: {pct(share)} of the time is queueing and the server falls behind"
             if worst == "queue & overhead" and share >= QUEUE_DOMINATES else
             f"overloaded: the server completes {pct(achieved / offered)} of the offered rate")
    return Finding("explodes_at_peak", Severity.CRITICAL, title, evidence, where=where, fix=fix,
                   impact=1 - achieved / offered)


def unattributed(a: RunAnalysis) -> Finding | None:
    if a.mean is None or not a.has_server_timings:
        return None
    share = a.mean.share("unattributed")
    if abs(share) < UNATTRIBUTED_SHARE:
        return None
    gaps = [s.total - sum(getattr(s, st) or 0.0 for st in (*SERVER_STAGES, "postprocess"))
            for s in (r.record.server for r in a.decomposed) if s is not None and s.total is not None]
    evidence = [f"unattributed: {ms(a.mean.components['unattributed'])} of a mean "
                f"{ms(a.mean.total)} ({pct(share)}); {pct(a.tail.share('unattributed'))} of the tail"]
    if gaps:
        evidence.append(f"server total minus its stages: {ms(mean(gaps))} per request")
    return Finding("unattributed", Severity.WARNING,
                   f"{pct(share)} of the time is unattributed", evidence,
                   where="time neither the client nor the server's stage timings account for",
                   fix="make the server report every stage (and total), or look for proxies "
                       "between client and server",
                   impact=abs(share))


def cold_start(a: RunAnalysis) -> Finding | Unevaluated | None:
    """The first requests of the whole run (warmup included) against the later ones."""
    rows = sorted((r for r in a.rows if r.parts is not None and r.metrics.ttft is not None),
                  key=lambda r: r.record.sent_ns)
    if len(rows) < COLD_MIN_REQUESTS:
        return Unevaluated("cold_start", f"needs ≥ {COLD_MIN_REQUESTS} successful requests to "
                                         f"set a warm baseline (has {len(rows)})")

    def compute(row) -> float:  # the server's own work when it says, else the client's TTFT
        s = row.record.server
        if s is not None and s.prefill is not None:
            return s.prefill + (s.preprocess or 0.0)
        return row.metrics.ttft

    cold, warm = rows[:COLD_REQUESTS], rows[COLD_REQUESTS:]
    evidence, excess = [], 0.0
    for row in cold:
        bucket = prompt_bucket(prompt_tokens(row))
        peers = [r for r in warm if prompt_bucket(prompt_tokens(r)) == bucket]
        baseline = sorted(compute(r) for r in (peers if len(peers) >= 5 else warm))
        value, median = compute(row), percentile(baseline, 50)
        if value >= COLD_FACTOR * median and value > percentile(baseline, 99) \
                and value - median >= COLD_EXCESS_MS:
            excess += value - median
            evidence.append(f"request #{row.record.index}: {ms(value)} against a warm median of "
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
