"""An agent task's latency budget: the user waits for the whole task, first call scheduled →
last answer, and it splits into the model calls (each with its own network, queue, prefill
and decode), the tool steps between them and the orchestration around the tools (the
agent's own time: building the next prompt, dispatching).

    task  = Σ calls (E2E from schedule) + Σ gaps (previous call's end → next call's schedule)
    gap   = tool (its step's start → end) + orchestration (the rest of the gap)

Over the complete tasks (every call ok) of the measurement window: the mean task, and each
step's mean over the tasks that have that step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from latlab.analysis.budget import Budget, Row, budget
from latlab.metrics.sessions import complete, gap_ms, tool_ms


@dataclass(slots=True)
class StepBudget:
    """Step `step` of the tasks: its model call's budget and the tool step before it."""

    step: int
    n: int
    model: Budget
    tool: float
    orchestration: float


@dataclass(slots=True)
class TaskBudget:
    """The mean task: its total, model calls (by bucket), tools and orchestration (ms)."""

    n: int
    total: float
    model: dict[str, float]
    tool: float
    orchestration: float
    steps: list[StepBudget]

    @property
    def model_total(self) -> float:
        return sum(self.model.values())


def task_budget(rows: Sequence[Row]) -> TaskBudget | None:
    """The agent tasks among `rows`; None without a complete one."""
    tasks: dict[str, list[Row]] = {}
    for row in rows:
        step = row.record.session
        if step is not None and step.kind == "agent":
            tasks.setdefault(step.id, []).append(row)
    done = [sorted(t, key=lambda r: r.record.session.turn) for t in tasks.values()]
    done = [t for t in done if complete([r.record for r in t]) and all(r.parts for r in t)]
    if not done:
        return None
    n = len(done)
    whole = [budget([r.parts for r in t]) for t in done]  # per task: the mean call
    buckets = {b: sum(w.bucket(b) * len(t) for w, t in zip(whole, done)) / n
               for b in whole[0].buckets()}
    tools = sum(tool_ms(r.record) for t in done for r in t) / n
    gaps = sum(gap_ms(r.record) for t in done for r in t) / n
    total = sum(r.parts.total for t in done for r in t) / n + gaps
    steps = []
    for k in range(1, max(len(t) for t in done) + 1):
        at = [t[k - 1] for t in done if len(t) >= k]
        steps.append(StepBudget(
            step=k, n=len(at), model=budget([r.parts for r in at]),
            tool=sum(tool_ms(r.record) for r in at) / len(at),
            orchestration=sum(gap_ms(r.record) - tool_ms(r.record) for r in at) / len(at)))
    return TaskBudget(n=n, total=total, model=buckets, tool=tools,
                      orchestration=gaps - tools, steps=steps)
