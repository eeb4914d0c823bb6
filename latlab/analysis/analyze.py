"""`analyze(run)`: everything the reports show about one run folder, computed once.

It reads `config.json` (optional), `requests.jsonl` and `summary.json`; a partial run without
`summary.json` gets its summary recomputed from the records and the config's measurement
window (`clock.t0_ns`, `clock.end_ns`, `warmup_s`, `cooldown_s`) and SLOs (`slos`).

Everything is computed over columns (`Requests`: the records, their metrics and their
decomposition, one array per field), whatever the size of the run; `rows` and `decomposed`
give a request at a time for the few a report shows.

Budgets, breakdowns and findings cover the requests scheduled inside the measurement window
(`inside`), as the summary does; the records outside it (warmup, cooldown) stay in
`requests` for the time series, the exports and the cold-start rule.
"""

from __future__ import annotations

from collections import Counter
from typing import TypeVar

import numpy as np

from latlab.analysis.budget import (
    budget,
    by_priority,
    by_prompt_length,
    by_tenant,
    over_time,
    tail_budget,
)
from latlab.analysis.decompose import NetworkBaseline, arrival_ns, decompose_all, label
from latlab.analysis.diagnose import diagnose
from latlab.analysis.hop import hop
from latlab.analysis.requests import Requests, in_flight_at_send
from latlab.analysis.run_analysis import RunAnalysis
from latlab.analysis.server_view import server_view
from latlab.analysis.tasks import task_budget
from latlab.metrics.request import metric_columns
from latlab.metrics.stats import percentile
from latlab.metrics.summary import RunContext, judge, summarize
from latlab.metrics.throughput import inside
from latlab.records.cache import drop_pages
from latlab.records.columns import present
from latlab.records.config import RunConfig
from latlab.records.folder import RunFolder
from latlab.records.scrape import Scrape
from latlab.records.spill import Spill
from latlab.records.summary import Goodput, RunSummary
from latlab.records.table import OUTCOMES, RequestTable
from latlab.records.timeline import NS_PER_MS, Outcome
from latlab.records.window import Window, run_window

T = TypeVar("T")
UNATTRIBUTED_NOTE_SHARE = 0.05
TRANSIT_BASELINE = 10.0  # the percentile of the run's transits taken as the network's own


def analyze(run: RunFolder, slos: dict[str, float] | None = None, *,
            diagnosis: bool = True, spill: Spill | None = None) -> RunAnalysis:
    """Decompose, aggregate and diagnose one run folder (which may be a partial run);
    `slos` judges its goodput by other SLOs than its own; without `diagnosis` the rules are
    not run (`findings` stays empty: what `compare` needs). With a `spill`, every column is
    a file's mapping (the run's read-only, the derived ones written to it a block at a
    time) and its pages are given back after each step (`RunAnalysis.give_back`)."""
    config = run.read_config()
    table = run.read_table(read_only=spill is not None)
    if spill is not None:
        spill.adopt(table)
        derived(table, spill)
    window = run_window(config, table)
    metrics = metric_columns(table, spill)
    summary = run.read_summary()
    recomputed = summary is None
    scrapes = run.read_scrapes()
    if summary is None:
        summary = summarize(table, window, config.slos or None, metrics=metrics,
                            context=RunContext(concurrency_cap=config.concurrency,
                                               users=config.users, scrapes=scrapes,
                                               server_kind=config.target.server_kind))
    if not diagnosis:  # a big run's token stamps go back to the file until compare reads them
        drop_pages(table.token_ns, table.token_counts)
    baseline = network_baseline(table, config.target.rtt_ms)
    if spill is not None:
        spill.give_back()
    parts = decompose_all(table, baseline, spill)
    requests = Requests(table, metrics, parts, in_flight_at_send(table, spill), spill)
    chosen = np.ones(len(table), bool) if window is None else inside(table.origin_ns, window)
    if spill is not None:
        chosen = spill.keep(chosen)
        spill.give_back()
    if slos is not None:
        summary.goodput = judge_requests(requests, chosen, window, slos)
    return assemble(run, config, summary, requests, window, chosen, scrapes, recomputed,
                    diagnosis)


DERIVED = ("ok", "origin_ns", "end_ns", "events", "output_tokens")  # `RequestTable`'s


def derived(table: RequestTable, spill: Spill) -> None:
    """The columns `table` derives from its own (`RequestTable`'s cached properties) made
    now, one at a time, each written to `spill`: not held in memory when read later."""
    for name in DERIVED:
        setattr(table, name, spill.keep(getattr(table, name)))  # its cached value
        spill.give_back()


def assemble(run: RunFolder, config: RunConfig, summary: RunSummary, requests: Requests,
             window: Window | None, chosen: np.ndarray, scrapes: list[Scrape],
             recomputed: bool = False, diagnosis: bool = True) -> RunAnalysis:
    """The analysis of decomposed `requests`: budgets and breakdowns over those `chosen`
    (the window's), findings, notes."""
    parts = requests.parts

    def given_back(value: T) -> T:  # the pages of the columns it read (a spilled analysis)
        requests.give_back()
        return value

    analysis = RunAnalysis(
        run=run,
        config=config,
        summary=summary,
        summary_recomputed=recomputed,
        requests=requests,
        window=window,
        inside=chosen,
        mean=given_back(budget(parts, chosen)),
        tail=given_back(tail_budget(parts, chosen)),
        by_prompt=given_back(by_prompt_length(requests, chosen)),
        by_tenant=given_back(by_tenant(requests, chosen)),
        by_priority=given_back(by_priority(requests, chosen)),
        over_time=given_back(over_time(requests)),
        scrapes=scrapes,
        server=server_view(scrapes, requests.table),
        tasks=given_back(task_budget(requests, chosen)),
        hop=given_back(hop(requests.table, chosen & parts.decomposed, config.target.gateway,
                           summary.spans)),
    )
    if diagnosis:
        analysis.findings, analysis.unevaluated = diagnose(analysis)
    analysis.notes = _notes(analysis)
    return analysis


def judge_requests(requests: Requests, chosen: np.ndarray, window: Window | None,
                   slos: dict[str, float]) -> Goodput | None:
    """Goodput of the `chosen` requests by `slos` (None without SLOs)."""
    if not slos:
        return None
    t = requests.table
    failed = chosen & ~t.ok & (t.outcome != OUTCOMES.index(Outcome.CANCELLED))
    return judge(t, requests.metrics, chosen & t.ok, int(failed.sum()), window, slos)


def network_baseline(t: RequestTable, rtt_ms: float | None = None) -> NetworkBaseline:
    """The run's network: the 10th percentile of the transit (what the client waited beyond
    the server's total) over its successful requests, the round trip: the null request's
    measured before the run (`rtt_ms`), else the median TCP connect time of its new
    connections, and one TCP round trip: the kernel's of their handshakes (median), else
    the quickest of those connects."""
    arrived = arrival_ns(t)
    timed = t.ok & t.has_server & ~np.isnan(t.server["total"]) & present(t.sent_ns) \
        & present(t.done_ns) & np.isnan(t.server["gateway_intake"])  # a gateway's hop is no transit
    transit = np.sort(arrived[timed] / NS_PER_MS - t.sent_ns[timed] / NS_PER_MS
                      - t.server["total"][timed])
    connect = t.phases["connect_ns"]
    connects = np.sort(connect[t.new_connection & ~np.isnan(connect)] / NS_PER_MS)
    if rtt_ms is None and len(connects):
        rtt_ms = percentile(connects, 50)
    kernel = t.phases["rtt_ns"]
    kernel = np.sort(kernel[t.new_connection & ~np.isnan(kernel)] / NS_PER_MS)
    tcp_rtt_ms = (percentile(kernel, 50) if len(kernel)
                  else float(connects[0]) if len(connects) else None)
    return NetworkBaseline(tcp_rtt_ms=tcp_rtt_ms,
                           transit_ms=percentile(transit, TRANSIT_BASELINE) if len(transit)
                           else None, rtt_ms=rtt_ms)


def _notes(a: RunAnalysis) -> list[str]:
    notes = []
    if a.summary_recomputed:
        notes.append("no summary.json (a partial run?): the summary was recomputed from the "
                     "records")
    elif a.summary.requests != len(a.table.ok):
        notes.append(f"summary.json counts {a.summary.requests} requests but requests.jsonl "
                     f"holds {len(a.table.ok)}: the summary is the stored one, the budget and "
                     "findings are the records' (requests.jsonl cut short or edited?)")
    torn = a.run.torn_bytes()
    if torn:
        notes.append(f"requests.jsonl ends in a torn line ({torn} bytes: a record cut off when "
                     "the run was killed mid-write): left out")
    if not len(a.requests):
        notes.append("the run has no records yet")
    elif not a.ok.any():
        notes.append("no request succeeded in the measurement window: there is no latency "
                     "budget to show" if a.table.ok.any() else
                     "no request succeeded: there is no latency budget to show")
    elif not a.has_server_timings:
        notes.append("the server reported no timings: network, preprocess, queue and prefill are "
                     "unavailable and lumped into 'first token (unsplit)'")
    else:
        notes.append(_provenance(a))
    joined = a.summary.spans
    if joined is not None and joined.spans:
        ways = ", ".join(f"{by} {n}" for by, n in joined.joined_by.items())
        notes.append(f"{joined.spans} spans arrived; {joined.requests_joined} requests joined "
                     f"to theirs" + (f" (by {ways})" if ways else ""))
        notes += joined.notes
    gateway = a.config.target.gateway
    if gateway is not None and a.hop is None and a.ok.any():
        notes.append(f"the target is behind {gateway.name}: without the engine's spans "
                     "(--otlp-port, the engine exporting to it) the gateway's hop is not "
                     "split out; it sits in what is derived around the engine's own timings "
                     "(network, a derived queue, or 'first token (unsplit)')")
    if a.server is not None and not a.server.agrees:
        notes.append("the server's /metrics and the client's records of the same span "
                     "disagree: " + "; ".join(a.server.checks))
    if a.mean is not None and abs(a.mean.share("unattributed")) >= UNATTRIBUTED_NOTE_SHARE:
        notes.append(f"{100 * a.mean.share('unattributed'):.0f}% of the mean E2E is unattributed "
                     "(not small): the server's stage timings do not cover all of its time")
    return notes


def _provenance(a: RunAnalysis) -> str:
    """Where the server timings came from and how good each component is."""
    source = a.table.source
    codes = source.codes[a.ok & a.requests.parts.has_server]
    sources = Counter({source.names[c] if c >= 0 else "latlab": int(n)
                       for c, n in zip(*np.unique(codes, return_counts=True))})
    by_quality: dict[str, list[str]] = {}
    for name, quality in a.mean.quality.items():
        if quality is not None and name != "unattributed" and a.mean.coverage[name] > 0:
            by_quality.setdefault(str(quality), []).append(label(name))
    shown = "; ".join(f"{q}: {', '.join(names)}" for q, names in sorted(by_quality.items()))
    return (f"server timings from {', '.join(f'{s} ({n})' for s, n in sources.most_common())}"
            f" — {shown}")
