"""Rules about waiting: overload (the target falls behind), queueing that grows with load,
and small requests that wait longer than they compute."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from latlab.analysis.findings import Finding, Severity, Unevaluated, mean
from latlab.analysis.rules.common import NEEDS_SERVER, server_rows
from latlab.units import ms, pct

if TYPE_CHECKING:
    from latlab.analysis.run_analysis import RunAnalysis

QUEUE_DOMINATES = 0.5
TINY_TOKENS, TINY_MIN_REQUESTS, TINY_WAIT_MS, TINY_WAIT_SHARE = 128, 3, 20.0, 0.5
LOAD_GROWTH, LOAD_WAIT_MS, LOAD_SHARE, LOAD_SHARE_RISE = 2.0, 10.0, 0.2, 0.2

OVERLOAD_WHERE = {
    "queue & overhead": ("queue: the server accepts more work than it can serve",
                         "admission control (cap the queue, reject early with 429), priorities, "
                         "or more capacity; offer at most the achieved rate"),
    "decode": ("decode: the running batch grew until every step slowed down",
               "cap the running batch (max sequences) or concurrency per instance, add capacity"),
    "prefill": ("prefill: prompts arrive faster than they can be prefilled",
                "prefix caching, shorter prompts, more capacity"),
    "network": ("network: the link cannot carry the load", "move closer, more bandwidth"),
    "gateway": ("gateway: the gateway in front of the engine holds requests before and after it",
                "give the gateway more workers or CPU, or send to the engine directly"),
    "first token (unsplit)": ("before the first token (no server timings split it)",
                              "offer at most the achieved rate; add server timings to see more"),
    "model server (unsplit)": ("the model server (its own spans were not seen to split it)",
                               "offer at most the achieved rate; export the model server's "
                               "spans to see more"),
}
OVERLOAD_ELSEWHERE = ("{bucket}: it grew with the load", "offer at most the achieved rate, or "
                      "add capacity where it goes")


def overload(a: RunAnalysis) -> Finding | Unevaluated | None:
    """Achieved below offered; the finding names the bucket the p99 tail spends most in."""
    t = a.summary.throughput
    if t is None:
        return Unevaluated("overload", "needs the offered and achieved request rates "
                                       "(a measurement window: summary.json → throughput)")
    if not t.offered_rate:
        return None  # a burst: every request offered at once, nothing to fall behind of
    offered, achieved = t.offered_rate, t.achieved_rate
    if not t.fell_behind:
        return None
    if not a.has_server_timings:
        return Unevaluated("overload", f"achieved {achieved:.2f} of {offered:.2f} req/s "
                           "offered; needs server timings to tell where the time goes")
    buckets = a.tail.buckets()
    worst = max(buckets, key=buckets.get)
    share, tail = a.mean.share(worst), a.tail.share(worst)
    evidence = [f"achieved {achieved:.2f} req/s of {offered:.2f} offered "
                f"({pct(achieved / offered)})"
                + f"; {t.backlog_growth} more requests in flight at the last arrival than at "
                  "the window's start",
                f"{worst}: {pct(share)} of the mean E2E, {pct(tail)} of the p99 tail's",
                f"up to {int(a.requests.in_flight.max())} requests in flight"]
    windows = [g for g in a.over_time if g.budget is not None]
    if len(windows) >= 2:
        first, last = windows[0], windows[-1]
        evidence.append(f"{worst} per request: {ms(first.budget.bucket(worst))} in {first.label} "
                        f"→ {ms(last.budget.bucket(worst))} in {last.label}")
    where, fix = OVERLOAD_WHERE.get(worst, (OVERLOAD_ELSEWHERE[0].format(bucket=worst),
                                            OVERLOAD_ELSEWHERE[1]))
    title = (f"overloaded: {pct(share)} of the time is queueing and the server falls behind"
             if worst == "queue & overhead" and share >= QUEUE_DOMINATES else
             f"overloaded: the server completes {pct(achieved / offered)} of the offered rate")
    return Finding("overload", Severity.CRITICAL, title, evidence, where=where, fix=fix,
                   impact=1 - achieved / offered)


def queueing_under_load(a: RunAnalysis) -> Finding | Unevaluated | None:
    rows = np.flatnonzero(server_rows(a))
    if not len(rows):
        return Unevaluated("queueing_under_load", NEEDS_SERVER + " (queue)")
    parts, in_flight = a.requests.parts, a.requests.in_flight

    def waiting(group: np.ndarray) -> tuple[float, float]:
        w = mean(parts.value("queue", group) + parts.value("client_wait", group))
        return w, w / mean(parts.total[group])

    evidence, fired, impact, evaluated = [], False, 0.0, False
    by_load = rows[np.argsort(in_flight[rows], kind="stable")]
    k = len(by_load) // 3
    if k >= 3:
        low, high = by_load[:k], by_load[-k:]
        lo_n, hi_n = mean(in_flight[low]), mean(in_flight[high])
        if hi_n - lo_n >= 1:
            evaluated = True
            (lw, ls), (hw, hs) = waiting(low), waiting(high)
            evidence.append(f"queue + client wait at ≈{lo_n:.0f} in flight: {ms(lw)} ({pct(ls)} of "
                            f"E2E); at ≈{hi_n:.0f} in flight: {ms(hw)} ({pct(hs)})")
            if hw >= LOAD_GROWTH * lw and hw - lw >= LOAD_WAIT_MS and hs >= LOAD_SHARE:
                fired, impact = True, hs
    windows = [g for g in a.over_time if g.budget is not None]
    if len(windows) >= 2:
        evaluated = True
        first, last = windows[0].budget, windows[-1].budget
        fw, lw = (b.components["queue"] + b.components["client_wait"] for b in (first, last))
        fs, ls = fw / first.total, lw / last.total
        evidence.append(f"queue + client wait over time: {ms(fw)} ({pct(fs)}) in "
                        f"{windows[0].label} → {ms(lw)} ({pct(ls)}) in {windows[-1].label}")
        if ls >= fs + LOAD_SHARE_RISE and lw >= LOAD_GROWTH * fw and lw - fw >= LOAD_WAIT_MS:
            fired, impact = True, max(impact, ls)
    if not evaluated:
        return Unevaluated("queueing_under_load", "needs requests at different load levels "
                           "(in-flight counts) or a run long enough for ≥ 2 time windows")
    if not fired:
        return None
    return Finding("queueing_under_load", Severity.WARNING,
                   "fine alone, bad under load: queueing grows with load", evidence,
                   where="queue (and autoscaling lag, if any)",
                   fix="scale out earlier, cap concurrency per instance", impact=impact)


def slow_small_requests(a: RunAnalysis) -> Finding | Unevaluated | None:
    rows = server_rows(a)
    if not rows.any():
        return Unevaluated("slow_small_requests", NEEDS_SERVER)
    tokens = np.nan_to_num(a.requests.prompt_tokens)
    tiny = rows & (tokens > 0) & (tokens <= TINY_TOKENS)  # no count: not known to be tiny
    if tiny.sum() < TINY_MIN_REQUESTS:
        return Unevaluated("slow_small_requests", f"needs ≥ {TINY_MIN_REQUESTS} successful "
                                                f"requests of ≤ {TINY_TOKENS} prompt tokens")
    p = a.requests.parts
    waits = {
        "network": mean(p.value("connect", tiny) + p.value("network", tiny)),
        "queue": mean(p.value("client_wait", tiny) + p.value("queue", tiny)),
        "preprocess": mean(p.value("preprocess", tiny)),
    }
    wait, prefill = sum(waits.values()), mean(p.value("prefill", tiny))
    if wait < TINY_WAIT_MS or wait < TINY_WAIT_SHARE * (wait + prefill):
        return None
    worst = max(waits, key=waits.get)
    fixes = {"network": "move the client closer to the server, reuse connections (keep-alive)",
             "queue": "cap the queue depth and add capacity: short requests wait behind others",
             "preprocess": "speed up request handling (tokenizer, chat template, validation)"}
    evidence = [f"{int(tiny.sum())} requests with ≤ {TINY_TOKENS} prompt tokens: {ms(wait)} "
                f"before any compute against {ms(prefill)} of prefill "
                f"({pct(wait / (wait + prefill))} waiting)"]
    evidence += [f"{name}: {ms(v)}" for name, v in waits.items()]
    return Finding("slow_small_requests", Severity.WARNING,
                   f"slow even for tiny prompts: {ms(wait)} before the first token is computed",
                   evidence, where=worst, fix=fixes[worst],
                   impact=wait / mean(p.total[tiny]))
