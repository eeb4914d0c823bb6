"""What a simulation produced, column by column, and the request records it stands for.

Every request is one row of `Columns` (times in seconds from the run's start). Token times are
not stored per token: a request's tokens came at the ends of a run of consecutive steps of its
replica (`first_step`..`last_step`, more runs if it was preempted), and a replica's steps are
kept as segments (`replica.Segments`), so `SimResult.step_ends` rebuilds any step's end.
`timeline(i)` turns a row into the `RequestTimeline` a bench run would have recorded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from latlab.records.simulation import FleetOutcome
from latlab.records.timeline import Outcome, RequestTimeline, ServerTiming, SessionStep

OK, REJECTED, TOO_LONG, QUEUE_TIMEOUT = 0, 1, 2, 3
OUTCOMES = {OK: (Outcome.OK, 200, None),
            REJECTED: (Outcome.HTTP_429, 429, "simulated: the replica's waiting queue is full"),
            TOO_LONG: (Outcome.HTTP_4XX, 400, "simulated: the prompt does not fit the context"),
            QUEUE_TIMEOUT: (Outcome.HTTP_5XX, 503, "simulated: not scheduled within "
                            "--max-queue-delay")}
BASE_NS = 1_000_000_000  # the simulated clock's t0 (ns): every stamp is positive
_FLOAT = ("scheduled", "sent", "engine_in", "first_scheduled", "done")
_INT = ("replica", "prompt", "cached", "first_step", "last_step", "output", "preemptions",
        "outcome")
# a session's request: its session and turn, the previous turn's end and the tool step's
SESSION_FLOAT = ("after", "tool_start", "tool_end")
SESSION_INT = ("session", "turn", "turns")


class Columns:
    """Per-request arrays, grown as requests are sent (in index order); with `sessions`
    (their `kind`), each request's place in its session too."""

    def __init__(self, capacity: int, sessions: str | None = None) -> None:
        n = max(capacity, 1024)
        self.floats = _FLOAT + (SESSION_FLOAT if sessions else ())
        self.ints = _INT + (SESSION_INT if sessions else ())
        self.session_kind = sessions
        for name in self.floats:
            setattr(self, name, np.full(n, np.nan))
        for name in self.ints:
            setattr(self, name, np.full(n, -1, dtype=np.int64))
        self.runs: dict[int, list[tuple[int, int]]] = {}
        self.events: dict[int, list[tuple[int, int]]] = {}  # speculative: (step, tokens)
        self.size = 0

    def add(self, index: int, scheduled: float, sent: float, replica: int, prompt: int) -> None:
        if index >= len(self.sent):
            self._grow(2 * index + 1)
        self.scheduled[index] = scheduled
        self.sent[index] = sent
        self.replica[index] = replica
        self.prompt[index] = prompt
        self.size = max(self.size, index + 1)

    def _grow(self, n: int) -> None:
        for name in (*self.floats, *self.ints):
            old = getattr(self, name)
            new = np.full(n, np.nan if old.dtype.kind == "f" else -1, dtype=old.dtype)
            new[: len(old)] = old
            setattr(self, name, new)

    def trim(self, n: int) -> Columns:
        for name in (*self.floats, *self.ints):
            setattr(self, name, getattr(self, name)[:n])
        self.size = n
        return self


@dataclass
class SimResult:
    columns: Columns
    replicas: Sequence  # the SimReplica objects, for their step segments
    net: float  # one-way network delay (s)
    fleet: FleetOutcome
    _ends: dict[int, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return self.columns.size

    @property
    def steps(self) -> int:
        return sum(r.steps for r in self.replicas)

    @property
    def decode_run_steps(self) -> int:
        return sum(r.decode_steps for r in self.replicas)

    @property
    def preemptions(self) -> int:
        return sum(r.scheduler.num_preemptions for r in self.replicas)

    def step_ends(self, replica: int) -> np.ndarray:
        """The end (s) of every step replica `replica` ran, in order."""
        if replica not in self._ends:
            r = self.replicas[replica]
            segments = r.segments
            first = np.frombuffer(segments.first_step, dtype=np.int64)
            start, a, b = (np.frombuffer(x, dtype=float)
                           for x in (segments.start, segments.first_s, segments.growth_s))
            counts = np.diff(np.append(first, r.steps))
            seg = np.repeat(np.arange(len(first)), counts)
            m = np.arange(r.steps) - first[seg] + 1  # steps into its segment, from 1
            self._ends[replica] = start[seg] + a[seg] * m + b[seg] * m * (m - 1) / 2
        return self._ends[replica]

    def token_steps(self, i: int) -> list[tuple[int, int]]:
        c = self.columns
        return c.runs.get(i) or [(int(c.first_step[i]), int(c.last_step[i]))]

    def token_events(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """The steps whose ends brought request `i` tokens, and how many each brought."""
        events = self.columns.events.get(i)
        if events:
            steps, counts = zip(*events)
            return np.asarray(steps), np.asarray(counts, dtype=np.int32)
        steps = np.concatenate([np.arange(a, b + 1) for a, b in self.token_steps(i)])
        return steps, np.ones(len(steps), dtype=np.int32)

    def first_last_token(self) -> tuple[np.ndarray, np.ndarray]:
        """Every request's first and last token time at the client (s; NaN if none)."""
        c = self.columns
        first = np.full(len(self), np.nan)
        last = np.full(len(self), np.nan)
        for r in range(len(self.replicas)):
            rows = np.flatnonzero((c.replica == r) & (c.outcome == OK))
            if len(rows):
                ends = self.step_ends(r)
                first[rows] = ends[c.first_step[rows]] + self.net
                last[rows] = ends[c.last_step[rows]] + self.net
        return first, last

    def latencies_ms(self) -> dict[str, np.ndarray]:
        """Every request's TTFT, TPOT and E2E from its send, and TTFT and E2E from its
        schedule (ms; NaN where undefined: a failure, TPOT of a single token)."""
        c = self.columns
        first, last = self.first_last_token()
        tokens = np.where(c.output > 1, c.output - 1, np.nan)
        ok = c.outcome == OK
        done = np.where(ok, c.done, np.nan)
        return {"ttft": (first - c.sent) * 1e3, "tpot": (last - first) / tokens * 1e3,
                "e2e": (done - c.sent) * 1e3, "ttft_sched": (first - c.scheduled) * 1e3,
                "e2e_sched": (done - c.scheduled) * 1e3}

    def tokens_in(self, start: float, end: float) -> int:
        """Output tokens that reached the client in [start, end) (s)."""
        c, total = self.columns, 0
        for r in range(len(self.replicas)):
            rows = np.flatnonzero((c.replica == r) & (c.outcome == OK))
            if not len(rows):
                continue
            arrive = self.step_ends(r) + self.net
            lo, hi = np.searchsorted(arrive, start), np.searchsorted(arrive, end)
            plain = [i for i in rows if int(i) not in c.runs and int(i) not in c.events]
            f, la = c.first_step[plain], c.last_step[plain]
            total += int(np.maximum(0, np.minimum(la, hi - 1) - np.maximum(f, lo) + 1).sum())
            for i in rows:
                for a, b in c.runs.get(int(i), ()) if int(i) not in c.events else ():
                    total += max(0, min(b, hi - 1) - max(a, lo) + 1)
                total += sum(n for step, n in c.events.get(int(i), ()) if lo <= step < hi)
        return total

    def timeline(self, i: int, api: str = "completions", tokens: bool = True,
                 tenant: str | None = None, priority: int | None = None) -> RequestTimeline:
        """Request `i` as bench records it (without its per-token stamps unless `tokens`)."""
        c = self.columns
        ns = _ns
        outcome, status, error = OUTCOMES[int(c.outcome[i])]
        r = RequestTimeline(id=f"sim-{i}", index=i, api=api,
                            prompt_tokens_planned=int(c.prompt[i]), tenant=tenant,
                            priority=priority, scheduled_ns=ns(c.scheduled[i]),
                            sent_ns=ns(c.sent[i]), done_ns=ns(c.done[i]), outcome=outcome,
                            status=status, error=error, prompt_tokens=int(c.prompt[i]))
        r.session = self.session_step(i)
        if outcome != Outcome.OK:
            return r
        ends = self.step_ends(int(c.replica[i]))
        net = self.net
        steps, counts = self.token_events(i)
        first, last = ends[steps[0]] + net, ends[steps[-1]] + net
        received = c.sent[i] + net
        r.headers_ns = ns(c.engine_in[i] + net)
        r.first_token_ns, r.last_token_ns, r.usage_ns = ns(first), ns(last), ns(c.done[i])
        if tokens:
            stamps = ends[steps] + net
            r.token_ns = (BASE_NS + np.rint(stamps * 1e9)).astype(np.int64).tolist()
            r.token_counts = counts.tolist()
        r.completion_tokens = int(c.output[i])
        r.cached_tokens = int(c.cached[i])
        r.tokens_from_usage = True
        completed = float(c.done[i]) - net
        engine_in, scheduled = float(c.engine_in[i]), float(c.first_scheduled[i])
        first, last, received = float(first), float(last), float(received)
        r.server = ServerTiming(
            preprocess=(engine_in - received) * 1e3, queue=(scheduled - engine_in) * 1e3,
            prefill=(first - net - scheduled) * 1e3, decode=(last - first) * 1e3,
            postprocess=(completed - (last - net)) * 1e3, total=(completed - received) * 1e3,
            source="simulated")
        r.server_request_id = r.id
        return r

    def session_step(self, i: int) -> SessionStep | None:
        """Where request `i` sits in its session (None: not a session's)."""
        c = self.columns
        if c.session_kind is None or c.session[i] < 0:
            return None

        def stamp(name: str) -> int | None:
            value = float(getattr(c, name)[i])
            return None if np.isnan(value) else _ns(value)

        return SessionStep(id=f"sim-s{c.session[i]}", turn=int(c.turn[i]),
                           turns=int(c.turns[i]), kind=c.session_kind, after_ns=stamp("after"),
                           tool_start_ns=stamp("tool_start"), tool_end_ns=stamp("tool_end"))


def _ns(seconds: float) -> int:
    return BASE_NS + int(round(seconds * 1e9))
