"""`summarize`: a run's summary over its measurement window (what summary.json holds)."""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from latlab.metrics.formulas import FORMULAS
from latlab.metrics.request import RequestMetrics, request_metrics
from latlab.metrics.sessions import reasoning_summary, session_summary
from latlab.metrics.slo import meets_slos
from latlab.metrics.stats import distribution
from latlab.metrics.throughput import SHORTFALL, throughput
from latlab.records.summary import ClientCheck, Goodput, RunSummary, WindowSpan
from latlab.records.timeline import Outcome, RequestTimeline
from latlab.records.window import Window

FAILURE_ADJUSTED = ("ttft", "ttft_sched", "e2e", "e2e_sched")
CACHED_SHARE_WARNING = 0.5


def judge(ok: Sequence[tuple[RequestTimeline, RequestMetrics]], failed: int,
          window: Window | None, slos: Mapping[str, float]) -> Goodput:
    """Goodput: the successful requests (with their metrics) that met every SLO, as a share
    of the window's ok + `failed` requests and per second of the window."""
    good = [r for r, m in ok if meets_slos(m, slos)]
    good_done = sum(1 for r in good if window is None or r.done_ns in window)
    return Goodput(slos=dict(slos), good=len(good),
                   fraction=len(good) / (len(ok) + failed) if ok or failed else 0.0,
                   requests_per_s=good_done / window.duration_s if window else None)


def summarize(
    records: Sequence[RequestTimeline],
    window: Window | None = None,
    slos: dict[str, float] | None = None,
    *,
    client: ClientCheck | None = None,
    stop_reason: str | None = None,
    notes: Sequence[str] = (),
    concurrency_cap: int | None = None,
) -> RunSummary:
    """The summary over the requests scheduled inside `window` (all when None). `client`
    (the self-check), `stop_reason` and `notes` (the load's own messages, first among the
    warnings) come from the load generator when it ran the records; `concurrency_cap` is
    the open loop's --max-concurrency, which holds sends back by design."""
    chosen = [r for r in records if window is None or r.origin_ns in window]
    metrics = [request_metrics(r) for r in chosen]
    ok = [(r, m) for r, m in zip(chosen, metrics) if r.ok]
    failed = [r for r in chosen if not r.ok and r.outcome != Outcome.CANCELLED]
    cancelled = len(chosen) - len(ok) - len(failed)  # by the user: neither ok nor failed

    failures: dict[str, int] = {}
    for r in failed:
        failures[str(r.outcome)] = failures.get(str(r.outcome), 0) + 1

    ok_metrics = [m for _, m in ok]
    latency = {
        "ttft": distribution(m.ttft for m in ok_metrics),
        "ttft_sched": distribution(m.ttft_sched for m in ok_metrics),
        "tpot": distribution(m.tpot for m in ok_metrics),
        "itl": distribution(v for m in ok_metrics for v in m.itl),
        "itl_request_mean": distribution(m.itl_mean for m in ok_metrics),
        "chunk_gap": distribution(v for m in ok_metrics for v in m.chunk_gaps),
        "e2e": distribution(m.e2e for m in ok_metrics),
        "e2e_sched": distribution(m.e2e_sched for m in ok_metrics),
        "lateness": distribution(m.lateness for m in metrics),
    }
    failure_adjusted = {
        name: distribution([getattr(m, name) for m in ok_metrics] + [math.inf] * len(failed))
        for name in FAILURE_ADJUSTED
    }

    goodput = judge(ok, len(failed), window, slos) if slos else None

    prompts = [r.prompt_tokens for r, _ in ok if r.prompt_tokens is not None]
    outputs = [m.output_tokens for _, m in ok if m.output_tokens is not None]
    from_usage = sum(1 for r, _ in ok if r.tokens_from_usage)
    cached = [(r.cached_tokens, r.prompt_tokens) for r, _ in ok
              if r.cached_tokens is not None and r.prompt_tokens]
    summary = RunSummary(
        requests=len(records),
        in_window=len(chosen),
        cancelled=cancelled,
        ok=len(ok),
        failures=failures,
        latency=latency,
        failure_adjusted=failure_adjusted,
        throughput=throughput(records, chosen, window) if window else None,
        goodput=goodput,
        mean_prompt_tokens=float(np.mean(prompts)) if prompts else None,
        mean_output_tokens=float(np.mean(outputs)) if outputs else None,
        tokens_from_usage=from_usage / len(ok) if ok else 0.0,
        cached_share=(sum(c for c, _ in cached) / sum(p for _, p in cached)) if cached else None,
        events_disagree=sum(1 for r, _ in ok if r.tokens_from_usage and r.token_counts
                            and sum(r.token_counts) != r.completion_tokens),
        retries=sum(r.retries for r in chosen),
        formulas=FORMULAS,
        client=client,
        window=(WindowSpan(start_ns=window.start_ns, end_ns=window.end_ns,
                           seconds=window.duration_s) if window else None),
        stop_reason=stop_reason,
        sessions=session_summary(chosen),
        reasoning=reasoning_summary(chosen),
    )
    summary.warnings = [*dict.fromkeys(notes), *_warnings(summary, concurrency_cap)]
    return summary


def _warnings(s: RunSummary, cap: int | None = None) -> list[str]:
    warnings = []
    failed = sum(s.failures.values())
    judged = s.ok + failed
    if failed:
        warnings.append(f"{failed} of {judged} requests failed ({100 * failed / judged:.1f}%): "
                        "see failures and the failure-adjusted percentiles")
    if s.cancelled:
        warnings.append(f"{s.cancelled} requests were cancelled by the user (Ctrl-C): left out "
                        "of the statistics, not counted as failures")
    t = s.throughput
    if t and t.offered_rate:
        if t.sent_rate < SHORTFALL * t.offered_rate and cap is not None:
            warnings.append(f"sent {t.sent_rate:.2f} req/s of {t.offered_rate:.2f} offered: the "
                            f"--max-concurrency {cap} cap held requests back (their wait is "
                            "client wait, by design)")
        elif t.sent_rate < SHORTFALL * t.offered_rate:
            warnings.append(f"the client sent {t.sent_rate:.2f} req/s of {t.offered_rate:.2f} offered: "
                            "it could not keep the schedule")
        if t.fell_behind:
            warnings.append(f"achieved {t.achieved_rate:.2f} req/s of {t.offered_rate:.2f} offered "
                            f"({100 * t.achieved_rate / t.offered_rate:.0f}%), {t.backlog_growth} "
                            "more requests in flight at the last arrival than at the start: the target "
                            "fell behind")
    if s.ok and s.tokens_from_usage < 1.0:
        warnings.append(f"{100 * (1 - s.tokens_from_usage):.0f}% of requests had no server usage: "
                        "their token counts are the client's own count")
    if s.cached_share is not None and s.cached_share >= CACHED_SHARE_WARNING:
        warnings.append(f"{100 * s.cached_share:.0f}% of prompt tokens came from the server's "
                        "prefix cache: TTFT is flattered if that is not what production sees "
                        "(rerunning the same prompts fills it; --salt-prompts gives every run "
                        "its own)")
    if s.events_disagree:
        warnings.append(f"{s.events_disagree} of {s.ok} streams carried a different number of "
                        "token events than their usage count: ITL counts events as tokens "
                        "(ask the server for per-chunk usage or counts)")
    if s.retries:
        warnings.append(f"{s.retries} requests were sent again on a fresh connection after a "
                        "pooled one turned out closed (their first attempt is client wait): the "
                        "server closes keep-alive connections; --no-keepalive avoids it")
    if s.client is not None and s.client.bottleneck:
        warnings.append("the client was the bottleneck: " + "; ".join(s.client.reasons))
    return warnings
