"""`summarize`: a run's summary over its measurement window (what summary.json holds)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from latlab.metrics.cache import cache_use
from latlab.metrics.request import MetricColumns, metric_columns
from latlab.metrics.sessions import reasoning_summary, session_summary
from latlab.metrics.slo import meets_slos
from latlab.metrics.stats import distribution as _distribution
from latlab.metrics.throughput import SHORTFALL, inside, throughput
from latlab.records.catalog import formulas, metrics
from latlab.records.scrape import Scrape
from latlab.records.spill import Spill
from latlab.records.summary import ClientCheck, Distribution, Goodput, RunSummary, WindowSpan
from latlab.records.table import OUTCOMES, RequestTable, as_table
from latlab.records.target import ServerKind
from latlab.records.timeline import Outcome, RequestTimeline
from latlab.records.window import Window

T = TypeVar("T")
FAILURE_ADJUSTED = metrics(failure_adjusted=True)
CACHED_SHARE_WARNING = 0.5
# When a stream's token events do not add up to its usage count: what that server can do.
ASK_PER_CHUNK = "the server counts them when asked: keep --continuous-usage (the default) on"
CHUNK_COUNTS = {
    ServerKind.LATLAB: ASK_PER_CHUNK, ServerKind.VLLM: ASK_PER_CHUNK,
    ServerKind.SGLANG: ASK_PER_CHUNK,
    ServerKind.LLAMACPP: "llama.cpp counted its chunks (timings_per_token): the rest are tokens "
                         "it sent without text",
}
NO_CHUNK_COUNTS = "this server sends no per-chunk token counts"


@dataclass(frozen=True)
class RunContext:
    """What a summary reads besides the records, from whoever ran them: the load generator's
    self-check (`client`), why it stopped and its `notes` (first among the warnings); the open
    loop's --max-concurrency (`concurrency_cap`: it holds sends back by design) and the closed
    loop's `users`; the server's /metrics `scrapes`; and its kind (advice only that server can
    act on)."""

    client: ClientCheck | None = None
    stop_reason: str | None = None
    notes: Sequence[str] = ()
    concurrency_cap: int | None = None
    users: int | None = None
    scrapes: Sequence[Scrape] = ()
    server_kind: str | None = None


NO_CONTEXT = RunContext()


def judge(t: RequestTable, m: MetricColumns, ok: np.ndarray, failed: int,
          window: Window | None, slos: Mapping[str, float]) -> Goodput:
    """Goodput: the successful requests (`ok`, a mask of `t`) that met every SLO, as a share
    of the window's ok + `failed` requests and per second of the window."""
    good = ok & meets_slos(m, slos)
    done = good if window is None else good & inside(t.done_ns, window)
    judged = int(ok.sum()) + failed
    return Goodput(slos=dict(slos), good=int(good.sum()),
                   fraction=int(good.sum()) / judged if judged else 0.0,
                   requests_per_s=int(done.sum()) / window.duration_s if window else None)


def summarize(records: Sequence[RequestTimeline] | RequestTable, window: Window | None = None,
              slos: dict[str, float] | None = None, *, context: RunContext = NO_CONTEXT,
              metrics: MetricColumns | None = None, spill: Spill | None = None) -> RunSummary:
    """The summary over the requests scheduled inside `window` (all when None), judged
    against `slos`, with what its `context` says; `metrics` are the records' metric columns
    when the caller has them already; `spill`: the one they and the table are mapped from,
    whose pages are given back after each distribution (`records.spill`)."""
    t = as_table(records)
    m = metrics if metrics is not None else metric_columns(t)

    def given_back(value: T) -> T:  # the pages of the columns it read (with a spill)
        if spill is not None:
            spill.give_back()
        return value

    def distribution(values: np.ndarray, scratch: bool = False) -> Distribution:
        return given_back(_distribution(values, scratch=scratch))

    chosen = np.ones(len(t), bool) if window is None else inside(t.origin_ns, window)
    ok = chosen & t.ok
    failed = chosen & ~t.ok & (t.outcome != OUTCOMES.index(Outcome.CANCELLED))
    n_ok, n_failed = int(ok.sum()), int(failed.sum())

    classes, first, counts = np.unique(t.outcome[failed], return_index=True, return_counts=True)
    failures = {OUTCOMES[classes[i]]: int(counts[i]) for i in np.argsort(first)}

    itl = distribution(m.itl.select(ok), scratch=True)
    latency = {
        "ttft": distribution(m.ttft[ok]),
        "ttft_sched": distribution(m.ttft_sched[ok]),
        "tpot": distribution(m.tpot[ok]),
        "itl": itl,
        "itl_request_mean": distribution(m.itl_mean[ok]),
        "itl_max": distribution(m.itl_max[ok]),
        # one token an event (the common case): the gaps are the ITL samples
        "chunk_gap": itl if m.chunk_gaps is m.itl
        else distribution(m.chunk_gaps.select(ok), scratch=True),
        "e2e": distribution(m.e2e[ok]),
        "e2e_sched": distribution(m.e2e_sched[ok]),
        "lateness": distribution(m.lateness[chosen]),
    }
    failure_adjusted = {
        name: distribution(np.concatenate([getattr(m, name)[ok], np.full(n_failed, np.inf)]),
                           scratch=True)
        for name in FAILURE_ADJUSTED
    }

    goodput = given_back(judge(t, m, ok, n_failed, window, slos) if slos else None)
    prompts = t.prompt_tokens[ok]
    prompts = prompts[~np.isnan(prompts)]
    mean_prompt = given_back(float(np.mean(prompts)) if len(prompts) else None)
    outputs = m.output_tokens[ok]
    outputs = outputs[~np.isnan(outputs)]
    mean_output = given_back(float(np.mean(outputs)) if len(outputs) else None)
    del prompts, outputs
    cached = ok & ~np.isnan(t.cached_tokens) & (np.nan_to_num(t.prompt_tokens) != 0)
    cached_share = given_back(float(t.cached_tokens[cached].sum()
                                    / t.prompt_tokens[cached].sum()) if cached.any() else None)
    del cached
    disagree = ok & t.tokens_from_usage & (t.events > 0) & (t.event_tokens != t.completion_tokens)
    events_disagree = given_back(int(disagree.sum()))
    del disagree
    stopped_short = given_back(int((ok & (m.output_tokens < t.max_tokens)).sum()))  # NaN: False
    counts = given_back(throughput(t, chosen, window, context.users) if window else None)
    cache = given_back(cache_use(t, ok, context.scrapes))
    sessions = given_back(session_summary(t, chosen, m.ttft))
    reasoning = given_back(reasoning_summary(t, chosen))
    summary = RunSummary(
        requests=len(t),
        in_window=int(chosen.sum()),
        cancelled=int(chosen.sum()) - n_ok - n_failed,
        ok=n_ok,
        failures=failures,
        latency=latency,
        failure_adjusted=failure_adjusted,
        throughput=counts,
        goodput=goodput,
        mean_prompt_tokens=mean_prompt,
        mean_output_tokens=mean_output,
        tokens_from_usage=int((ok & t.tokens_from_usage).sum()) / n_ok if n_ok else 0.0,
        cached_share=cached_share,
        cache=cache,
        events_disagree=events_disagree,
        stopped_short=stopped_short,
        retries=int(t.retries[chosen].sum()),
        formulas=formulas(),
        client=context.client,
        window=(WindowSpan(start_ns=window.start_ns, end_ns=window.end_ns,
                           seconds=window.duration_s) if window else None),
        stop_reason=context.stop_reason,
        sessions=sessions,
        reasoning=reasoning,
    )
    summary.warnings = [*dict.fromkeys(context.notes),
                        *_warnings(summary, context.concurrency_cap, context.server_kind)]
    return summary


def _warnings(s: RunSummary, cap: int | None = None, kind: str | None = None) -> list[str]:
    warnings = []
    failed = sum(s.failures.values())
    judged = s.ok + failed
    if failed:
        warnings.append(f"{failed} of {judged} requests failed ({100 * failed / judged:.1f}%): "
                        "see failures and the failure-adjusted percentiles")
    if s.cancelled:
        warnings.append(f"{s.cancelled} requests were cancelled when the run was interrupted "
                        "(Ctrl-C or SIGTERM): left out of the statistics, not counted as "
                        "failures")
    t = s.throughput
    if t and t.offered_rate:
        if t.sent_rate < SHORTFALL * t.offered_rate and cap is not None:
            warnings.append(f"sent {t.sent_rate:.2f} req/s of {t.offered_rate:.2f} offered: the "
                            f"--max-concurrency {cap} cap held requests back (their wait is "
                            "client wait, by design)")
        elif t.sent_rate < SHORTFALL * t.offered_rate:
            warnings.append(f"the client sent {t.sent_rate:.2f} req/s of {t.offered_rate:.2f} "
                            "offered: it could not keep the schedule")
        if t.fell_behind:
            warnings.append(f"achieved {t.achieved_rate:.2f} req/s of {t.offered_rate:.2f} offered "
                            f"({100 * t.achieved_rate / t.offered_rate:.0f}%), "
                            f"{t.backlog_growth} more requests in flight at the last arrival "
                            "than at the start: the target fell behind")
    if s.ok and s.tokens_from_usage < 1.0:
        warnings.append(f"{100 * (1 - s.tokens_from_usage):.0f}% of requests had no server usage: "
                        "their token counts are the client's own count")
    if s.cache is not None and s.cache.share >= CACHED_SHARE_WARNING:
        warnings.append(f"{100 * s.cache.share:.0f}% of prompt tokens came from the server's "
                        "prefix cache: TTFT is flattered if that is not what production sees "
                        "(prompts sent again fill it: every run's prompts are fresh unless "
                        "--prompts says otherwise)")
    if s.events_disagree:
        advice = CHUNK_COUNTS.get(kind, NO_CHUNK_COUNTS)  # type: ignore[call-overload]
        warnings.append(f"{s.events_disagree} of {s.ok} streams carried a different number of "
                        f"token events than their usage count: ITL counts events as tokens "
                        f"({advice})")
    if s.stopped_short:
        warnings.append(f"{s.stopped_short} of {s.ok} requests stopped before max_tokens (mean "
                        f"output {s.mean_output_tokens or 0:.0f} tokens): output lengths not held")
    if s.retries:
        warnings.append(f"{s.retries} requests were sent again on a fresh connection after a "
                        "pooled one turned out closed (their first attempt is client wait): the "
                        "server closes keep-alive connections; --no-keepalive avoids it")
    if s.client is not None and s.client.bottleneck:
        warnings.append("the client was the bottleneck: " + "; ".join(s.client.reasons))
    if s.client is not None and s.client.host_busy:
        warnings.append("the host was busy with other work: the timings are unreliable; "
                        "rerun on a quiet host (" + "; ".join(s.client.host_reasons) + ")")
    return warnings
