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

import numpy as np

from latlab.analysis.budget import Budget, budget
from latlab.analysis.requests import Requests
from latlab.metrics.sessions import gap_ms, sessions_of, tool_ms


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


def task_budget(requests: Requests, chosen: np.ndarray) -> TaskBudget | None:
    """The agent tasks among the requests `chosen` (a mask); None without a complete one."""
    t, parts = requests.table, requests.parts
    agents = chosen & t.step_kind.mask("agent")
    if not agents.any():
        return None
    tasks = sessions_of(t, agents)
    done = tasks.complete & (np.minimum.reduceat(parts.decomposed[tasks.order],
                                                 tasks.starts[:-1]).astype(bool))
    if not done.any():
        return None
    n = int(done.sum())
    calls = [tasks.order[a:b] for a, b, ok in zip(tasks.starts[:-1], tasks.starts[1:], done)
             if ok]  # each complete task's calls in step order
    whole = [budget(parts, c) for c in calls]  # per task: the mean call
    buckets = {b: sum(w.bucket(b) * len(c) for w, c in zip(whole, calls)) / n
               for b in whole[0].buckets()}
    members = tasks.members(done)
    tool, gap = tool_ms(t), gap_ms(t)
    tools = float(tool[members].sum()) / n
    gaps = float(gap[members].sum()) / n
    total = float(parts.total[members].sum()) / n + gaps
    steps = []
    for k in range(max(len(c) for c in calls)):
        at = np.array([c[k] for c in calls if len(c) > k])
        steps.append(StepBudget(step=k + 1, n=len(at), model=budget(parts, at),
                                tool=float(tool[at].mean()),
                                orchestration=float((gap[at] - tool[at]).mean())))
    return TaskBudget(n=n, total=total, model=buckets, tool=tools,
                      orchestration=gaps - tools, steps=steps)
