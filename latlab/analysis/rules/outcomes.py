"""Rules about how requests ended: failures and rejections."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import numpy as np
import pyarrow.compute as pc

from latlab.analysis.findings import Finding, Severity
from latlab.records.table import OUTCOMES
from latlab.records.timeline import Outcome
from latlab.units import pct

if TYPE_CHECKING:
    from latlab.analysis.run_analysis import RunAnalysis

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
NO_ROUTE_FIX = ("the server has no such endpoint: check --api (completions, chat, ollama, "
                "ollama-chat, sglang) against what it serves, and --url")
NO_MODEL_FIX = "the server does not serve that model: --model NAME as it names it"
LENGTH_FIX = ("the server refuses latlab's length controls: --no-ignore-eos (the output length "
              "then rests on max_tokens)")


def _severity(share: float) -> Severity:
    if share >= FAILURE_CRITICAL:
        return Severity.CRITICAL
    return Severity.WARNING if share >= FAILURE_WARNING else Severity.INFO


def judged(a: RunAnalysis) -> np.ndarray:
    """The requests the summary judges (a mask): those of the window, less the ones the
    user cancelled."""
    return a.inside & (a.table.outcome != OUTCOMES.index(Outcome.CANCELLED))


def failures(a: RunAnalysis) -> Finding | None:
    t = a.table
    records = judged(a)
    rejected_code = OUTCOMES.index(Outcome.HTTP_429)
    failed = records & ~t.ok & (t.outcome != rejected_code)
    if not failed.any():
        return None
    share = int(failed.sum()) / int(records.sum())
    codes, first, counts = np.unique(t.outcome[failed], return_index=True, return_counts=True)
    classes = Counter({OUTCOMES[c]: int(n) for c, n, _ in
                       sorted(zip(codes, counts, first), key=lambda x: x[2])})
    errors = pc.fill_null(pc.utf8_length(t.text["error"]), 0).to_numpy() > 0
    examples = {}
    for code in codes:  # the last error message of each class
        last = np.flatnonzero(failed & errors & (t.outcome == code))
        if len(last):
            examples[OUTCOMES[code]] = t.text["error"][int(last[-1])].as_py()
    rejected = int((records & (t.outcome == rejected_code)).sum())
    evidence = [f"{int(failed.sum())} of {int(records.sum())} requests failed ({pct(share)})"
                + (f", besides {rejected} rejected with HTTP 429 (see rejections)"
                   if rejected else "")]
    evidence += [f"{cls}: {n}" + (f" (e.g. {examples[cls][:120]})" if cls in examples else "")
                 for cls, n in classes.most_common()]
    top = classes.most_common(1)[0][0]
    return Finding("failures", _severity(share), f"{pct(share)} of requests failed", evidence,
                   where="requests that never completed (infinitely slow in the failure-adjusted "
                         "percentiles)",
                   fix=_fix(a, failed, top, examples.get(top) or ""), impact=share)


def _fix(a: RunAnalysis, failed: np.ndarray, top: str, example: str) -> str:
    """What to try first for the most common failure class: a client error is told apart by
    its status (no such endpoint) or its message (length controls refused)."""
    if top == str(Outcome.HTTP_4XX):
        statuses = a.table.status[failed & (a.table.outcome == OUTCOMES.index(top))]
        codes, counts = np.unique(statuses[~np.isnan(statuses)], return_counts=True)
        if len(codes) and int(codes[np.argmax(counts)]) in (404, 405):
            return NO_MODEL_FIX if "model" in example.lower() else NO_ROUTE_FIX
        if "ignore_eos" in example or "min_tokens" in example:
            return LENGTH_FIX
    return FAILURE_FIXES.get(top, "look at the error messages in requests.jsonl")


def rejections(a: RunAnalysis) -> Finding | None:
    records = judged(a)
    rejected = int((records & (a.table.outcome == OUTCOMES.index(Outcome.HTTP_429))).sum())
    if not rejected:
        return None
    share = rejected / int(records.sum())
    return Finding("rejections", _severity(share),
                   f"the server rejected {pct(share)} of requests (HTTP 429)",
                   [f"{rejected} of {int(records.sum())} requests got 429 Too Many Requests"],
                   where="admission control: the server refused work it could not serve in time",
                   fix="offer less load or add capacity; clients should retry with backoff "
                       "(compare the failure-adjusted percentiles)",
                   impact=share)
