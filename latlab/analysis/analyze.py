"""`analyze(run)`: everything the reports show about one run folder, computed once.

It reads `config.json` (optional), `requests.jsonl` and `summary.json`; a partial run without
`summary.json` gets its summary recomputed from the records and the config's measurement
window (`clock.t0_ns`, `clock.end_ns`, `warmup_s`, `cooldown_s`) and SLOs (`slos`).

Budgets, breakdowns and findings cover the requests scheduled inside the measurement window,
as the summary does; the records outside it (warmup, cooldown) stay in `rows` for the time
series, the exports and the cold-start rule.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from latlab.analysis.budget import (
    Budget,
    Group,
    Row,
    budget,
    by_priority,
    by_prompt_length,
    by_tenant,
    in_flight_at_send,
    over_time,
    tail_budget,
)
from latlab.analysis.decompose import NetworkBaseline, decompose, label
from latlab.analysis.findings import Finding, Unevaluated
from latlab.analysis.tasks import TaskBudget, task_budget
from latlab.metrics.request import request_metrics
from latlab.metrics.stats import percentile
from latlab.metrics.summary import judge, summarize
from latlab.records.config import RunConfig
from latlab.records.folder import RunFolder
from latlab.records.scrape import Scrape
from latlab.records.summary import ClientCheck, Goodput, RunSummary
from latlab.records.timeline import NS_PER_MS, Outcome, RequestTimeline
from latlab.records.window import Window, run_window

UNATTRIBUTED_NOTE_SHARE = 0.05
TRANSIT_BASELINE = 10.0  # the percentile of the run's transits taken as the network's own


@dataclass
class RunAnalysis:
    """A run's records, per-request decomposition, aggregate budgets, breakdowns and findings."""

    run: RunFolder
    config: RunConfig
    summary: RunSummary
    summary_recomputed: bool
    rows: list[Row]
    window: Window | None
    mean: Budget | None
    tail: Budget | None
    by_prompt: list[Group]
    by_tenant: list[Group]
    by_priority: list[Group]
    over_time: list[Group]
    scrapes: list[Scrape] = field(default_factory=list)
    tasks: TaskBudget | None = None  # agent tasks: the whole task's budget
    findings: list[Finding] = field(default_factory=list)
    unevaluated: list[Unevaluated] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def records(self) -> list[RequestTimeline]:
        return [row.record for row in self.rows]

    @property
    def measured(self) -> list[Row]:
        """The rows scheduled inside the measurement window (all of them without a window)."""
        return measured(self.rows, self.window)

    @property
    def decomposed(self) -> list[Row]:
        """The measured rows with a decomposition (the successful requests)."""
        return [row for row in self.measured if row.parts is not None]

    @property
    def has_server_timings(self) -> bool:
        return any(row.parts.has_server for row in self.decomposed)

    @property
    def client(self) -> ClientCheck | None:
        """The load generator's self-check (`summary.json` → `client`), when it wrote one."""
        return self.summary.client


def analyze(run: RunFolder, slos: dict[str, float] | None = None) -> RunAnalysis:
    """Decompose, aggregate and diagnose one run folder (which may be a partial run);
    `slos` judges its goodput by other SLOs than its own."""
    config = run.read_config()
    records = run.read_records()
    window = run_window(config, records)
    summary = run.read_summary()
    recomputed = summary is None
    if summary is None:
        summary = summarize(records, window, config.slos or None,
                            concurrency_cap=config.concurrency)

    base = network_baseline(records, config.target.rtt_ms)
    rows = [Row(record=r, metrics=request_metrics(r), parts=decompose(r, base), in_flight=n)
            for r, n in zip(records, in_flight_at_send(records))]
    if slos is not None:
        summary.goodput = judge_rows(measured(rows, window), window, slos)
    return assemble(run, config, summary, rows, window, run.read_scrapes(), recomputed)


def assemble(run: RunFolder, config: RunConfig, summary: RunSummary, rows: list[Row],
             window: Window | None, scrapes: list[Scrape],
             recomputed: bool = False) -> RunAnalysis:
    """The analysis of decomposed `rows`: budgets and breakdowns over the window's, findings,
    notes."""
    from latlab.analysis.diagnose import diagnose

    inside = measured(rows, window)
    parts = [row.parts for row in inside if row.parts is not None]
    analysis = RunAnalysis(
        run=run,
        config=config,
        summary=summary,
        summary_recomputed=recomputed,
        rows=rows,
        window=window,
        mean=budget(parts),
        tail=tail_budget(parts),
        by_prompt=by_prompt_length(inside),
        by_tenant=by_tenant(inside),
        by_priority=by_priority(inside),
        over_time=over_time(rows),
        scrapes=scrapes,
        tasks=task_budget(inside),
    )
    analysis.findings, analysis.unevaluated = diagnose(analysis)
    analysis.notes = _notes(analysis)
    return analysis


def judge_rows(rows: list[Row], window: Window | None,
               slos: dict[str, float]) -> Goodput | None:
    """Goodput of measured `rows` by `slos` (None without SLOs)."""
    if not slos:
        return None
    return judge([(r.record, r.metrics) for r in rows if r.record.ok],
                 sum(not r.record.ok and r.record.outcome != Outcome.CANCELLED for r in rows),
                 window, slos)


def network_baseline(records: list[RequestTimeline], rtt_ms: float | None = None
                     ) -> NetworkBaseline:
    """The run's network: the 10th percentile of the transit (what the client waited beyond
    the server's total) over its successful requests, and the round trip: the null request's
    measured before the run (`rtt_ms`), else the median TCP connect time of its new
    connections."""
    transit = sorted((r.usage_ns if r.usage_ns is not None and not r.server.application
                      else r.done_ns) / NS_PER_MS
                     - r.sent_ns / NS_PER_MS - r.server.total for r in records
                     if r.ok and r.server is not None and r.server.total is not None
                     and r.sent_ns is not None and r.done_ns is not None)
    connects = sorted(r.connection.connect_ns / NS_PER_MS for r in records
                      if r.connection is not None and r.connection.new
                      and r.connection.connect_ns is not None)
    if rtt_ms is None and connects:
        rtt_ms = percentile(connects, 50)
    return NetworkBaseline(transit_ms=percentile(transit, TRANSIT_BASELINE) if transit else None,
                           rtt_ms=rtt_ms)


def measured(rows: list[Row], window: Window | None) -> list[Row]:
    return rows if window is None else [r for r in rows if r.record.origin_ns in window]


def _notes(a: RunAnalysis) -> list[str]:
    notes = []
    if a.summary_recomputed:
        notes.append("no summary.json (a partial run?): the summary was recomputed from the records")
    if not a.rows:
        notes.append("the run has no records yet")
    elif not a.decomposed:
        notes.append("no request succeeded: there is no latency budget to show")
    elif not a.has_server_timings:
        notes.append("the server reported no timings: network, preprocess, queue and prefill are "
                     "unavailable and lumped into 'first token (unsplit)'")
    else:
        notes.append(_provenance(a))
    if a.mean is not None and abs(a.mean.share("unattributed")) >= UNATTRIBUTED_NOTE_SHARE:
        notes.append(f"{100 * a.mean.share('unattributed'):.0f}% of the mean E2E is unattributed "
                     "(not small): the server's stage timings do not cover all of its time")
    return notes


def _provenance(a: RunAnalysis) -> str:
    """Where the server timings came from and how good each component is."""
    sources = Counter(r.record.server.source or "latlab" for r in a.decomposed
                      if r.record.server is not None)
    by_quality: dict[str, list[str]] = {}
    for name, quality in a.mean.quality.items():
        if quality is not None and name != "unattributed" and a.mean.coverage[name] > 0:
            by_quality.setdefault(str(quality), []).append(label(name))
    shown = "; ".join(f"{q}: {', '.join(names)}" for q, names in sorted(by_quality.items()))
    return (f"server timings from {', '.join(f'{s} ({n})' for s, n in sources.most_common())}"
            f" — {shown}")
