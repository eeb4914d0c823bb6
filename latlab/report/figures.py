"""Plotly figures of a run's latency: budgets, CDFs, TTFT against prompt length, waterfalls,
per-tenant comparison. The figures over time live in `timeseries`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from latlab.analysis.budget import Budget, Group, prompt_tokens
from latlab.analysis.decompose import BUCKETS, COMPONENTS, LABELS
from latlab.report.palette import BUCKET_COLORS, COMPONENT_COLORS

if TYPE_CHECKING:
    from latlab.analysis.analyze import RunAnalysis

MAX_POINTS = 4000
WATERFALL_REQUESTS = 20
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
    data = np.sort(np.asarray(values, dtype=float))
    if len(data) > MAX_POINTS:
        q = np.linspace(0, 1, MAX_POINTS)
        return np.quantile(data, q), q * 100
    return data, np.arange(1, len(data) + 1) / len(data) * 100


def cdf_figure(a: RunAnalysis) -> go.Figure:
    """CDFs of TTFT, TPOT, ITL and E2E (successful requests; ITL pooled over tokens)."""
    ok = [r.metrics for r in a.measured if r.record.ok]
    series = {
        "TTFT (ms)": [m.ttft for m in ok if m.ttft is not None],
        "TPOT (ms)": [m.tpot for m in ok if m.tpot is not None],
        "ITL (ms)": [v for m in ok for v in m.itl],
        "E2E (ms)": [m.e2e for m in ok if m.e2e is not None],
    }
    fig = make_subplots(rows=2, cols=2, subplot_titles=list(series), vertical_spacing=0.16)
    for i, (name, values) in enumerate(series.items()):
        x, y = _cdf(values)
        fig.add_scatter(x=x, y=y, mode="lines", name=name, showlegend=False,
                        row=i // 2 + 1, col=i % 2 + 1,
                        hovertemplate="%{x:.1f} ms: %{y:.1f}% of samples<extra></extra>")
    fig.update_yaxes(title_text="% ≤ x", range=[0, 100])
    fig.update_layout(**{**LAYOUT, "height": 560, "title": "Distributions (CDF)"})
    return fig


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
