"""The sweep report: the throughput–latency curve, the latency budget at every point, the
answers (knee, SLO-max, cost) and the stop rule, as one self-contained page from sweep.json."""

from __future__ import annotations

from pathlib import Path

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from latlab.analysis.decompose import BUCKETS
from latlab.records.catalog import CATALOG, metrics
from latlab.records.sweep import Point, SweepRecord
from latlab.report.figures import LAYOUT
from latlab.report.page import chart, document, e, settings_table
from latlab.report.palette import BUCKET_COLORS
from latlab.report.sweep import cache_warning, ordered, slo_max_interval
from latlab.units import money, number

REPORT = "sweep.html"
CURVE_METRICS = tuple((name, CATALOG[name].label) for name in metrics(curve=True))
QUANTILE_STYLE = {"p50": dict(dash="dot", color="#4c9be8"), "p99": dict(color="#c355c9")}


def write_sweep_html(folder: Path, sweep: SweepRecord) -> Path:
    """Write `folder/sweep.html` from the sweep's record and return its path."""
    points = sweep.points
    by_label = {p.label: p for p in points}
    curve = [by_label[label] for label in sweep.curve]
    target = sweep.target
    about = " · ".join(str(v) for v in (target.url, target.model,
                                        " ".join(target.serve_args) or None,
                                        " ".join(sweep.command) or None) if v)
    body = [f"<h1>latlab sweep: {e(folder.name)}</h1>", f"<p class=dim>{e(about)}</p>",
            "<h2>Answers</h2>", _answers(sweep),
            "<h2>Throughput and latency</h2>",
            chart(curve_figure(sweep, curve, points), "Each marker is a point of the sweep, at "
                  "the throughput it achieved; grey markers are the points beside the curve "
                  "(the synchronous one and the saturation probe, p99); dashed lines are the "
                  "SLO limits."),
            "<h2>Where the time goes at each point</h2>",
            chart(budget_figure(points), "Share of E2E from schedule per bucket, by point in "
                  "order of load: where the added latency comes from as the load grows — the "
                  "queue, or slower decoding in bigger batches."),
            "<h2>Points</h2>", _points_table(sweep),
            "<h2>Definitions</h2>",
            f"<pre>{e(sweep.definitions.get('capacity') or '')}</pre>",
            "<h2>Sweep configuration</h2>",
            settings_table(sweep.config)]
    path = folder / REPORT
    path.write_text(document(f"latlab sweep: {folder.name}", body), encoding="utf-8")
    return path


def curve_figure(sweep: SweepRecord, curve: list[Point], points: list[Point]) -> go.Figure:
    """p50 and p99 of TTFT, TPOT and E2E, and goodput, against the achieved throughput."""
    last = "goodput (req/s)" if sweep.slos else "output tokens/s"
    fig = make_subplots(rows=2, cols=2, vertical_spacing=0.16, horizontal_spacing=0.1,
                        subplot_titles=[f"{name} (ms)" for _, name in CURVE_METRICS] + [last])
    x = [p.achieved for p in curve]
    labels = [p.label for p in curve]
    for i, (metric, name) in enumerate(CURVE_METRICS):
        row, col = i // 2 + 1, i % 2 + 1
        for q, style in QUANTILE_STYLE.items():
            fig.add_scatter(x=x, y=[p.latencies[metric][q] for p in curve], text=labels,
                            mode="lines+markers", name=q, legendgroup=q, showlegend=i == 0,
                            row=row, col=col, line=style,
                            hovertemplate="%{text}: %{x:.3g} req/s, %{y:.0f} ms<extra>"
                                          f"{name} {q}</extra>")
        if metric in sweep.slos:
            fig.add_hline(y=sweep.slos[metric], line_dash="dash", line_color="#d9534f",
                          row=row, col=col)
    if sweep.slos:
        y, good = [p.goodput for p in curve], "goodput"
    else:
        y, good = [p.output_tokens_per_s for p in curve], "output tokens/s"
    fig.add_scatter(x=x, y=y, text=labels, mode="lines+markers", name=good, row=2, col=2,
                    line=dict(color="#4cb86b"),
                    hovertemplate="%{text}: %{x:.3g} req/s → %{y:.3g}<extra></extra>")
    beside = [p for p in points if p.label not in sweep.curve and not p.interrupted]
    for p in beside:
        symbol = "circle-open" if p.mode == "synchronous" else "x"
        for i, (metric, _) in enumerate(CURVE_METRICS):
            fig.add_scatter(x=[p.achieved], y=[p.latencies[metric]["p99"]], mode="markers",
                            marker=dict(symbol=symbol, size=9, color="#777"), name=p.label,
                            legendgroup=p.label, showlegend=i == 0, row=i // 2 + 1,
                            col=i % 2 + 1, hovertemplate="%{x:.3g} req/s, p99 %{y:.0f} ms"
                                                         f"<extra>{p.label}</extra>")
    for answer, name, color in ((sweep.knee, "knee", "#777"),
                                (sweep.slo_max, "SLO-max", "#4cb86b")):
        if answer and answer.achieved is not None:
            fig.add_vline(x=answer.achieved, line_dash="dot", line_color=color,
                          annotation_text=name, annotation_font_color=color,
                          annotation_font_size=10)
    fig.update_xaxes(title_text="achieved throughput (req/s)", rangemode="tozero")
    fig.update_yaxes(rangemode="tozero")
    fig.update_layout(**{**LAYOUT, "height": 620, "title": "The throughput–latency curve"})
    return fig


def budget_figure(points: list[Point]) -> go.Figure:
    """The four buckets' shares of E2E from schedule at every point: mean request and p99 tail."""
    shown = [p for p in ordered(points) if p.budget]
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=("mean request", "p99 tail"))
    labels = [p.label for p in shown]
    for bucket in BUCKETS:
        for col, which in ((1, "mean"), (2, "tail")):
            values = [p.budget[which].get(bucket, 0.0) for p in shown]
            if not any(values):
                continue
            totals = [sum(max(v, 0.0) for v in p.budget[which].values()) or 1.0
                      for p in shown]
            fig.add_bar(x=labels, y=[100 * max(v, 0.0) / t for v, t in zip(values, totals)],
                        customdata=values, name=bucket, legendgroup=bucket, showlegend=col == 1,
                        marker_color=BUCKET_COLORS[bucket], row=1, col=col,
                        hovertemplate="%{y:.0f}% (%{customdata:.0f} ms)<extra>" + bucket
                                      + "</extra>")
    fig.update_yaxes(title_text="share of E2E from schedule (%)", range=[0, 100], col=1)
    fig.update_layout(**{**LAYOUT, "barmode": "stack", "height": 420,
                         "title": "Latency budget by point (in order of load)"})
    return fig


def _answers(sweep: SweepRecord) -> str:
    out = []
    knee = sweep.knee
    if knee:
        out.append(f"<p><b>Knee</b>: {e(knee.label)} ({knee.achieved:.3g} req/s achieved); "
                   f"from there to {e(knee.next)} latency grows "
                   f"{number(knee.elasticity, '{:.1f}')}× as fast as throughput.</p>")
    else:
        out.append("<p><b>Knee</b>: not reached — latency never grew faster than throughput "
                   "within the points measured.</p>")
    best = sweep.slo_max
    if best:
        out.append(f"<p><b>SLO-max</b>: {e(best.statement)}.</p>")
        if (span := slo_max_interval(sweep)) is not None:
            out.append(f"<p>{e(span)}</p>")
        links = [f"{side}: <code>{e(Path(ref.run).name)}</code>"
                 for side, ref in (("passing", best.passing), ("failing", best.failing)) if ref]
        if links:
            out.append(f"<p class=dim>evidence — {' · '.join(links)}</p>")
        out += [f"<div class=note>{e(n)}</div>" for n in best.notes]
    else:
        out.append("<p><b>SLO-max</b>: no SLO given (use --slo ttft=500ms ...).</p>")
    if warning := cache_warning(sweep):
        out.append(f"<p class=warn>{e(warning)}</p>")
    if sweep.slo_max_cost:
        c = sweep.slo_max_cost
        out.append(f"<p><b>Cost at the SLO-max</b> (${sweep.price_per_hour:g}/hour): "
                   f"{money(c.per_million_output_tokens)} per million output tokens, "
                   f"{money(c.per_thousand_requests)} per thousand requests.</p>")
    out.append(f"<p><b>Stopped</b>: {e(sweep.stop.reason)} — {e(sweep.stop.message)}<br>"
               f"<span class=dim>rule: {e(sweep.definitions.get('stop_rule', ''))}</span></p>")
    return "".join(out)


def _points_table(sweep: SweepRecord) -> str:
    q = f"p{sweep.percentile:g}"
    slos = sweep.slos
    head = ["point", "load", "achieved req/s", "errors", "TTFT p50", "TTFT p99", "TPOT p50",
            "TPOT p99", "E2E p50", "E2E p99", "out tok/s", "prompt cache"]
    head += [f"{q} {m} (≤{v:g})" for m, v in slos.items()]
    head += ["goodput"] if slos else []
    head += ["$/M out tok", "$/k req"] if sweep.price_per_hour else []
    rows = []
    for p in ordered(sweep.points):
        lat = p.latencies
        cells = [e(p.label) + (" (interrupted)" if p.interrupted else ""),
                 f"{p.load:.3g}", f"{p.achieved:.3g}", f"{100 * p.error_rate:.1f}%",
                 *(number(lat[m][k]) for m in ("ttft", "tpot", "e2e") for k in ("p50", "p99")),
                 f"{p.output_tokens_per_s:.0f}",
                 f"{100 * p.cached_share:.0f}%" if p.cached_share is not None else "–"]
        for m, limit in slos.items():
            v = p.slo_values[m]
            color = "#2e8b57" if v <= limit else "#d9534f"
            cells.append(f"<span style='color:{color}'>{number(v)}</span>")
        if slos:
            cells.append(number(p.goodput, "{:.3g}"))
        if p.cost is not None:
            cells += [money(p.cost.per_million_output_tokens),
                      money(p.cost.per_thousand_requests)]
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    header = "".join(f"<th>{e(h)}</th>" for h in head)
    return (f"<table><tr>{header}</tr>{''.join(rows)}</table><p class=dim>latencies in ms; load "
            "is req/s offered (open loop) or users (closed loop); SLO columns count failed "
            "requests as infinitely slow</p>")
