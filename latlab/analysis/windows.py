"""A service's own traffic a window at a time (`latlab observe`): each window's calls analysed
as a run is (budget, findings), summed up as an `ObservedWindow`, and the peak-hours rule over
the windows kept so far.

    window, analysis = analyze_window(run, config, records, start_ns, end_ns)
    peak = peak_over(windows)    # latency against rate across the windows
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from latlab.analysis.analyze import assemble, network_baseline
from latlab.analysis.decompose import decompose_all
from latlab.analysis.findings import Finding
from latlab.analysis.requests import Requests, in_flight_at_send
from latlab.analysis.rules.peaks import Slice, peak_finding
from latlab.analysis.run_analysis import RunAnalysis
from latlab.metrics.request import metric_columns
from latlab.metrics.stats import percentile
from latlab.metrics.summary import summarize
from latlab.records.config import RunConfig
from latlab.records.folder import RunFolder
from latlab.records.observe import MIN_WINDOW_CALLS, ObservedWindow, Quantiles, WindowFinding
from latlab.records.table import RequestTable, as_table
from latlab.records.timeline import RequestTimeline
from latlab.records.window import Window


def analyze_window(run: RunFolder, config: RunConfig,
                   records: Sequence[RequestTimeline] | RequestTable, start_ns: int, end_ns: int
                   ) -> tuple[ObservedWindow, RunAnalysis | None]:
    """The window [start_ns, end_ns) of `records` (the calls that started in it); its
    findings only from `MIN_WINDOW_CALLS` calls on (fewer make no case either way), and not
    peak hours (the seconds of one window are no hours: `peak_over` compares the windows)."""
    seconds = (end_ns - start_ns) / 1e9
    if not len(records):
        return ObservedWindow(start_ns=start_ns, end_ns=end_ns, calls=0, failed=0,
                              rate=0.0), None
    table = as_table(records)
    metrics = metric_columns(table)
    window = Window(start_ns, end_ns)
    parts = decompose_all(table, network_baseline(table))
    requests = Requests(table, metrics, parts, in_flight_at_send(table))
    summary = summarize(table, window, config.slos or None, metrics=metrics)
    analysis = assemble(run, config, summary, requests, window, np.ones(len(table), bool), [])
    ok = table.ok
    judged = len(table) >= MIN_WINDOW_CALLS
    shares = ({b: round(analysis.mean.share(b), 4) for b in analysis.mean.buckets()}
              if analysis.mean is not None else {})
    return ObservedWindow(
        start_ns=start_ns, end_ns=end_ns, calls=len(table), failed=int((~ok).sum()),
        rate=len(table) / seconds, ttft=quantiles(metrics.ttft[ok]),
        e2e=quantiles(metrics.e2e[ok]), shares=shares,
        findings=[WindowFinding(rule=f.rule, severity=str(f.severity), title=f.title)
                  for f in analysis.findings if f.rule != "peak_hours"] if judged else [],
        findings_skipped=not judged), analysis


def quantiles(values: np.ndarray) -> Quantiles:
    """p50 and p99 (ms) of the values that are numbers."""
    v = np.sort(values[~np.isnan(values)])
    if not len(v):
        return Quantiles()
    return Quantiles(p50=percentile(v, 50), p99=percentile(v, 99))


def peak_over(windows: Sequence[ObservedWindow]) -> Finding | None:
    """The peak-hours finding over the windows kept: those whole (not `partial`, no `late`
    calls left out: their rate and p99 are every call's) with `MIN_WINDOW_CALLS` calls and an
    E2E p99."""
    slices = [Slice(_clock(w.start_ns), w.rate, w.e2e.p99, w.shares) for w in windows
              if not w.partial and not w.late and w.calls >= MIN_WINDOW_CALLS
              and w.e2e.p99 is not None]
    found = peak_finding(slices)
    return found if isinstance(found, Finding) else None


def _clock(unix_ns: int) -> str:
    """A window's start as the time of day (UTC), how an SRE names an hour."""
    return np.datetime_as_string(np.datetime64(unix_ns, "ns"), unit="s")[11:] + "Z"
