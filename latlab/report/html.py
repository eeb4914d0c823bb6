"""`write_html(run, analysis)`: one self-contained HTML report (plotly.js inline, no network)."""

from __future__ import annotations

import html
import time
from pathlib import Path
from typing import TYPE_CHECKING

import plotly.graph_objects as go
import plotly.io as pio
from plotly.offline import get_plotlyjs

from latlab.analysis import decompose
from latlab.analysis.decompose import COMPONENTS, LABELS
from latlab.records.summary import RunSummary
from latlab.report import figures
from latlab.report.palette import SEVERITY_COLORS
from latlab.report.timeseries import over_time_figure
from latlab.units import ms

if TYPE_CHECKING:
    from latlab.analysis.analyze import RunAnalysis
    from latlab.records.folder import RunFolder

SUMMARY_METRICS = ("ttft", "ttft_sched", "tpot", "itl", "e2e", "e2e_sched", "lateness")
PLOT_CONFIG = {"displaylogo": False, "responsive": True}
STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;
max-width:1100px;padding:1rem 2rem;color:#222}
h1{font-size:1.5rem}h2{font-size:1.2rem;margin-top:2rem;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.9rem}td,th{padding:.2rem .6rem;text-align:right}
td:first-child,th:first-child{text-align:left}tr:nth-child(even){background:#f6f6f6}
.note{background:#fff6e0;padding:.4rem .8rem;margin:.3rem 0;border-left:4px solid #e0901a}
.finding{border-left:6px solid;padding:.3rem 1rem;margin:.8rem 0;background:#fafafa}
.badge{color:#fff;padding:0 .4rem;border-radius:3px;font-size:.8rem;text-transform:uppercase}
.dim{color:#777}pre{background:#f6f6f6;padding:.8rem;overflow:auto;font-size:.8rem}
"""


def write_html(run: RunFolder, analysis: RunAnalysis, path: Path | None = None) -> Path:
    """Write the report (default: the run folder's `report.html`) and return its path."""
    path = path or run.report_path
    config = analysis.config
    about = [time.strftime("%Y-%m-%d %H:%M:%S"), f"{len(analysis.rows)} requests"]
    about += [str(v) for v in (config.target.url, config.target.model) if v]
    if config.command:
        about.append(config.command)
    kind = " (PREDICTED: simulated, not measured)" if config.simulation is not None else ""
    page = [f"<h1>latlab report: {_e(run.path.name)}{_e(kind)}</h1>",
            f"<p class=dim>{_e(' · '.join(about))}</p>"]
    page += [f"<div class=note>{_e(n)}</div>"
             for n in [*analysis.notes, *analysis.summary.warnings]]
    page += ["<h2>Summary</h2>", _summary_table(analysis.summary), _findings(analysis)]
    page += _charts(analysis)
    page += ["<h2>Run configuration</h2>",
             f"<pre>{_e(config.model_dump_json(indent=2))}</pre>",
             "<h2>Definitions</h2>", _definitions(analysis.summary)]
    path.write_text(document(f"latlab report: {run.path.name}", page), encoding="utf-8")
    return path


def document(title: str, body: list[str]) -> str:
    """A self-contained page of `body`'s HTML parts: the reports' style, plotly.js inline."""
    return (f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8>"
            f"<title>{_e(title)}</title><style>{STYLE}</style>"
            f"<script>{get_plotlyjs()}</script></head><body>{''.join(body)}</body></html>")


def _e(text: str) -> str:
    return html.escape(text, quote=True)


def chart(fig: go.Figure | None, about: str) -> str:
    """A figure with its caption, for `document`."""
    if fig is None:
        return ""
    return (f"<p class=dim>{_e(about)}</p>"
            + pio.to_html(fig, full_html=False, include_plotlyjs=False, config=PLOT_CONFIG))


def _charts(a: RunAnalysis) -> list[str]:
    if a.mean is None:
        return ["<h2>Latency budget</h2><p>No successful request: nothing to decompose.</p>"]
    out = ["<h2>Latency budget</h2>",
           chart(figures.budget_figure(a), "The mean request and the p99 tail (requests at or "
                  "above the p99 of E2E from schedule), in the four buckets."),
           chart(figures.components_figure(a), "Every component, with its quality flag."),
           _components_table(a),
           chart(figures.groups_figure(a.by_prompt, "Budget by prompt length",
                                        "prompt tokens"),
                  "Share of the mean E2E per bucket: prefill's share should grow with length."),
           chart(figures.groups_figure(a.over_time, "Budget over the run", "window"),
                  "Share of the mean E2E per bucket in consecutive windows of the run."),
           "<h2>Distributions</h2>",
           chart(figures.cdf_figure(a), "Successful requests; ITL pooled over tokens."),
           chart(figures.ttft_prompt_figure(a), "Each dot is a request."),
           "<h2>The slowest requests</h2>",
           chart(figures.waterfall_figure(a), "Stages laid end to end from the scheduled time; "
                  "network is upload and download together."),
           "<h2>Over time</h2>", chart(over_time_figure(a), "Bins of the run's span.")]
    tenants = figures.tenants_figure(a)
    if tenants is not None:
        out += ["<h2>Tenants and priorities</h2>",
                chart(tenants, "Latency percentiles per label."),
                chart(figures.groups_figure(a.by_tenant or a.by_priority, "Budget per label",
                                             "label"), "Share of the mean E2E per bucket.")]
    return out


def _summary_table(summary: RunSummary) -> str:
    quantiles = ("p50", "p90", "p99", "p99.9")
    head = "".join(f"<th>{q}</th>" for q in ("metric", "n", "mean", *quantiles))
    rows = []
    for name in SUMMARY_METRICS:
        d = summary.latency.get(name)
        if not d or not d.n:
            continue
        cells = [_e(name), str(d.n), ms(d.mean)]
        for q in quantiles:
            p = d.percentiles.get(q)
            cells.append(ms(p.value if p else None) + ("" if p is None or p.reliable else "*"))
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    t = summary.throughput
    failures = ", ".join(f"{k} ×{v}" for k, v in sorted(summary.failures.items())) or "none"
    lines = [f"{summary.ok} of {summary.in_window} requests in the window succeeded; "
             f"failures: {failures}"]
    if t:
        offered = "a burst" if t.offered_rate is None else f"{t.offered_rate:.2f} req/s"
        lines.append(f"offered {offered}, achieved {t.achieved_rate:.2f} req/s, "
                     f"{t.output_tokens_per_s:.1f} output tokens/s over {t.window_s:.1f} s")
    return (f"<table><tr>{head}</tr>{''.join(rows)}</table>"
            "<p class=dim>* fewer than 10 samples beyond this percentile: unreliable</p>"
            + "".join(f"<p>{_e(line)}</p>" for line in lines))


def _findings(a: RunAnalysis) -> str:
    out = ["<h2>Findings</h2>"]
    if not a.findings:
        out.append("<p>None: every rule that could run found nothing wrong.</p>")
    for f in a.findings:
        color = SEVERITY_COLORS[str(f.severity)]
        evidence = "".join(f"<li>{_e(line)}</li>" for line in f.evidence)
        out.append(f"<div class=finding style='border-color:{color}'><p><span class=badge "
                   f"style='background:{color}'>{f.severity}</span> <b>{_e(f.title)}</b></p>"
                   f"<ul>{evidence}</ul><p>Where the time goes: <i>{_e(f.where)}</i><br>"
                   f"Try first: <i>{_e(f.fix)}</i></p></div>")
    if a.unevaluated:
        items = "".join(f"<li>{_e(u.rule)}: {_e(u.needs)}</li>" for u in a.unevaluated)
        out.append(f"<details class=dim><summary>Not evaluated ({len(a.unevaluated)})</summary>"
                   f"<ul>{items}</ul></details>")
    return "".join(out)


def _components_table(a: RunAnalysis) -> str:
    head = "<tr><th>component</th><th>mean</th><th>share</th><th>p99 tail</th><th>share</th>" \
           "<th>quality</th><th>measured for</th></tr>"
    rows = [f"<tr><td>{_e(LABELS[c])}</td><td>{ms(a.mean.components[c])}</td>"
            f"<td>{100 * a.mean.share(c):.1f}%</td><td>{ms(a.tail.components[c])}</td>"
            f"<td>{100 * a.tail.share(c):.1f}%</td><td>{a.mean.quality[c]}</td>"
            f"<td>{100 * a.mean.coverage[c]:.0f}%</td></tr>"
            for c in COMPONENTS if a.mean.quality[c] is not None]
    return f"<table>{head}{''.join(rows)}</table>"


def _definitions(summary: RunSummary) -> str:
    formulas = summary.formulas
    rows = "".join(f"<tr><td>{_e(k)}</td><td style='text-align:left'>{_e(str(v))}</td></tr>"
                   for k, v in formulas.items())
    return f"<table>{rows}</table><pre>{_e(decompose.__doc__ or '')}</pre>"
