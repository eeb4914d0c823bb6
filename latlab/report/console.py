"""Terminal output (rich): the run summary table, the analysis (the latency budget from
budget_bars) and the findings."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table
from rich.text import Text

from latlab.records.catalog import CATALOG, metrics
from latlab.records.summary import Distribution, Prediction, RunSummary, Throughput
from latlab.report.budget_bars import print_budget
from latlab.report.palette import SEVERITY_COLORS
from latlab.report.sessions import session_lines
from latlab.units import cell, interval, ms, pct

if TYPE_CHECKING:
    from latlab.analysis.run_analysis import RunAnalysis
    from latlab.analysis.server_view import ServerView


def print_analysis(console: Console, analysis: RunAnalysis) -> None:
    """What a run ends with: its latency budget, its findings and where its report is."""
    console.print()
    print_budget(console, analysis)
    print_server_view(console, analysis)
    console.print()
    print_findings(console, analysis, unevaluated=False)
    console.print(f"report: {analysis.run.report_path}")


def print_server_view(console: Console, analysis: RunAnalysis) -> None:
    """The server's own account from its /metrics (`--scrape`), and how it squares with the
    client's records; nothing without one."""
    v = analysis.server
    if v is None:
        return
    title, per_request = server_view_lines(v)
    console.print()
    console.print(Text(title, style="bold"))
    console.print(Text(f"  {per_request}"))
    for check in v.checks:
        console.print(Text(f"  {'·' if v.agrees else '!'} {check}",
                           style="dim" if v.agrees else "yellow"))


def server_view_lines(v: ServerView) -> tuple[str, str]:
    """The server view's title and its per-request stages and peaks, in words."""
    stages = " · ".join(f"{LABELS.get(k, k)} {ms(x)}" for k, x in v.stages_ms.items())
    peaks = ", ".join(f"{LABELS.get(k, k)} {pct(x) if k == 'kv_usage' else f'{x:.0f}'}"
                      for k, x in v.peaks.items())
    return (f"The server's own view (/metrics, {v.requests} requests in {v.span_s:.1f} s)",
            f"per request: {stages}" + (f"; peak {peaks}" if peaks else ""))


def print_findings(console: Console, analysis: RunAnalysis, unevaluated: bool = True) -> None:
    """The findings, most severe first, each with its evidence, where the time goes and the
    fix to try first; then (dim) the rules that could not run and what they need."""
    console.print(Text("Findings", style="bold"))
    if not analysis.findings:
        console.print("  none: every rule that could run found nothing wrong")
    for f in analysis.findings:
        color = SEVERITY_COLORS[str(f.severity)]
        console.print(Text.assemble("  ", (f" {f.severity} ", f"bold white on {color}"), " ",
                                    (f.title, "bold")))
        lines = [Text(f"· {line}") for line in f.evidence]
        lines.append(Text.assemble("where the time goes: ", (f.where, "italic")))
        lines.append(Text.assemble("try first: ", (f.fix, "italic")))
        lines += [Text(f"  {note}", style="dim") for note in f.notes]
        for line in lines:  # indented as text: Padding would crop a piped line at the width
            console.print(Text(" " * 6) + line)
    if unevaluated and analysis.unevaluated:
        console.print(Text("  not evaluated:", style="dim"))
        for u in analysis.unevaluated:
            console.print(Text(f"    {u.rule}: {u.needs}", style="dim"))


LABELS = {"e2e": "E2E", "ttft": "TTFT", "kv_usage": "KV cache"}
SUMMARY_ROWS = tuple((name, CATALOG[name].row) for name in metrics(summary=True))
FAILURE_ROWS = tuple((name, f"{CATALOG[name].label} failure-adjusted")
                     for name in metrics(failure_adjusted=True, parent=None))


def print_summary(console: Console, summary: RunSummary, run_path: object = None) -> None:
    """The compact run summary from summary.json: latency table (ms; `~` marks a percentile
    with fewer than 10 samples beyond it), throughput, offered vs achieved, failures,
    goodput, the client self-check and the warnings."""
    title = (f"{summary.requests} requests · {summary.in_window} in the window · "
             f"{summary.ok} ok")
    if summary.window:
        title += f" · window {summary.window.seconds:.1f} s"
    console.print(Text(title, style="bold"))
    if run_path is not None:
        console.print(Text(f"run folder: {run_path}", style="dim"))
    table = Table(box=None, padding=(0, 1), pad_edge=False, header_style="bold")
    predicted = summary.prediction
    table.add_column("ms" if predicted is None else
                     f"ms (below: the {100 * predicted.level:g}% interval)")
    for column in ("n", "mean", "p50", "p90", "p95", "p99", "p99.9", "p99 95% CI"):
        table.add_column(column, justify="right")
    for key, name in SUMMARY_ROWS:
        _summary_row(table, name, summary.latency.get(key))
    if summary.failures:
        for key, name in FAILURE_ROWS:
            _summary_row(table, name, summary.failure_adjusted.get(key), style="magenta")
    console.print(table)
    for line in _summary_lines(summary):
        console.print(line)


def summary_line(s: RunSummary, run_path: object) -> str:
    """The run in one line, for the end of piped output (a CI log's last line)."""
    parts = [f"{s.ok} of {s.in_window} ok"]
    for key, name in (("ttft", "TTFT"), ("e2e", "E2E")):
        p50, p99 = s.percentile(key, "p50"), s.percentile(key, "p99")
        if p50 is not None:
            parts.append(f"{name} p50 {ms(p50)} p99 {ms(p99)}")
    if s.throughput:
        parts.append(f"{s.throughput.output_tokens_per_s:,.0f} output tok/s")
    if s.goodput:
        parts.append(f"goodput {100 * s.goodput.fraction:.0f}%")
    return " · ".join(parts) + f" · {run_path}"


def _summary_row(table: Table, label: str, dist: Distribution | None, style: str = "") -> None:
    if not dist or not dist.n:
        table.add_row(Text(label, style=style), "0", *["–"] * 7)
        return
    cells = [str(dist.n), cell(dist.mean)]
    for name in ("p50", "p90", "p95", "p99", "p99.9"):
        p = dist.percentiles[name]
        value = Text(cell(p.value) + ("" if p.reliable else "~"),
                     style="" if p.reliable else "dim")
        if p.lo is not None:
            value.append(f"\n{interval(p.lo, p.hi)}", style="dim")
        cells.append(value)
    p99 = dist.percentiles["p99"]
    low, high = p99.ci_low, p99.ci_high
    cells.append(f"[{cell(low) if low is not None else '?'}, "
                 f"{cell(high) if high is not None else '?'}]")
    table.add_row(Text(label, style=style), *cells)


def prediction_lines(p: Prediction) -> list[Text]:
    """How a predicted run's intervals were made, and what they say beyond the numbers."""
    took = f" in {p.wall_s:.1f} s" if p.wall_s is not None else ""
    runs = f" ({p.runs} runs in each)" if p.runs > 1 else ""
    run = (f"a run of {p.run_requests:,} requests" if p.run_requests else "a run like this")
    at = f", {p.floor_at}" if p.floor_at else ""
    floor = (f"; from run to run alone up to {p.floor:.2f}× (hi/lo{at})" if p.floor else "")
    lines = [Text(f"intervals   {100 * p.level:g}%: where {run} will measure each percentile, "
                  f"its own luck included{floor}", style="dim"),
             Text(f"            {p.draws} draws of {p.requests:,} requests"
                  f"{runs}{took}, each in a world drawn from the calibration's spread: "
                  f"{p.spread}", style="dim")]
    return lines + [Text(f"! {note}", style="yellow") for note in p.notes]


def load_phrase(t: Throughput) -> str:
    """What the load generator offered: a rate, a burst, or a closed loop's users (which
    offer no rate: they send as answers come)."""
    if t.users is not None:
        users = f"{t.users} closed-loop user{'s' if t.users > 1 else ''}"
        return f"{users} sent {t.sent_rate or 0:.2f} req/s"
    if t.offered_rate is None:
        return "a burst (no rate)"
    return f"offered {t.offered_rate:.2f} req/s, sent {t.sent_rate:.2f}"


def _summary_lines(s: RunSummary) -> list[Text | Table]:
    lines = []
    t = s.throughput
    if t:
        lines.append(Text(f"throughput  {t.achieved_rate:.2f} req/s · "
                          f"{t.output_tokens_per_s:,.0f} output tok/s · "
                          f"{t.total_tokens_per_s:,.0f} total tok/s"))
        offered = f"{'load':<12}{load_phrase(t)} · achieved {t.achieved_rate:.2f} req/s"
        if t.fell_behind:
            offered += (f"  ACHIEVED ONLY {100 * t.achieved_rate / t.offered_rate:.0f}% "
                        "OF THE OFFERED RATE")
        lines.append(Text(offered, style="bold red" if t.fell_behind else ""))
    tokens = [f"prompt {s.mean_prompt_tokens:.0f}" if s.mean_prompt_tokens else None,
              f"output {s.mean_output_tokens:.0f}" if s.mean_output_tokens else None]
    if any(tokens):
        lines.append(Text(f"tokens      mean {' · '.join(x for x in tokens if x)} · "
                          f"{100 * s.tokens_from_usage:.0f}% counted by the server's usage"))
    if s.cache is not None:
        lines.append(Text(f"prompt cache {100 * s.cache.share:.1f}% of prompt tokens from the "
                          f"server's prefix cache ({s.cache.source})"))
    if s.failures:
        failed = sum(s.failures.values())
        by_class = ", ".join(f"{k} ×{v}" for k, v in sorted(s.failures.items()))
        share = 100 * failed / s.in_window if s.in_window else 100.0
        lines.append(Text(f"failures    {failed} ({share:.1f}%): {by_class}", style="bold red"))
    g = s.goodput
    if g:
        slos = ", ".join(f"{k} ≤ {v:g} ms" for k, v in g.slos.items())
        rate = f"{g.requests_per_s:.2f} req/s · " if g.requests_per_s is not None else ""
        lines.append(Text(f"goodput     {rate}{100 * g.fraction:.1f}% of requests good "
                          f"({slos})"))
    c = s.client
    if c:
        lag, cpu = c.loop_lag_ms, c.cpu_percent
        numbers = ["THE CLIENT WAS THE BOTTLENECK" if c.bottleneck else "ok",
                   f"{c.workers} worker{'s' if c.workers > 1 else ''}"]
        if cpu.mean is not None:
            numbers.append(f"CPU {cpu.mean:.0f}% (max {cpu.max:.0f}%)")
        if lag.p99 is not None:
            numbers.append(f"loop lag p99 {lag.p99:.2f} ms")
        if c.lateness_p99_ms is not None:
            numbers.append(f"sends late p99 {c.lateness_p99_ms:.2f} ms")
        lines.append(Text(f"client      {' · '.join(numbers)}",
                          style="bold red" if c.bottleneck else "dim"))
        if c.host is not None:
            h = c.host
            shares = [f"client {h.client.mean:.2f}",
                      f"server {h.server.mean:.2f}" if h.server else None,
                      f"others {h.other.mean:.2f} (max {h.other.max:.2f})",
                      f"steal {100 * h.steal.mean:.0f}%" if h.steal else None]
            lines.append(Text(f"host        {'BUSY WITH OTHER WORK · ' if c.host_busy else ''}"
                              f"{h.busy.mean:.2f} of {h.cpus} cores busy: "
                              f"{' · '.join(x for x in shares if x)}",
                              style="bold red" if c.host_busy else "dim"))
    lines += session_lines(s)
    if s.prediction is not None:
        lines += prediction_lines(s.prediction)
    for warning in s.warnings:
        lines.append(Text(f"! {warning}", style="yellow"))
    return lines
