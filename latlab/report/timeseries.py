"""The run over time, on its clock (seconds since the first scheduled request): throughput,
requests in flight and latency, and how requests ended, in bins of the run's span; warmup
and cooldown shaded."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from latlab.analysis.requests import in_flight_at
from latlab.metrics.slo import meets_slos
from latlab.records.columns import present
from latlab.records.table import OUTCOMES
from latlab.records.timeline import Outcome
from latlab.report.figures import LAYOUT
from latlab.report.palette import OUTCOME_COLORS
from latlab.units import ms

if TYPE_CHECKING:
    from latlab.analysis.run_analysis import RunAnalysis

BINS = 60
OUTCOME_BINS = 30  # fewer: a bin counts the requests that ended in it
MIN_BIN_S = 0.1
BLOCK = 1 << 22  # token events at a time
SHADE = dict(fillcolor="#888", opacity=0.15, line_width=0, layer="below")
GOOD, MISSED = "met the SLOs", "succeeded, missed an SLO"
CANCELLED = str(Outcome.CANCELLED)  # by the user: neither succeeded nor failed


@dataclass(frozen=True)
class RunClock:
    """The run's clock: its origin (the first scheduled request) and its last sign of life."""

    origin_ns: int
    end_ns: int

    def seconds(self, values: Iterable[int] | np.ndarray) -> np.ndarray:
        values = values if isinstance(values, np.ndarray) else list(values)
        return (np.asarray(values, dtype=np.int64) - self.origin_ns) / 1e9

    @property
    def span_s(self) -> float:
        return (self.end_ns - self.origin_ns) / 1e9

    def histogram(self, times_ns: np.ndarray, edges: np.ndarray, width: float,
                  chosen: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """The `weights` of the `chosen` times summed per bin of `bins()`, a block of the
        (flat, per-token) columns at a time so that no copy of them is made."""
        total = np.zeros(len(edges) - 1)
        for start in range(0, len(times_ns), BLOCK):
            block = slice(start, start + BLOCK)
            times, counts = times_ns[block], weights[block]
            if not chosen[block].all():  # else no copy: most blocks are all chosen
                times, counts = times[chosen[block]], counts[chosen[block]]
            which = (times - self.origin_ns) / 1e9 // width
            inside = (which >= 0) & (which < len(total))
            if not inside.all():
                which, counts = which[inside], counts[inside]
            total += np.bincount(which.astype(np.int64), minlength=len(total), weights=counts)
        return total

    def bins(self, n: int = BINS) -> tuple[np.ndarray, float]:
        """`n` bins' edges over the span (s), and their width."""
        width = max(self.span_s / n, MIN_BIN_S)
        return np.arange(0, self.span_s + width, width), width


def run_clock(a: RunAnalysis) -> RunClock | None:
    t = a.table
    timed = present(t.origin_ns) & present(t.end_ns)
    if not timed.any():
        return None
    return RunClock(int(t.origin_ns[timed].min()), int(t.end_ns[timed].max()))


def shade_outside_window(fig: go.Figure, a: RunAnalysis, clock: RunClock) -> None:
    """Shade warmup (before the measurement window) and cooldown (after it) over every
    subplot of `fig`."""
    if a.window is None:
        return
    start = (a.window.start_ns - clock.origin_ns) / 1e9
    end = (a.window.end_ns - clock.origin_ns) / 1e9
    for x0, x1, label in ((0.0, start, "warmup"), (end, clock.span_s, "cooldown")):
        if x1 > x0:
            fig.add_shape(type="rect", xref="x", yref="paper", x0=x0, x1=x1, y0=0, y1=1,
                          **SHADE)
            fig.add_annotation(x=(x0 + x1) / 2, y=1, xref="x", yref="paper", text=label,
                               showarrow=False, yanchor="bottom", font=dict(color="#666"))


def over_time_figure(a: RunAnalysis) -> go.Figure | None:
    t = a.table
    sent = present(t.sent_ns)
    clock = run_clock(a)
    if not sent.any() or clock is None:
        return None
    edges, width = clock.bins()
    centers = (edges[:-1] + edges[1:]) / 2

    events = np.repeat(sent, t.events)  # the token events of requests that were sent
    tokens_per_s = clock.histogram(t.token_ns, edges, width, events, t.token_counts) / width
    done = clock.seconds(t.done_ns[sent & t.ok & present(t.done_ns)])
    done_per_s = np.histogram(done, edges)[0] / width

    in_flight = in_flight_at(t.sent_ns[sent], t.end_ns[sent],
                             clock.origin_ns + (centers * 1e9).astype(np.int64))

    ttft_all = a.requests.metrics.ttft
    timed = sent & ~np.isnan(ttft_all)
    ttft = ttft_all[timed]
    which = np.digitize(clock.seconds(t.sent_ns[timed]), edges) - 1
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
        t = clock.seconds(s.t_ns for s in server)
        for series in ("running", "waiting"):
            fig.add_scatter(x=t, y=[s.values.get(series) for s in server], line_shape="hv",
                            name=f"server: {series}", row=4, col=1)
        fig.add_scatter(x=t, y=[s.values.get("kv_usage") for s in server], name="KV cache used",
                        line=dict(dash="dot"), row=4, col=1, secondary_y=True)
        fig.update_yaxes(title_text="requests", row=4, col=1, secondary_y=False)
        fig.update_yaxes(title_text="KV used", range=[0, 1], row=4, col=1, secondary_y=True)
    fig.update_xaxes(title_text="seconds since the first scheduled request", row=n, col=1)
    fig.update_yaxes(title_text="tokens/s", row=1, col=1, secondary_y=False)
    fig.update_yaxes(title_text="req/s", row=1, col=1, secondary_y=True)
    fig.update_yaxes(title_text="ms", row=3, col=1)
    fig.update_layout(**{**LAYOUT, "height": 640 + 200 * (n - 3), "title": "Over time",
                         "legend": dict(orientation="h", y=-0.1)})
    shade_outside_window(fig, a, clock)
    return fig


def outcomes_figure(a: RunAnalysis) -> go.Figure | None:
    """Requests per second by the bin they ended in: those that met the SLOs (goodput), those
    that succeeded but missed one, and each failure class."""
    clock = run_clock(a)
    if clock is None:
        return None
    slos = a.config.slos
    edges, width = clock.bins(OUTCOME_BINS)
    centers = (edges[:-1] + edges[1:]) / 2
    t = a.table
    ended = present(t.end_ns)
    met = meets_slos(a.requests.metrics, slos) if slos else np.ones(len(t), bool)
    fates: dict[str, np.ndarray] = {}
    for code in np.unique(t.outcome[ended]):
        mine = ended & (t.outcome == code)
        if code != 0:
            fates[OUTCOMES[code]] = t.end_ns[mine]
        elif not slos:
            fates["ok"] = t.end_ns[mine]
        else:
            fates |= {GOOD: t.end_ns[mine & met], MISSED: t.end_ns[mine & ~met]}
    fates = {fate: ends for fate, ends in fates.items() if len(ends)}
    order = [GOOD, MISSED, "ok"] + sorted(f for f in fates if f not in (GOOD, MISSED, "ok"))
    if slos:
        limits = ", ".join(f"{name} ≤ {ms(limit)}" for name, limit in slos.items())
        title = f"How requests ended: goodput ({limits}) and failures"
    else:
        title = "How requests ended: successes and failures (no SLO given: no goodput)"
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    ended = np.zeros(len(centers))
    failed = np.zeros(len(centers))
    for fate in order:
        if fate not in fates:
            continue
        counts = np.histogram(clock.seconds(fates[fate]), edges)[0]
        if fate != CANCELLED:
            ended += counts
        if fate not in (GOOD, MISSED, "ok", CANCELLED):
            failed += counts
        color = OUTCOME_COLORS["ok"] if fate in (GOOD, "ok") else (
            "#c9e6b0" if fate == MISSED else OUTCOME_COLORS.get(fate, "#d9534f"))
        fig.add_bar(x=centers, y=counts / width, width=width, name=fate, marker_color=color,
                    hovertemplate="%{x:.1f} s: %{y:.2f} req/s<extra>" + fate + "</extra>")
    if failed.any():
        share = np.where(ended > 0, 100 * failed / np.maximum(ended, 1), np.nan)
        fig.add_scatter(x=centers, y=share, name="failed (% of ended)", mode="lines+markers",
                        line=dict(color="#d9534f", dash="dot"), secondary_y=True,
                        hovertemplate="%{x:.1f} s: %{y:.0f}% failed<extra></extra>")
        fig.update_yaxes(title_text="failed (%)", range=[0, 100], tickmode="linear", tick0=0,
                         dtick=25, showgrid=False, secondary_y=True)
    fig.update_xaxes(title_text="seconds since the first scheduled request")
    fig.update_yaxes(title_text="req/s", secondary_y=False)
    fig.update_layout(**{**LAYOUT, "barmode": "stack", "bargap": 0, "height": 380,
                         "title": title})
    shade_outside_window(fig, a, clock)
    return fig
