"""Rules about how requests ended: failures and rejections."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from latlab.analysis.findings import Finding, Severity
from latlab.records.timeline import Outcome
from latlab.units import pct

if TYPE_CHECKING:
    from latlab.analysis.analyze import RunAnalysis

FAILURE_WARNING, FAILURE_CRITICAL = 0.01, 0.10
FAILURE_FIXES = {
    "timeout": "lower the load or find what the server waits on (see the queue share); "
               "raise the client timeout only if the SLO allows",
    "connection_refused": "check the server is up and its listen backlog and connection limits",
    "connection_reset": "check proxies' and the server's connection limits and idle timeouts",
    "http_5xx": "read the server's logs around the failed requests",
    "http_4xx": "fix the request payload (model name, max_tokens, context length)",
    "stream_broken": "look for proxies or the server closing streams mid-response",
    "unfinished": "the server stalled: see how long requests waited (queue) and its health; "
                  "a longer --drain only if the SLO allows",
    "empty": "the server answered 200 with nothing in it: read its logs for these requests",
}


def _severity(share: float) -> Severity:
    if share >= FAILURE_CRITICAL:
        return Severity.CRITICAL
    return Severity.WARNING if share >= FAILURE_WARNING else Severity.INFO


def judged(a: RunAnalysis) -> list:
    """The requests the summary judges: those of the window, less the ones the user
    cancelled."""
    return [row.record for row in a.measured if row.record.outcome != Outcome.CANCELLED]


def failures(a: RunAnalysis) -> Finding | None:
    records = judged(a)
    failed = [r for r in records if not r.ok and r.outcome != Outcome.HTTP_429]
    if not failed:
        return None
    share = len(failed) / len(records)
    classes = Counter(str(r.outcome) for r in failed)
    examples = {str(r.outcome): r.error for r in failed if r.error}
    rejected = sum(1 for r in records if r.outcome == Outcome.HTTP_429)
    evidence = [f"{len(failed)} of {len(records)} requests failed ({pct(share)})"
                + (f", besides {rejected} rejected with HTTP 429 (see rejections)"
                   if rejected else "")]
    evidence += [f"{cls}: {n}" + (f" (e.g. {examples[cls][:120]})" if cls in examples else "")
                 for cls, n in classes.most_common()]
    top = classes.most_common(1)[0][0]
    return Finding("failures", _severity(share), f"{pct(share)} of requests failed", evidence,
                   where="requests that never completed (infinitely slow in the failure-adjusted "
                         "percentiles)",
                   fix=FAILURE_FIXES.get(top, "look at the error messages in requests.jsonl"),
                   impact=share)


def rejections(a: RunAnalysis) -> Finding | None:
    records = judged(a)
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
