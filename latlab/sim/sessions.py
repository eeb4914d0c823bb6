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

from dataclasses import dataclass, field

import numpy as np

from latlab.records.workload import WorkloadConfig
from latlab.sim.workload import _labels

SEND, TURN = 2, 3  # the simulation's events (`fleet.py`): a user is free; a session's turn


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
    """The sessions' side of the simulated clients: a part of `fleet.Simulation`, kept apart
    for size (it calls its `_send`, `_push` and columns)."""

    def _start_session(self, t: float, index: int | None = None) -> None:
        """Session `index` (a closed-loop user's next: the next one) starts at `t`; a
        closed-loop user whose session cannot start is done."""
        if index is None:
            index = self.s.sessions
            self.s.sessions += 1
        session = self.plans.open(index)
        if session is None:
            return
        if session.shared:
            session.history = list(self._prefix)
        self._send_turn(t, session)

    def _send_turn(self, t: float, session: Session) -> None:
        """The session's next turn, scheduled at `t`: the history plus a new message."""
        w, c = self.w, self.cols
        turn = session.turn
        prompt = len(session.history) + int(session.messages[turn])
        if (w.duration_s is not None and t >= w.duration_s) or prompt >= self.shape.max_model_len:
            return self._session_over(t, session)
        index = self.s.sent
        lengths = w.ensure(index + 1)
        lengths.prompt[index], lengths.output[index] = prompt, session.outputs[turn]
        lengths.shared[index] = False
        lengths.tenant[index], lengths.priority[index] = session.tenant, session.priority
        session.turn += 1
        self.session_of[index] = session
        seq = self._send(t, t, index, session.history)
        c.session[index], c.turn[index], c.turns[index] = session.index, turn + 1, session.turns
        c.after[index] = session.after
        if self.plans.kind == "agent" and turn:
            c.tool_start[index], c.tool_end[index] = session.after, t
        session.history = list(seq.token_ids) if seq is not None else session.history

    def _turn_done(self, index: int, done: float, ok: bool) -> None:
        """A session's request ended at `done`: its next turn after the gap, or its end."""
        session = self.session_of.pop(index)
        if not ok or session.turn >= session.turns:
            return self._session_over(done, session)
        session.history.extend([0] * int(self.cols.output[index]))
        session.after = done
        self._push(done + float(session.gaps[session.turn - 1]), TURN, session)

    def _session_over(self, t: float, session: Session) -> None:
        session.history = []
        if not self.w.arrivals.open_loop:
            self._push(t, SEND, None)  # the user starts its next session
