"""The trace page of `latlab trace`: the rate over time, the prompt and output lengths, and
the profile's numbers, as one self-contained page (plotly.js's bundle inline)."""

from __future__ import annotations

from pathlib import Path

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from latlab.records.trace import Lengths, TraceProfile
from latlab.report.figures import LAYOUT
from latlab.report.page import chart, document, e, settings_table

RATE_COLOR, PROMPT_COLOR, OUTPUT_COLOR = "#4c9be8", "#c355c9", "#4cb86b"


def write_trace_html(path: Path, p: TraceProfile) -> Path:
    """Write the page of `p` to `path`."""
    body = [f"<h1>latlab trace: {e(Path(p.source).name)}</h1>",
            f"<p class=dim>{e(p.source)} ({e(p.format)}) · {p.requests:,} requests over "
            f"{p.span_s:,.1f} s{e(' · ' + p.skipped) if p.skipped else ''}</p>",
            "<h2>Rate over time</h2>",
            chart(rate_figure(p), f"Requests per second in bins of {p.bin_s:g} s from the "
                  f"window's start; the dashed line is the mean ({p.rate:.3g} req/s)."),
            "<h2>Lengths</h2>",
            chart(lengths_figure(p), "Requests per length bin (log-spaced), in tokens as the "
                  "replay sends them (after --length-scale)."),
            "<h2>The synthetic workload closest to it</h2>",
            f"<pre>latlab bench {e(' '.join(p.flags))}</pre>",
            "<h2>Profile</h2>",
            settings_table(p.model_dump(mode="json", exclude={"rate_series"}))]
    path.write_text(document(f"latlab trace: {Path(p.source).name}", body), encoding="utf-8")
    return path


def rate_figure(p: TraceProfile) -> go.Figure:
    x = [i * p.bin_s for i in range(len(p.rate_series))]
    fig = go.Figure(layout={**LAYOUT, "title": "requests per second",
                            "xaxis": {"title": "seconds from the window's start"},
                            "showlegend": False})
    fig.add_trace(go.Scatter(x=x, y=p.rate_series, mode="lines", line_shape="hv",
                             line=dict(color=RATE_COLOR)))
    fig.add_trace(go.Scatter(x=[0, x[-1] if x else 0], y=[p.rate, p.rate], mode="lines",
                             line=dict(color="#888", dash="dash")))
    return fig


def lengths_figure(p: TraceProfile) -> go.Figure | None:
    panels = [(name, lengths, color) for name, lengths, color in (
        ("prompt tokens", p.prompt, PROMPT_COLOR), ("output tokens", p.output, OUTPUT_COLOR))
        if lengths is not None]
    if not panels:
        return None
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[n for n, _, _ in panels])
    for col, (_, lengths, color) in enumerate(panels, 1):
        fig.add_trace(go.Bar(x=_labels(lengths), y=[c for _, c in lengths.histogram],
                             marker_color=color), row=1, col=col)
    fig.update_layout(**{**LAYOUT, "showlegend": False})
    return fig


def _labels(lengths: Lengths) -> list[str]:
    edges = [edge for edge, _ in lengths.histogram] + [lengths.max + 1]
    return [f"{a:,.0f}–{b - 1:,.0f}" for a, b in zip(edges, edges[1:])]
