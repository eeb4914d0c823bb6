"""Simulated sessions (`--turns`, `--agent-steps`), as the load generator runs them
(`latlab.load.workers.sessions`): an open-loop arrival starts a session, a closed-loop user
runs one after another; turn t's prompt is the whole history — the shared system prompt
when the session drew it, every earlier message and every answer as generated — plus a new
message, so prompts grow turn by turn (and a prefix cache finds the history); a chat's next
turn is scheduled a think time after the last answer ended, an agent's next call when its
tool step has (`--tool-latency`). A session ends after its last turn, at a failed request,
when its history no longer fits the context, or when the run's time is up. `--requests N`
bounds whole sessions: one starts only if all its turns fit in what is left.

Lengths are drawn per session (its turns, messages, outputs, gaps) from the workload's own
distributions and seed — the same distributions as bench, not bench's very draws.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from latlab.records.workload import WorkloadConfig
from latlab.sim.results import Columns
from latlab.sim.sequence import SimSequence
from latlab.sim.workload import SimWorkload, _labels

SEND, TURN = 2, 3  # the simulation's events (`fleet.py`): a user is free; a session's turn
Send = Callable[[float, int, list[int]], "SimSequence | None"]
Push = Callable[[float, int, object], None]


@dataclass
class Session:
    """One session: its plan, and how far it got."""

    index: int
    turns: int
    messages: np.ndarray  # new message tokens, turn by turn
    outputs: np.ndarray  # output tokens asked, turn by turn
    gaps: np.ndarray  # seconds between a turn's end and the next one's schedule
    shared: bool
    tenant: str | None
    priority: int | None
    turn: int = 0  # turns sent so far
    history: list[int] = field(default_factory=list)  # the context's token ids so far
    after: float = float("nan")  # when the previous turn ended (s)


class SessionPlans:
    """The sessions of a simulated run: each one's plan, and the request budget."""

    def __init__(self, config: WorkloadConfig, requests: int | None) -> None:
        self.config = config
        self.kind = config.sessions.kind
        self.left = requests  # requests not yet reserved by a session

    def open(self, index: int) -> Session | None:
        """Session `index`, or None when its turns do not fit the requests left."""
        c, s = self.config, self.config.sessions
        rng = np.random.default_rng([c.seed, 5, index])
        turns = s.turns.sample(rng) if s.turns is not None else 1
        if self.left is not None:
            if turns > self.left:
                return None
            self.left -= turns
        later = s.message_tokens or c.prompt_tokens
        messages = np.concatenate([c.prompt_tokens.sample_many(rng, 1),
                                   later.sample_many(rng, turns - 1)])
        if self.kind == "agent":
            gaps = np.array([s.tool_ms.draw(rng) / 1e3 if s.tool_ms else 0.0
                             for _ in range(turns)])
        else:
            gaps = np.array([s.think_s.draw(rng) if s.think_s else 0.0 for _ in range(turns)])
        shared = bool(c.prefix_tokens) and rng.random() < c.prefix_fraction
        (tenant,), (priority,) = _labels(rng, c.tenants, 1), _labels(rng, c.priorities, 1)
        return Session(index, turns, messages, c.output_tokens.sample_many(rng, turns), gaps,
                       shared, tenant, priority)


class SessionDriver:
    """The sessions' side of the simulated clients: each session's next turn, which session a
    request in flight belongs to, and when a closed-loop user starts its next session. It
    sends through `send(t, index, history)` (request `index` at `t`, its prompt beginning
    with the history's token ids; the sequence sent, or None when it was turned away) and
    schedules the simulation's events through `push(t, kind, data)`; `sent()` is how many
    requests the simulation has sent, the next one's index."""

    def __init__(self, plans: SessionPlans, workload: SimWorkload, columns: Columns,
                 max_model_len: int, prefix: list[int], send: Send, push: Push,
                 sent: Callable[[], int]) -> None:
        self.plans = plans
        self.workload = workload
        self.columns = columns
        self.max_model_len = max_model_len
        self.prefix = prefix  # the shared system prompt's token ids
        self.send, self.push, self.sent = send, push, sent
        self.started = 0  # sessions started by closed-loop users
        self.session_of: dict[int, Session] = {}  # a session's request in flight → it

    def start(self, t: float, index: int | None = None) -> None:
        """Session `index` (a closed-loop user's next: the next one) starts at `t`; a
        closed-loop user whose session cannot start is done."""
        if index is None:
            index = self.started
            self.started += 1
        session = self.plans.open(index)
        if session is None:
            return
        if session.shared:
            session.history = list(self.prefix)
        self.send_turn(t, session)

    def send_turn(self, t: float, session: Session) -> None:
        """The session's next turn, scheduled at `t`: the history plus a new message."""
        workload, columns = self.workload, self.columns
        turn = session.turn
        prompt = len(session.history) + int(session.messages[turn])
        if ((workload.duration_s is not None and t >= workload.duration_s)
                or prompt >= self.max_model_len):
            return self._over(t, session)
        index = self.sent()
        lengths = workload.ensure(index + 1)
        lengths.prompt[index], lengths.output[index] = prompt, session.outputs[turn]
        lengths.shared[index] = False
        lengths.tenant[index], lengths.priority[index] = session.tenant, session.priority
        session.turn += 1
        self.session_of[index] = session
        seq = self.send(t, index, session.history)
        columns.session[index], columns.turn[index] = session.index, turn + 1
        columns.turns[index], columns.after[index] = session.turns, session.after
        if self.plans.kind == "agent" and turn:
            columns.tool_start[index], columns.tool_end[index] = session.after, t
        session.history = list(seq.token_ids) if seq is not None else session.history

    def turn_done(self, index: int, done: float, ok: bool) -> None:
        """A session's request ended at `done`: its next turn after the gap, or its end."""
        session = self.session_of.pop(index)
        if not ok or session.turn >= session.turns:
            return self._over(done, session)
        session.history.extend([0] * int(self.columns.output[index]))
        session.after = done
        self.push(done + float(session.gaps[session.turn - 1]), TURN, session)

    def _over(self, t: float, session: Session) -> None:
        session.history = []
        if not self.workload.arrivals.open_loop:
            self.push(t, SEND, None)  # the user starts its next session
