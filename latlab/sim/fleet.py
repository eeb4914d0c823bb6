"""The simulated fleet: clients, a router, admission control, an autoscaler and replicas.

    result = simulate(workload, calibration, Fleet(replicas=2, router="round_robin"))

Open-loop clients send at their scheduled times; closed-loop users (and `max_concurrency`)
send when an earlier request is done, so those runs advance the replicas in time order, one
step boundary at a time. A request reaches its replica's queue after the network and its
preprocessing; one turned away by admission control (the replica's waiting queue at
`max_waiting`, as latlab serve counts it) is a 429; a prompt the context cannot hold a 400.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from latlab.records.calibration import Calibration
from latlab.records.simulation import Fleet
from latlab.sim.policies import Autoscaler, Router, fleet_outcome
from latlab.sim.replica import SimReplica
from latlab.sim.results import OK, QUEUE_TIMEOUT, REJECTED, TOO_LONG, Columns, SimResult
from latlab.sim.sequence import SimSequence, new_sequence, shared_prefix
from latlab.sim.sessions import SEND, TURN, SessionDriver, SessionPlans
from latlab.sim.stepcost import StepCostModel
from latlab.sim.techniques import Techniques
from latlab.sim.workload import SimWorkload
from latlab.sim.world import Draw

INF = math.inf
READY, TICK = 0, 1  # and SEND, TURN (`sessions.py`)
FREE = "free"  # a SEND event's data: a client slot freed (max_concurrency)


@dataclass
class ClientState:
    """The clients' side: the events due, the requests sent and in flight, and the requests
    waiting on the client for a slot (`max_concurrency`)."""

    events: list = field(default_factory=list)  # (t, order, kind, data), a heap
    order: itertools.count = field(default_factory=itertools.count)
    sent: int = 0
    in_flight: int = 0
    queue: deque = field(default_factory=deque)  # client-side waits: (scheduled, index)


class Simulation:
    def __init__(self, workload: SimWorkload, calibration: Calibration, fleet: Fleet,
                 draw: Draw | None = None) -> None:
        self.workload = workload
        self.draw = draw
        self._extra = np.zeros((0, 2))  # a draw's per-request preprocess, postprocess (s)
        self.calibration = calibration
        self.fleet = fleet
        self.shape = calibration.engine
        if fleet.max_waiting is not None:
            self.shape = self.shape.model_copy(update={"max_waiting": fleet.max_waiting})
        self.cost = StepCostModel(calibration.step)
        rc = calibration.request
        self.net = rc.network / 2e3
        self.pre, self.pre_token = rc.preprocess / 1e3, rc.preprocess_per_token / 1e3
        self.post, self.reject = rc.postprocess / 1e3, rc.reject / 1e3
        self.router = Router(fleet.router, workload.config.seed)
        self.autoscaler = Autoscaler(fleet.autoscale) if fleet.autoscale else None
        self.replicas: list[SimReplica] = []
        self.ready: list[SimReplica] = []
        self.booting = 0
        sessions = workload.config.sessions
        self.cols = Columns(workload.requests or 0, sessions.kind if sessions else None)
        self.state = ClientState()
        self._prefix = list(range(1, workload.prefix_tokens + 1))
        self.sessions = SessionDriver(
            SessionPlans(workload.config, workload.requests), workload, self.cols,
            self.shape.max_model_len, self._prefix,
            send=lambda t, index, history: self._send(t, t, index, history), push=self._push,
            sent=lambda: self.state.sent) if sessions else None
        arrivals = workload.arrivals
        self.cap = arrivals.max_concurrency if arrivals.open_loop else None
        if sessions and self.cap is not None:
            raise ValueError("--max-concurrency with sessions is not simulated")
        self.feedback = not arrivals.open_loop or self.cap is not None or bool(sessions)
        self.techniques = Techniques(
            max_queue_delay=fleet.max_queue_delay, idle_unload=fleet.idle_unload,
            reload_s=fleet.reload_s or 0.0, speculative_tokens=fleet.speculative_tokens or 0,
            draft_ms=fleet.draft_ms)
        self._accept = np.random.default_rng([workload.config.seed, 9])
        self.ready_timeline: list[tuple[float, int]] = []
        self.scale_ups = self.scale_downs = 0
        for _ in range(fleet.replicas):
            self._add_replica(0.0)

    # -- the loop ----------------------------------------------------------------------------

    def run(self) -> SimResult:
        workload, state = self.workload, self.state
        if workload.arrival is None:
            for start in workload.starts:
                self._push(start, SEND, None)
        if self.autoscaler:
            self._push(self.autoscaler.policy.interval_s, TICK, None)
        arrival = workload.arrival if workload.arrival is not None else np.empty(0)
        times = arrival.tolist()
        i, n = 0, len(times)
        while True:
            t_arr = times[i] if i < n else INF
            t_ev = state.events[0][0] if state.events else INF
            if t_ev < INF and t_arr == INF and self._only_ticks():
                t_ev = INF  # nothing left to send: the autoscaler's ticks stop
            t = min(t_arr, t_ev)
            if self.feedback:
                r = min(self.replicas, key=_boundary)
                if _boundary(r) <= t and _boundary(r) < INF:
                    r.advance(_boundary(r))
                    continue
            if t == INF:
                break
            for r in self.replicas:
                r.advance(t)
            if self.feedback and state.events and state.events[0][0] < t:
                continue
            if t_arr <= t_ev:
                i += 1
                self._arrive(t_arr, i - 1)
            else:
                t, _, kind, data = heapq.heappop(state.events)
                self._event(t, kind, data)
        for r in self.replicas:
            r.advance(INF)
        return self._result()

    def _only_ticks(self) -> bool:
        return (all(kind == TICK for _, _, kind, _ in self.state.events)
                and all(_boundary(r) == INF for r in self.replicas))

    def _push(self, t: float, kind: int, data: object) -> None:
        heapq.heappush(self.state.events, (t, next(self.state.order), kind, data))

    def _event(self, t: float, kind: int, data: object) -> None:
        if kind == SEND:
            if data is None:  # a closed-loop user is free
                self._user_send(t)
            else:
                self._free(t)
        elif kind == TURN:
            self.sessions.send_turn(t, data)
        elif kind == TICK:
            self._scale(t)
            self._push(t + self.autoscaler.policy.interval_s, TICK, None)
        else:
            self.ready.append(data)
            self.booting -= 1
            self.ready_timeline.append((t, len(self.ready)))

    def _arrive(self, t: float, index: int) -> None:
        """An open-loop request (or session) is due: sent now, or when a slot frees
        (max_concurrency)."""
        if self.sessions is not None:
            return self.sessions.start(t, index)
        if self.cap is not None and self.state.in_flight >= self.cap:
            self.state.queue.append((t, index))
            return
        self._send(t, t, index)

    def _user_send(self, t: float) -> None:
        workload, index = self.workload, self.state.sent
        if (workload.requests is not None and index >= workload.requests) or (
                workload.duration_s is not None and t >= workload.duration_s):
            return
        if self.sessions is not None:
            return self.sessions.start(t)
        workload.ensure(index + 1)
        self._send(t, t, index)

    def _send(self, t: float, scheduled: float, index: int,
              prefix: list[int] | None = None) -> SimSequence | None:
        """Request `index` (its lengths: the workload's) sent at `t`; a session's begins with
        the token ids of its history (`prefix`)."""
        state, c, lengths = self.state, self.cols, self.workload.lengths
        state.sent += 1
        state.in_flight += 1
        prompt, output = int(lengths.prompt[index]), int(lengths.output[index])
        shared, key = shared_prefix(lengths, index, prompt, self._prefix)
        replica = self.router.route(self.ready, key) if self.ready else None
        c.add(index, scheduled, t, -1 if replica is None else replica.name, prompt)
        if replica is None or replica.num_waiting >= self.shape.max_waiting:
            return self._done(index, t + self.reject, REJECTED)
        arrive = t + self.net + self.pre + self.pre_token * prompt
        if self.draw is not None:
            arrive = max(t, arrive + self._extras(index)[0])
        c.engine_in[index] = arrive
        if prompt >= self.shape.max_model_len:
            return self._done(index, arrive + self.net, TOO_LONG)
        output = min(output, self.shape.max_model_len - prompt)
        seq = new_sequence(index, prompt, output, prefix or shared,
                           priority=lengths.priority[index] or 0, tenant=lengths.tenant[index])
        if self.techniques.speculative:
            seq.acceptance = min(1.0, self.fleet.acceptance.draw(self._accept))
            seq.events = []
        replica.cut(arrive)
        replica.submit(seq, arrive)
        return seq

    def _finished(self, seq: SimSequence, now: float) -> None:
        c, i = self.cols, seq.index
        c.first_scheduled[i] = seq.first_scheduled
        c.first_step[i] = seq.first_step
        c.last_step[i] = seq.last_step
        c.output[i] = seq.num_tokens - seq.num_prompt_tokens
        c.cached[i] = seq.num_cached_tokens
        c.preemptions[i] = seq.num_preemptions
        if seq.runs:
            c.runs[i] = seq.runs + [(seq.run_start, seq.last_step)]
        if seq.events:
            c.events[i] = seq.events
        post = self.post if self.draw is None else max(0.0, self.post + self._extras(i)[1])
        self._done(i, now + post + self.net, OK)

    def _extras(self, index: int) -> np.ndarray:
        """The draw's extra preprocess (with the network's spread) and postprocess of a
        request (s)."""
        if index >= len(self._extra):
            self._extra = self.draw.overheads(max(4096, 2 * len(self._extra), index + 1))
        return self._extra[index]

    def _refused(self, seq: SimSequence, now: float) -> None:
        """The queue deadline refused it (503)."""
        self._done(seq.index, now + self.net, QUEUE_TIMEOUT)

    def _done(self, index: int, done: float, outcome: int) -> None:
        self.cols.done[index] = done
        self.cols.outcome[index] = outcome
        if self.sessions is not None:
            self.sessions.turn_done(index, done, outcome == OK)
        elif self.feedback:  # the client learns it at `done`: a user, or a slot, is free
            self._push(done, SEND, None if self.cap is None else FREE)

    def _free(self, t: float) -> None:
        state = self.state
        state.in_flight -= 1
        if state.queue:
            scheduled, index = state.queue.popleft()
            self._send(t, scheduled, index)

    # -- the fleet ---------------------------------------------------------------------------

    def _add_replica(self, ready_at: float) -> SimReplica:
        r = SimReplica(self.shape, self.cost, self._finished, name=len(self.replicas),
                       techniques=self.techniques, on_refused=self._refused,
                       seed=self.workload.config.seed * 1000 + len(self.replicas))
        r.speed = self.draw
        r.started = ready_at
        r.stopped = None
        self.replicas.append(r)
        if ready_at <= 0:
            self.ready.append(r)
            self.ready_timeline.append((0.0, len(self.ready)))
        else:
            self.booting += 1
            self._push(ready_at, READY, r)
        return r

    def _scale(self, t: float) -> None:
        p = self.autoscaler.policy
        want = self.autoscaler.desired(t, self.ready, self.booting)
        for _ in range(want - len(self.ready) - self.booting):
            r = self._add_replica(t + p.lag_s + p.cold_start_s)
            r.started = t + p.lag_s
            self.scale_ups += 1
        while len(self.ready) > max(want, 1):
            r = self.ready.pop()
            r.stopped = t
            self.scale_downs += 1
            self.ready_timeline.append((t, len(self.ready)))

    def _result(self) -> SimResult:
        sent = self.state.sent
        end = max([float(np.nanmax(self.cols.done[:sent]))] if sent else [0.0])
        outcome = fleet_outcome(self.replicas, self.ready_timeline, len(self.ready), end,
                                self.scale_ups, self.scale_downs)
        return SimResult(self.cols.trim(sent), self.replicas, self.net, outcome)


def _boundary(r: SimReplica) -> float:
    if r.step_end is not None:
        return r.step_end
    return r.inbox[0][0] if r.inbox else INF


def simulate(workload: SimWorkload, calibration: Calibration, fleet: Fleet | None = None,
             draw: Draw | None = None) -> SimResult:
    """Run `workload` against `fleet` (one replica by default) charged by `calibration`; with
    a `draw`, in that world (its step costs' level and drift, its per-request costs)."""
    return Simulation(workload, calibration, fleet or Fleet(), draw).run()
