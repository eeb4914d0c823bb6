"""The run over time: throughput, requests in flight and latency, in bins of the run's span."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from latlab.analysis.budget import in_flight_at
from latlab.report.figures import LAYOUT

if TYPE_CHECKING:
    from latlab.analysis.analyze import RunAnalysis

BINS = 60
MIN_BIN_S = 0.1


def over_time_figure(a: RunAnalysis) -> go.Figure | None:
    rows = [row for row in a.rows if row.record.sent_ns is not None]
    if not rows:
        return None
    records = [row.record for row in rows]
    origin = min(r.origin_ns for r in records)
    end = max(r.end_ns for r in records)
    width = max((end - origin) / 1e9 / BINS, MIN_BIN_S)
    edges = np.arange(0, (end - origin) / 1e9 + width, width)
    centers = (edges[:-1] + edges[1:]) / 2

    def seconds(values: list[int]) -> np.ndarray:
        return (np.asarray(values, dtype=np.int64) - origin) / 1e9

    token_t = seconds([t for r in records for t in r.token_ns])
    token_k = np.asarray([k for r in records for k in r.token_counts], dtype=float)
    done = seconds([r.done_ns for r in records if r.ok and r.done_ns is not None])
    tokens_per_s = np.histogram(token_t, edges, weights=token_k)[0] / width
    done_per_s = np.histogram(done, edges)[0] / width

    in_flight = in_flight_at([r.sent_ns for r in records], [r.end_ns for r in records],
                             origin + (centers * 1e9).astype(np.int64))

    timed = [row for row in rows if row.metrics.ttft is not None]
    ttft = np.asarray([row.metrics.ttft for row in timed])
    which = np.digitize(seconds([row.record.sent_ns for row in timed]), edges) - 1
    p50, p99 = np.full(len(centers), np.nan), np.full(len(centers), np.nan)
    for i in range(len(centers)):
        values = ttft[which == i]
        if values.size:
            p50[i], p99[i] = np.percentile(values, 50), np.percentile(values, 99)

    server = [s for s in a.scrapes if s.values]
    n = 4 if server else 3
    fig = make_subplots(rows=n, cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        subplot_titles=("throughput", "requests in flight", "TTFT by send time",
                                        "the server's own view (/metrics)")[:n],
                        specs=[[{"secondary_y": True}], [{}], [{}],
                               [{"secondary_y": True}]][:n])
    fig.add_scatter(x=centers, y=tokens_per_s, name="output tokens/s", row=1, col=1)
    fig.add_scatter(x=centers, y=done_per_s, name="completed req/s", row=1, col=1,
                    secondary_y=True)
    fig.add_scatter(x=centers, y=in_flight, name="in flight", line_shape="hv", row=2, col=1)
    fig.add_scatter(x=centers, y=p50, name="TTFT p50 (ms)", mode="lines+markers", row=3, col=1)
    fig.add_scatter(x=centers, y=p99, name="TTFT p99 (ms)", mode="lines+markers", row=3, col=1)
    if server:
        t = seconds([s.t_ns for s in server])
        for series in ("running", "waiting"):
            fig.add_scatter(x=t, y=[s.values.get(series) for s in server], line_shape="hv",
                            name=f"server: {series}", row=4, col=1)
        fig.add_scatter(x=t, y=[s.values.get("kv_usage") for s in server], name="KV cache used",
                        line=dict(dash="dot"), row=4, col=1, secondary_y=True)
        fig.update_yaxes(title_text="requests", row=4, col=1, secondary_y=False)
        fig.update_yaxes(title_text="KV used", range=[0, 1], row=4, col=1, secondary_y=True)
    fig.update_xaxes(title_text="seconds since the run started", row=n, col=1)
    fig.update_yaxes(title_text="tokens/s", row=1, col=1, secondary_y=False)
    fig.update_yaxes(title_text="req/s", row=1, col=1, secondary_y=True)
    fig.update_yaxes(title_text="ms", row=3, col=1)
    fig.update_layout(**{**LAYOUT, "height": 640 + 200 * (n - 3), "title": "Over time",
                         "legend": dict(orientation="h", y=-0.1)})
    return fig
