"""The per-request Gantt chart: every request (a sample of a large run) as a bar on the run's
clock from its scheduled time to its end, coloured by outcome, with a tick at each token event
of the slowest."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import plotly.graph_objects as go

from latlab.records.columns import present
from latlab.report.figures import LAYOUT, longest
from latlab.report.palette import OUTCOME_COLORS
from latlab.report.timeseries import run_clock, shade_outside_window
from latlab.units import ms, number

if TYPE_CHECKING:
    from latlab.analysis.run_analysis import RunAnalysis
    from latlab.records.table import RequestTable
    from latlab.records.timeline import RequestTimeline

MAX_REQUESTS = 400
TICKED = 10  # the slowest requests that get their token ticks
MAX_TICKS = 4000
NOT_STREAMED = np.iinfo(np.int64).min + 1  # below any request's time (negated: the most)
TICK_COLOR = "rgba(0,0,0,.55)"


def gantt_figure(a: RunAnalysis) -> go.Figure | None:
    clock = run_clock(a)
    t = a.table
    timed = np.flatnonzero(present(t.origin_ns) & present(t.end_ns))
    if clock is None or not len(timed):
        return None
    slowest = _slowest(t, timed)
    chosen, sampled = sample(timed, slowest, ~t.ok[timed])
    rows = np.array(sorted({*chosen.tolist(), *slowest.tolist()}), np.int64)
    taken = a.requests.table_of(rows)  # the few rows, not a read of every column of the run
    record = dict(zip(rows.tolist(), (taken.record(k) for k in range(len(rows)))))
    ticked = [record[i] for i in slowest.tolist()]
    others = set(chosen.tolist()) - set(slowest.tolist())
    shown = ticked + [record[i] for i in sorted(others)]
    shown.sort(key=lambda r: (r.origin_ns, r.index))
    position = {id(r): i + 1 for i, r in enumerate(shown)}

    fig = go.Figure(layout={**LAYOUT, "title": _title(len(shown), len(timed), sampled,
                                                      len(ticked)),
                            "height": max(320, min(1000, 3 * len(shown) + 200)),
                            "barmode": "overlay", "bargap": 0.15})
    for outcome in sorted({str(r.outcome) for r in shown}, key=lambda o: (o != "ok", o)):
        mine = [r for r in shown if str(r.outcome) == outcome]
        fig.add_bar(orientation="h", name=outcome, y=[position[id(r)] for r in mine],
                    base=clock.seconds(r.origin_ns for r in mine),
                    x=[(r.end_ns - r.origin_ns) / 1e9 for r in mine],
                    marker_color=OUTCOME_COLORS.get(outcome, "#d9534f"),
                    text=[_about(r) for r in mine], textposition="none",
                    hovertemplate="%{text}<extra></extra>")
    times, rows = _ticks(ticked, position)
    if times:
        every = max(1, -(-sum(len(r.token_ns) for r in ticked) // MAX_TICKS))
        name = f"token events of the {len(ticked)} slowest" + (
            f" (one in {number(every)})" if every > 1 else "")
        fig.add_scatter(x=clock.seconds(times[::every]), y=rows[::every], mode="markers",
                        name=name, marker=dict(symbol="line-ns-open", size=7, color=TICK_COLOR,
                                               line=dict(width=1, color=TICK_COLOR)),
                        hovertemplate="token event at %{x:.3f} s<extra></extra>")
    fig.update_xaxes(title_text="seconds since the first scheduled request")
    fig.update_yaxes(title_text="requests in order of schedule", autorange="reversed",
                     showticklabels=len(shown) <= 60)
    shade_outside_window(fig, a, clock)
    return fig


def sample(timed: np.ndarray, ticked: np.ndarray, failed: np.ndarray) -> tuple[np.ndarray, bool]:
    """Of the requests `timed` (indices; `failed` marks theirs that failed), all when they
    are few; else the `ticked` ones, the failures (up to a quarter of the places) and an even
    sample of the rest. True when it sampled."""
    if len(timed) <= MAX_REQUESTS:
        return timed, False
    kept = list(dict.fromkeys([*ticked.tolist(), *timed[failed][: MAX_REQUESTS // 4].tolist()]))
    others = np.ones(len(timed), bool)
    others[np.searchsorted(timed, kept)] = False  # `timed` is in order: no sort of it
    rest = timed[others]
    places = MAX_REQUESTS - len(kept)
    step = len(rest) / places
    return np.array(kept + rest[(np.arange(places) * step).astype(int)].tolist()), True


def _slowest(t: RequestTable, timed: np.ndarray) -> np.ndarray:
    """The `TICKED` streamed requests of `timed` (indices, in order) that took longest, the
    earlier first of equally long ones."""
    def took(rows: np.ndarray) -> np.ndarray:
        return np.where(t.events[rows] > 0, t.end_ns[rows] - t.origin_ns[rows], NOT_STREAMED)

    slowest = longest(timed, took, TICKED)
    return slowest[t.events[slowest] > 0]


def _span(r: RequestTimeline) -> int:
    return r.end_ns - r.origin_ns


def _ticks(ticked: list[RequestTimeline], position: dict[int, int]) -> tuple[list[int], list[int]]:
    times = [t for r in ticked for t in r.token_ns]
    rows = [position[id(r)] for r in ticked for _ in r.token_ns]
    return times, rows


def _title(shown: int, total: int, sampled: bool, ticked: int) -> str:
    if sampled:
        which = (f"{number(shown)} of {number(total)} requests: the {number(ticked)} slowest, "
                 "the failures and an even sample of the rest")
    else:
        which = f"all {number(total)} requests"
    return f"Every request on the run's clock ({which})"


def _about(r: RequestTimeline) -> str:
    """A bar's hover text."""
    parts = [f"#{r.index} {r.outcome}", f"from schedule to end {ms(_span(r) / 1e6)}"]
    if r.sent_ns is not None:
        parts.append(f"sent after {ms((r.sent_ns - r.origin_ns) / 1e6)}")
    if r.first_token_ns is not None:
        parts.append(f"first token after {ms((r.first_token_ns - r.origin_ns) / 1e6)}")
    if r.output_tokens is not None:
        parts.append(f"{number(r.output_tokens)} output tokens")
    return " · ".join(parts)
