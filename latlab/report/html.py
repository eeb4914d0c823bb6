"""`write_html(run, analysis)`: one self-contained HTML report (`page`: plotly.js inline, no
network)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from latlab.analysis import decompose
from latlab.analysis.decompose import label
from latlab.records.catalog import metrics
from latlab.records.summary import Percentile, RunSummary
from latlab.report import figures, gantt, sessions_html, timeseries
from latlab.report.console import load_phrase, server_view_lines
from latlab.report.gateway import hop_lines, target_lines
from latlab.report.page import chart, document, e, settings_table
from latlab.report.palette import SEVERITY_COLORS
from latlab.units import ms, number, pct

if TYPE_CHECKING:
    import plotly.graph_objects as go

    from latlab.analysis.run_analysis import RunAnalysis
    from latlab.records.folder import RunFolder

SUMMARY_METRICS = metrics(summary=True)
QUANTILES = ("p50", "p90", "p99", "p99.9")


def write_html(run: RunFolder, analysis: RunAnalysis, path: Path | None = None) -> Path:
    """Write the report (default: the run folder's `report.html`) and return its path."""
    path = path or run.report_path
    config = analysis.config
    about = [time.strftime("%Y-%m-%d %H:%M:%S"), f"{number(len(analysis.rows))} requests"]
    about += [str(v) for v in (config.target.url, config.target.model) if v]
    if config.command:
        about.append(config.command)
    kind = " (PREDICTED: simulated, not measured)" if config.simulation is not None else ""
    page = [f"<h1>latlab report: {e(run.path.name)}{e(kind)}</h1>",
            f"<p class=dim>{e(' · '.join(about))}</p>"]
    page += [f"<div class=note>{e(n)}</div>"
             for n in [*analysis.notes, *analysis.summary.warnings]]
    page += ["<h2>Summary</h2>", _summary_table(analysis.summary), _findings(analysis)]
    page += _hop(analysis)
    page += _server_view(analysis)
    page += _charts(analysis)
    page += ["<h2>Run configuration</h2>", settings_table(config.model_dump(mode="json")),
             "<h2>Definitions</h2>", _definitions(analysis.summary)]
    path.write_text(document(f"latlab report: {run.path.name}", page), encoding="utf-8")
    return path


def _charts(a: RunAnalysis) -> list[str]:
    if a.mean is None:
        out = ["<h2>Latency budget</h2><p>No successful request: nothing to decompose.</p>"]
    else:
        out = _budget_charts(a)
    shaded = "Shaded: warmup and cooldown, outside the measurement window."
    out += ["<h2>Over time</h2>",
            chart(_drawn(gantt.gantt_figure, a), "Each bar is a request on the run's clock, from "
                  "its scheduled time to its end, coloured by outcome; ticks: the token events "
                  f"of the slowest. {shaded}"),
            chart(_drawn(timeseries.over_time_figure, a), f"Bins of the run's span. {shaded}"),
            chart(_drawn(timeseries.outcomes_figure, a),
                  "Requests by the bin they ended in: failures "
                  "by class, and those that succeeded, meeting the run's SLOs or not. "
                  f"{shaded}")]
    if a.summary.sessions is not None:
        out += ["<h2>Sessions</h2>",
                chart(_drawn(sessions_html.turns_figure, a), "Successful requests of the window by "
                      "their place in the session: each turn resends the history."),
                chart(_drawn(sessions_html.steps_figure, a),
                      "The mean of each step over the complete "
                      "agent tasks: the tool step and orchestration before its model call.")]
    tenants = _drawn(figures.tenants_figure, a) if a.mean is not None else None
    if tenants is not None:
        out += ["<h2>Tenants and priorities</h2>",
                chart(tenants, "Latency percentiles per label."),
                chart(figures.groups_figure(a.by_tenant or a.by_priority, "Budget per label",
                                            "label"), "Share of the mean E2E per bucket.")]
    return out


def _drawn(figure: Callable[[RunAnalysis], go.Figure | None], a: RunAnalysis
           ) -> go.Figure | None:
    """`figure(a)`, then the pages of the columns it read given back (a spilled analysis)."""
    made = figure(a)
    a.requests.give_back()
    return made


def _budget_charts(a: RunAnalysis) -> list[str]:
    return ["<h2>Latency budget</h2>",
            chart(_drawn(figures.budget_figure, a),
                  "The mean request and the p99 tail (requests at or "
                  "above the p99 of E2E from schedule), in the four buckets."),
            chart(_drawn(figures.components_figure, a), "Every component, with its quality flag."),
            _components_table(a),
            chart(figures.groups_figure(a.by_prompt, "Budget by prompt length", "prompt tokens"),
                  "Share of the mean E2E per bucket: prefill's share should grow with length."),
            chart(figures.groups_figure(a.over_time, "Budget over the run", "window"),
                  "Share of the mean E2E per bucket in consecutive windows of the run."),
            "<h2>Distributions</h2>",
            chart(_drawn(figures.cdf_figure, a),
                  "Successful requests in the measurement window, on a "
                  "log axis; ITL pooled over tokens. Markers: p50 and p99 with their 95% "
                  "confidence intervals (the summary's); dashed lines: the run's SLOs."),
            chart(_drawn(figures.ttft_prompt_figure, a), "Each dot is a request."),
            "<h2>The slowest requests</h2>",
            chart(_drawn(figures.waterfall_figure, a),
                  "Stages laid end to end from the scheduled time; "
                  "network is upload and download together.")]


def _summary_table(summary: RunSummary) -> str:
    head = "".join(f"<th>{q}</th>" for q in ("metric", "n", "mean", *QUANTILES))
    rows = []
    for name in SUMMARY_METRICS:
        d = summary.latency.get(name)
        if not d or not d.n:
            continue
        cells = [e(name), number(d.n), ms(d.mean)]
        cells += [_percentile(d.percentiles.get(q)) for q in QUANTILES]
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    predicted = summary.prediction
    run = (f"a run of {predicted.run_requests:,} requests" if predicted and
           predicted.run_requests else "a run like this")
    interval = (f"; then, predicted, the {100 * predicted.level:g}% interval of "
                f"{predicted.draws} draws ({e(predicted.spread)}): where {run} will measure "
                "it, its own luck included" if predicted else "")
    return (f"<table><tr>{head}</tr>{''.join(rows)}</table>"
            "<p class=dim>Under each percentile its 95% confidence interval"
            f"{interval}; * fewer than 10 samples beyond this percentile: unreliable</p>"
            + "".join(f"<p>{e(note)}</p>" for note in (predicted.notes if predicted else []))
            + "".join(f"<p>{e(line)}</p>" for line in _summary_lines(summary)))


def _percentile(p: Percentile | None) -> str:
    if p is None:
        return ms(None)
    mark = "" if p.reliable else "*"
    drawn = (f"<br><span class=ci>predicted {ms(p.lo)} to {ms(p.hi)}</span>"
             if p.lo is not None else "")
    return (f"{ms(p.value)}{mark}<br><span class=ci>{ms(p.ci_low)} to {ms(p.ci_high)}</span>"
            f"{drawn}")


def _summary_lines(summary: RunSummary) -> list[str]:
    failures = ", ".join(f"{k} ×{number(v)}" for k, v in sorted(summary.failures.items()))
    lines = [f"{number(summary.ok)} of {number(summary.in_window)} requests in the window "
             f"succeeded; failures: {failures or 'none'}"
             + (f"; cancelled by an interruption: {number(summary.cancelled)}"
                if summary.cancelled else "")]
    t = summary.throughput
    if t:
        lines.append(f"{load_phrase(t)}, achieved {number(t.achieved_rate, '{:.2f}')} req/s, "
                     f"{number(t.output_tokens_per_s, '{:.1f}')} output tokens/s over "
                     f"{number(t.window_s, '{:.1f}')} s")
    g = summary.goodput
    if g is None:
        lines.append("goodput: no SLO given (latlab bench --slo ttft=200ms ...)")
    else:
        slos = ", ".join(f"{name} ≤ {ms(limit)}" for name, limit in g.slos.items())
        rate = "" if g.requests_per_s is None else f"{number(g.requests_per_s, '{:.2f}')} req/s, "
        lines.append(f"goodput {rate}{number(g.good)} requests ({pct(g.fraction)}) met every "
                     f"SLO: {slos}")
    if summary.cache is not None:
        lines.append(f"prompt cache: {pct(summary.cache.share)} of prompt tokens came from the "
                     f"server's prefix cache ({summary.cache.source})")
    host = summary.client.host if summary.client else None
    if host is not None:
        server = f", the server {host.server.mean:.2f}" if host.server else ""
        lines.append(f"host: {host.busy.mean:.2f} of {host.cpus} cores busy: the client "
                     f"{host.client.mean:.2f}{server}, other work {host.other.mean:.2f}"
                     + (" (busy with other work: the timings are unreliable)"
                        if summary.client.host_busy else ""))
    return lines


def _findings(a: RunAnalysis) -> str:
    out = ["<h2>Findings</h2>"]
    if not a.findings:
        out.append("<p>None: every rule that could run found nothing wrong.</p>")
    for f in a.findings:
        color = SEVERITY_COLORS[str(f.severity)]
        evidence = "".join(f"<li>{e(line)}</li>" for line in f.evidence)
        out.append(f"<div class=finding style='border-color:{color}'><p><span class=badge "
                   f"style='background:{color}'>{f.severity}</span> <b>{e(f.title)}</b></p>"
                   f"<ul>{evidence}</ul><p>Where the time goes: <i>{e(f.where)}</i><br>"
                   f"Try first: <i>{e(f.fix)}</i>"
                   + "".join(f"<br><span class=dim>{e(note)}</span>" for note in f.notes)
                   + "</p></div>")
    if a.unevaluated:
        items = "".join(f"<li>{e(u.rule)}: {e(u.needs)}</li>" for u in a.unevaluated)
        out.append(f"<details class=dim><summary>Not evaluated ({len(a.unevaluated)})</summary>"
                   f"<ul>{items}</ul></details>")
    return "".join(out)


def _components_table(a: RunAnalysis) -> str:
    head = "<tr><th>component</th><th>mean</th><th>share</th><th>p99 tail</th><th>share</th>" \
           "<th>quality</th><th>measured for</th></tr>"
    rows = [f"<tr><td>{e(label(c))}</td><td>{ms(a.mean.components[c])}</td>"
            f"<td>{pct(a.mean.share(c))}</td><td>{ms(a.tail.components.get(c))}</td>"
            f"<td>{pct(a.tail.share(c))}</td><td>{a.mean.quality[c]}</td>"
            f"<td>{pct(a.mean.coverage[c])}</td></tr>"
            for c in a.mean.components if a.mean.quality[c] is not None]
    return f"<table>{head}{''.join(rows)}</table>"


def _definitions(summary: RunSummary) -> str:
    formulas = summary.formulas
    rows = "".join(f"<tr><td>{e(k)}</td><td style='text-align:left'>{e(str(v))}</td></tr>"
                   for k, v in formulas.items())
    return f"<table>{rows}</table><pre>{e(decompose.__doc__ or '')}</pre>"


def _hop(analysis: RunAnalysis) -> list[str]:
    """The gateway in front of the engine and its hop (`analysis.hop`); nothing without one."""
    out = [f"<p>{e(line)}</p>" for line in target_lines(analysis)]
    if analysis.hop is not None:
        title, *lines = hop_lines(analysis.hop)
        out += [f"<h2>{e(title)}</h2>", "<ul>" + "".join(f"<li>{e(x)}</li>" for x in lines)
                + "</ul>"]
    return out


def _server_view(analysis: RunAnalysis) -> list[str]:
    """The server's own account from its /metrics (`--scrape`), checked against the client's
    records; nothing without one."""
    v = analysis.server
    if v is None:
        return []
    title, per_request = server_view_lines(v)
    checks = "".join(f"<li{'' if v.agrees else ' class=warn'}>{e(c)}</li>" for c in v.checks)
    return [f"<h2>{e(title)}</h2>", f"<p>{e(per_request)}</p>", f"<ul>{checks}</ul>"]
