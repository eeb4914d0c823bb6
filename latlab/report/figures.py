"""Plotly figures of a run's latency: budgets, CDFs, TTFT against prompt length, waterfalls,
per-tenant comparison. The figures over time live in `timeseries`."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from latlab.analysis.budget import Budget, Group
from latlab.analysis.decompose import BUCKETS, COMPONENTS, LABELS
from latlab.records.catalog import CATALOG, charts, metrics
from latlab.records.summary import Distribution
from latlab.report.palette import BUCKET_COLORS, COMPONENT_COLORS, SLO_COLOR
from latlab.units import ms, number

if TYPE_CHECKING:
    from latlab.analysis.run_analysis import RunAnalysis

MAX_POINTS = 4000
CDF_POINTS = 800
MAX_CDF_SAMPLES = 1_000_000
WATERFALL_REQUESTS = 20
BLOCK = 65_536  # requests looked at a time for the longest
CDF_PANELS = tuple((chart, CATALOG[chart].label) for chart in charts())
CDF_COLORS = {"ttft": "#4c9be8", "tpot": "#4cb86b", "itl": "#c355c9", "e2e": "#e0901a"}
CDF_MARKERS = {"p50": "circle", "p99": "diamond"}
SLO_PANEL = {name: CATALOG[name].chart for name in metrics(slo=True)}
LAYOUT = dict(margin=dict(l=60, r=20, t=50, b=40), height=360,  # the template: the page's
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
                    hovertemplate=("%{x:.2f} ms (%{customdata:.1f}%)<extra>" + LABELS[c]
                                   + "</extra>"))
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


def _cdf(values: Sequence[float] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The empirical CDF (x, % ≤ x) of the positive `values`; of many samples, at CDF_POINTS
    quantiles, a quarter of them spread over the tail beyond p90 so that p99 and p99.9 keep
    their shape; of more than MAX_CDF_SAMPLES, of an even sample of them (`cdf_sample`)."""
    data = cdf_sample(np.asarray(values, dtype=float))
    data = np.sort(data[data > 0])
    n = len(data)
    if n <= CDF_POINTS:
        return data, np.arange(1, n + 1) / n * 100
    tail = 1 - np.logspace(-1, -np.log10(n), CDF_POINTS // 4)
    q = np.unique(np.concatenate([np.linspace(0, 1, CDF_POINTS - CDF_POINTS // 4), tail]))
    return np.quantile(data, q).astype(np.float32), (q * 100).astype(np.float32)


def cdf_sample(values: np.ndarray) -> np.ndarray:
    """At most MAX_CDF_SAMPLES of `values`, evenly spaced (all of them when fewer)."""
    return values[::-(-len(values) // MAX_CDF_SAMPLES)] if len(values) else values


def cdf_figure(a: RunAnalysis) -> go.Figure:
    """CDFs of TTFT, TPOT, ITL and E2E on log axes (successful requests in the window; ITL
    pooled over tokens), with the summary's p50 and p99 and their CIs, and the run's SLOs.
    An SLO on TTFT or E2E from schedule adds that CDF to the panel, dashed."""
    ok = a.inside & a.table.ok
    slos = a.config.slos
    panels = []
    for metric, name in CDF_PANELS:
        shown = [metric] + ([f"{metric}_sched"] if f"{metric}_sched" in slos else [])
        samples = {s: _samples(a, ok, s) for s in shown}
        zeros = sum(int(np.count_nonzero(values <= 0)) for values in samples.values())
        title = f"{name} (ms)" + (f"; {number(zeros)} at 0 left out" if zeros else "")
        most = max(len(values) for values in samples.values())
        if most > MAX_CDF_SAMPLES:
            title += f"; CDF of an even {number(len(cdf_sample(np.empty(most))))} of {number(most)}"
        panels.append((metric, name, title, samples))
    fig = make_subplots(rows=2, cols=2, subplot_titles=[p[2] for p in panels],
                        vertical_spacing=0.16)
    for i, (metric, name, _, samples) in enumerate(panels):
        cell = dict(row=i // 2 + 1, col=i % 2 + 1)
        for series, values in samples.items():
            label = name if series == metric else f"{name} from schedule"
            x, y = _cdf(values)
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


def _samples(a: RunAnalysis, ok: np.ndarray, metric: str) -> np.ndarray:
    """The samples of `metric` of the requests `ok` (ITL pooled over tokens)."""
    metrics = a.requests.metrics
    if metric == "itl":
        return metrics.itl.select(ok)
    values = getattr(metrics, metric)[ok]
    return values[~np.isnan(values)]


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
    """TTFT against prompt length, one colour per tenant; of many requests, an even sample."""
    ttft, prompt = a.requests.metrics.ttft, a.requests.prompt_tokens
    rows = np.flatnonzero(a.inside & ~np.isnan(ttft) & ~np.isnan(prompt))
    shown = rows[:: max(1, len(rows) // MAX_POINTS)]
    title = "TTFT against prompt length" + (
        f" ({number(len(shown))} of {number(len(rows))} requests, evenly spaced)"
        if len(shown) < len(rows) else "")
    fig = _figure(title, xaxis_title="prompt tokens", yaxis_title="TTFT (ms)")
    tenant = a.table.tenant
    names = sorted({tenant[i] or "" for i in shown})
    for name in names:
        mine = shown[(tenant.mask(name) if name else tenant.codes == -1)[shown]]
        fig.add_scatter(x=prompt[mine].astype(int), y=ttft[mine],
                        mode="markers", marker=dict(size=5, opacity=0.6),
                        name=name or "requests", showlegend=len(names) > 1,
                        text=[f"#{i}" for i in a.table.index[mine]],
                        hovertemplate="%{text}: %{x} tokens, %{y:.1f} ms<extra></extra>")
    return fig


def waterfall_figure(a: RunAnalysis) -> go.Figure:
    """The slowest requests' stages laid end to end from their scheduled time (network is
    upload and download together, drawn before the server's stages)."""
    parts = a.requests.parts
    slowest = longest(np.flatnonzero(a.ok), lambda rows: parts.total[rows],
                      WATERFALL_REQUESTS)[::-1]
    prompt = a.requests.prompt_tokens_of(slowest)
    labels = [f"#{i} ({int(p) if p else '?'} tok)" for i, p in
              zip(a.table.index[slowest], np.nan_to_num(prompt))]
    fig = _figure(f"The {len(slowest)} slowest requests, stage by stage (ms from schedule)",
                  barmode="overlay", height=max(300, 26 * len(slowest) + 120))
    start = np.zeros(len(slowest))
    for c in COMPONENTS:
        widths = parts.value(c, slowest)  # their rows only: not a copy of the column
        if not widths.any():
            continue
        fig.add_bar(name=LABELS[c], orientation="h", y=labels, x=widths, base=start.copy(),
                    marker_color=COMPONENT_COLORS[c],
                    hovertemplate="%{x:.1f} ms<extra>" + LABELS[c] + "</extra>")
        start += np.maximum(widths, 0)
    return fig


def longest(rows: np.ndarray, took: Callable[[np.ndarray], np.ndarray], k: int
            ) -> np.ndarray:
    """The `k` of `rows` (indices, in order) whose `took(rows)` is largest, the earlier first
    of equal ones, longest first: a block of rows at a time (a big run's every request's
    time would be sorted else)."""
    kept, times = rows[:0], None
    for at in range(0, len(rows), BLOCK):
        block = rows[at:at + BLOCK]
        time = took(block)
        if times is not None:  # the earlier blocks' longest come first
            block, time = np.concatenate([kept, block]), np.concatenate([times, time])
        best = np.argsort(-time, kind="stable")[:k]
        kept, times = block[best], time[best]
    return kept


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
