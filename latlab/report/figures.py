"""Plotly figures of a run's latency: budgets, CDFs, TTFT against prompt length, waterfalls,
per-tenant comparison. The figures over time live in `timeseries`."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from latlab.analysis.budget import Budget, Group, prompt_tokens
from latlab.analysis.decompose import BUCKETS, COMPONENTS, LABELS
from latlab.report.palette import BUCKET_COLORS, COMPONENT_COLORS, SLO_COLOR
from latlab.units import ms, number

if TYPE_CHECKING:
    from latlab.analysis.analyze import RunAnalysis
    from latlab.metrics.request import RequestMetrics
    from latlab.records.summary import Distribution

MAX_POINTS = 4000
CDF_POINTS = 800
WATERFALL_REQUESTS = 20
CDF_PANELS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2e", "E2E"))
CDF_COLORS = {"ttft": "#4c9be8", "tpot": "#4cb86b", "itl": "#c355c9", "e2e": "#e0901a"}
CDF_MARKERS = {"p50": "circle", "p99": "diamond"}
SLO_PANEL = {"ttft": "ttft", "ttft_sched": "ttft", "tpot": "tpot", "itl": "itl", "e2e": "e2e",
             "e2e_sched": "e2e"}
LAYOUT = dict(template="plotly_white", margin=dict(l=60, r=20, t=50, b=40), height=360,
              legend=dict(orientation="h", y=-0.18, traceorder="normal"))


def _figure(title: str, **layout) -> go.Figure:
    return go.Figure(layout={**LAYOUT, "title": title, **layout})


def budget_figure(a: RunAnalysis) -> go.Figure:
    """Stacked bars of the four buckets: the mean request and the p99 tail."""
    rows = {f"p99 tail (n={a.tail.n})": a.tail, f"mean (n={a.mean.n})": a.mean}
    fig = _figure("Latency budget: where the time goes (E2E from schedule, ms)",
                  barmode="stack", height=260)
    for bucket in a.mean.buckets():
        fig.add_bar(name=bucket, orientation="h", y=list(rows), marker_color=BUCKET_COLORS[bucket],
                    x=[b.bucket(bucket) for b in rows.values()],
                    customdata=[100 * b.share(bucket) for b in rows.values()],
                    hovertemplate="%{x:.1f} ms (%{customdata:.1f}%)<extra>" + bucket + "</extra>")
    return fig


def components_figure(a: RunAnalysis) -> go.Figure:
    """The same budget with every component that was measured."""
    rows = {f"p99 tail (n={a.tail.n})": a.tail, f"mean (n={a.mean.n})": a.mean}
    fig = _figure("Every component (ms)", barmode="relative", height=280)
    for c in COMPONENTS:
        if a.mean.quality[c] is None:
            continue
        fig.add_bar(name=f"{LABELS[c]} ({a.mean.quality[c]})", orientation="h", y=list(rows),
                    x=[b.components[c] for b in rows.values()], marker_color=COMPONENT_COLORS[c],
                    customdata=[100 * b.share(c) for b in rows.values()],
                    hovertemplate="%{x:.2f} ms (%{customdata:.1f}%)<extra>" + LABELS[c] + "</extra>")
    return fig


def groups_figure(groups: Sequence[Group], title: str, axis: str) -> go.Figure:
    """The four buckets' shares of E2E per group (prompt-length bucket, time window, label)."""
    groups = [g for g in groups if g.budget is not None]
    fig = _figure(title, barmode="stack", yaxis_title="share of mean E2E (%)", xaxis_title=axis)
    budgets: list[Budget] = [g.budget for g in groups]
    labels = [f"{g.label} (n={g.n})" for g in groups]
    for bucket in BUCKETS:
        values = [b.bucket(bucket) for b in budgets]
        if not any(values):
            continue
        fig.add_bar(name=bucket, x=labels, y=[100 * b.share(bucket) for b in budgets],
                    customdata=values, marker_color=BUCKET_COLORS[bucket],
                    hovertemplate="%{y:.1f}% (%{customdata:.1f} ms)<extra>" + bucket + "</extra>")
    return fig


def _cdf(values: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """The empirical CDF (x, % ≤ x); of many samples, at CDF_POINTS quantiles, a quarter of
    them spread over the tail beyond p90 so that p99 and p99.9 keep their shape."""
    data = np.sort(np.asarray(values, dtype=float))
    n = len(data)
    if n <= CDF_POINTS:
        return data, np.arange(1, n + 1) / n * 100
    tail = 1 - np.logspace(-1, -np.log10(n), CDF_POINTS // 4)
    q = np.unique(np.concatenate([np.linspace(0, 1, CDF_POINTS - CDF_POINTS // 4), tail]))
    return np.quantile(data, q).astype(np.float32), (q * 100).astype(np.float32)


def cdf_figure(a: RunAnalysis) -> go.Figure:
    """CDFs of TTFT, TPOT, ITL and E2E on log axes (successful requests in the window; ITL
    pooled over tokens), with the summary's p50 and p99 and their CIs, and the run's SLOs.
    An SLO on TTFT or E2E from schedule adds that CDF to the panel, dashed."""
    ok = [r.metrics for r in a.measured if r.record.ok]
    slos = a.config.slos
    panels = []
    for metric, name in CDF_PANELS:
        shown = [metric] + ([f"{metric}_sched"] if f"{metric}_sched" in slos else [])
        samples = {s: [v for v in _samples(ok, s) if v is not None] for s in shown}
        zeros = sum(1 for values in samples.values() for v in values if v <= 0)
        title = f"{name} (ms)" + (f"; {number(zeros)} at 0 left out" if zeros else "")
        panels.append((metric, name, title, samples))
    fig = make_subplots(rows=2, cols=2, subplot_titles=[p[2] for p in panels],
                        vertical_spacing=0.16)
    for i, (metric, name, _, samples) in enumerate(panels):
        cell = dict(row=i // 2 + 1, col=i % 2 + 1)
        for series, values in samples.items():
            label = name if series == metric else f"{name} from schedule"
            x, y = _cdf([v for v in values if v > 0])
            fig.add_scatter(x=x, y=y, mode="lines", name=label, showlegend=False,
                            line=dict(color=CDF_COLORS[metric],
                                      dash="solid" if series == metric else "dash"),
                            hovertemplate="%{x:.1f} ms: %{y:.1f}% of samples<extra>"
                                          + label + "</extra>", **cell)
            _percentile_markers(fig, a.summary.latency.get(series), label, i == 0, cell)
        for slo, limit in slos.items():
            if SLO_PANEL.get(slo) == metric:
                fig.add_scatter(x=[limit, limit], y=[0, 100], mode="lines",
                                line=dict(color=SLO_COLOR, dash="dash", width=1.5),
                                name=f"SLO {slo} ≤ {ms(limit)}", showlegend=True,
                                hovertemplate=f"SLO {slo} ≤ {ms(limit)}<extra></extra>", **cell)
    fig.update_xaxes(type="log", title_text="ms (log)")
    fig.update_yaxes(title_text="% ≤ x", range=[0, 103], tickvals=[0, 20, 40, 60, 80, 100])
    fig.update_layout(**{**LAYOUT, "height": 600, "title": "Distributions (CDF)"})
    return fig


def _samples(ok: list[RequestMetrics], metric: str) -> list[float | None]:
    if metric == "itl":
        return [v for m in ok for v in m.itl]
    return [getattr(m, metric) for m in ok]


def _percentile_markers(fig: go.Figure, d: Distribution | None, label: str, legend: bool,
                        cell: dict) -> None:
    """The percentiles of `d` at their height on the CDF, their CI as horizontal error bars."""
    for q, symbol in CDF_MARKERS.items():
        p = d.percentiles.get(q) if d is not None else None
        if p is None or not _finite(p.value) or p.value <= 0:
            continue
        fig.add_scatter(
            x=[p.value], y=[float(q[1:])], mode="markers", name=f"{q} with its 95% CI",
            legendgroup=q, showlegend=legend, marker=dict(symbol=symbol, size=9, color="#222"),
            error_x=dict(type="data", symmetric=False, color="#222", thickness=1.5, width=4,
                         array=[p.ci_high - p.value if _finite(p.ci_high) else None],
                         arrayminus=[p.value - p.ci_low if _finite(p.ci_low) else None]),
            text=[f"{label} {q}: {ms(p.value)}, 95% CI {ms(p.ci_low)} to {ms(p.ci_high)}"
                  + ("" if p.reliable else " (unreliable: under 10 samples beyond it)")],
            hovertemplate="%{text}<extra></extra>", **cell)


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def ttft_prompt_figure(a: RunAnalysis) -> go.Figure:
    """TTFT against prompt length, one colour per tenant."""
    rows = [r for r in a.measured if r.metrics.ttft is not None and prompt_tokens(r) is not None]
    rows = rows[:: max(1, len(rows) // MAX_POINTS)]
    fig = _figure("TTFT against prompt length", xaxis_title="prompt tokens",
                  yaxis_title="TTFT (ms)")
    tenants = sorted({r.record.tenant or "" for r in rows})
    for tenant in tenants:
        mine = [r for r in rows if (r.record.tenant or "") == tenant]
        fig.add_scatter(x=[prompt_tokens(r) for r in mine], y=[r.metrics.ttft for r in mine],
                        mode="markers", marker=dict(size=5, opacity=0.6),
                        name=tenant or "requests", showlegend=len(tenants) > 1,
                        text=[f"#{r.record.index}" for r in mine],
                        hovertemplate="%{text}: %{x} tokens, %{y:.1f} ms<extra></extra>")
    return fig


def waterfall_figure(a: RunAnalysis) -> go.Figure:
    """The slowest requests' stages laid end to end from their scheduled time (network is
    upload and download together, drawn before the server's stages)."""
    slowest = sorted(a.decomposed, key=lambda r: r.parts.total, reverse=True)[:WATERFALL_REQUESTS]
    slowest.reverse()
    labels = [f"#{r.record.index} ({prompt_tokens(r) or '?'} tok)" for r in slowest]
    fig = _figure(f"The {len(slowest)} slowest requests, stage by stage (ms from schedule)",
                  barmode="overlay", height=max(300, 26 * len(slowest) + 120))
    start = np.zeros(len(slowest))
    for c in COMPONENTS:
        widths = np.array([r.parts.ms(c) for r in slowest])
        if not widths.any():
            continue
        fig.add_bar(name=LABELS[c], orientation="h", y=labels, x=widths, base=start.copy(),
                    marker_color=COMPONENT_COLORS[c],
                    hovertemplate="%{x:.1f} ms<extra>" + LABELS[c] + "</extra>")
        start += np.maximum(widths, 0)
    return fig


def tenants_figure(a: RunAnalysis) -> go.Figure | None:
    """TTFT and E2E percentiles per tenant (or per priority when there are no tenants)."""
    groups, what = (a.by_tenant, "tenant") if a.by_tenant else (a.by_priority, "priority")
    groups = [g for g in groups if g.ttft.n]
    if not groups:
        return None
    fig = _figure(f"Per-{what} comparison", barmode="group", yaxis_title="ms",
                  xaxis_title=what)
    labels = [f"{g.label} (n={g.n}, {g.failed} failed)" for g in groups]
    for metric, q in (("TTFT", "p50"), ("TTFT", "p99"), ("E2E", "p50"), ("E2E", "p99")):
        dist = [getattr(g, "ttft" if metric == "TTFT" else "e2e") for g in groups]
        fig.add_bar(name=f"{metric} {q}", x=labels, y=[d[q] for d in dist],
                    hovertemplate="%{y:.1f} ms<extra>" + f"{metric} {q}" + "</extra>")
    return fig
