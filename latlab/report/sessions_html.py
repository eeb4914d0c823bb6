"""The HTML report's sessions: TTFT turn by turn, and an agent task's budget per step."""

from __future__ import annotations

from typing import TYPE_CHECKING

import plotly.graph_objects as go

from latlab.report.figures import LAYOUT
from latlab.report.palette import BUCKET_COLORS

if TYPE_CHECKING:
    from latlab.analysis.run_analysis import RunAnalysis

TOOL_COLOR, ORCHESTRATION_COLOR = "#7f7f7f", "#d9534f"


def turns_figure(a: RunAnalysis) -> go.Figure | None:
    """TTFT p50 and p90 at every turn, with the mean prompt tokens on a second axis."""
    s = a.summary.sessions
    if s is None or not s.per_turn:
        return None
    turns = [t.turn for t in s.per_turn]
    word = "turn" if s.kind == "chat" else "step"
    fig = go.Figure(layout={**LAYOUT, "title": f"TTFT {word} by {word} (ms)",
                            "xaxis": {"title": word, "dtick": 1}, "yaxis_title": "TTFT (ms)",
                            "yaxis2": {"title": "prompt tokens", "overlaying": "y",
                                       "side": "right", "showgrid": False}})
    for q, dash in (("p50", "solid"), ("p90", "dot")):
        fig.add_scatter(x=turns, y=[t.ttft[q] for t in s.per_turn], name=f"TTFT {q}",
                        mode="lines+markers", line={"dash": dash, "color": "#c355c9"})
    fig.add_bar(x=turns, y=[t.prompt_tokens for t in s.per_turn], name="prompt tokens",
                yaxis="y2", opacity=0.25, marker_color="#4c9be8")
    return fig


def steps_figure(a: RunAnalysis) -> go.Figure | None:
    """Each step of the mean agent task: the tool and orchestration before it, its model call
    by bucket."""
    tasks = a.tasks
    if tasks is None:
        return None
    labels = [f"step {st.step} (n={st.n})" for st in tasks.steps]
    fig = go.Figure(layout={**LAYOUT, "title": f"An agent task, step by step (ms; "
                                               f"{tasks.n} complete tasks)", "barmode": "stack"})
    fig.add_bar(x=labels, y=[st.tool for st in tasks.steps], name="tool step before",
                marker_color=TOOL_COLOR)
    fig.add_bar(x=labels, y=[st.orchestration for st in tasks.steps], name="orchestration",
                marker_color=ORCHESTRATION_COLOR)
    for bucket in tasks.model:
        fig.add_bar(x=labels, y=[st.model.bucket(bucket) for st in tasks.steps],
                    name=f"model: {bucket}", marker_color=BUCKET_COLORS[bucket])
    return fig
