"""A simulated replica: the engine's own `Scheduler` and `BlockManager` decide every step; a
step-cost model (`StepCostModel`) stands in for the model runner.

Event-driven per engine step, not per token: a step starts when the last one ends (or when a
request reaches an idle engine), takes the requests handed over since (as the engine thread
drains its queue before every step), asks the scheduler what to run, and ends after the
modelled time. Where what the scheduler would do is known — every running sequence decoding
and nobody to admit (a *decode run*: the steps until the next event in closed form), or the
queue's head admitted alone beside the decodes (an *admission*) — the replica takes the
steps without it (`lazy_steps.py`), and brings their sequences up to date lazily (their
tokens and blocks) before the scheduler next looks at them. Where that could differ from
the scheduler's steps (priorities, fair share, a decode cap, a prefix-cache hit, a second
request joining) the replica asks the scheduler.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from array import array
from collections import deque
from typing import Callable

from latlab.engine.batching import decode_groups, step_features
from latlab.engine.block_manager import BlockManager
from latlab.engine.scheduler import Scheduler
from latlab.engine.sequence import FinishReason
from latlab.records.engine import EngineShape
from latlab.sim.lazy_steps import Admission, LazySteps
from latlab.sim.sequence import SimSequence, admits_alone, may_admit, runs_exact
from latlab.sim.stepcost import StepCostModel
from latlab.sim.techniques import Techniques, TechniqueSteps

INF = math.inf
RELOAD = "reload"  # the step in progress is the model loading again (idle unload)
Finished = Callable[[SimSequence, float], None]


class SimReplica(LazySteps, TechniqueSteps):
    """One engine. `advance(t)` runs it up to time `t` (seconds); `submit` hands it a request.
    `on_finish(seq, t)` hears of every request done; `on_refused(seq, t)` of every one the
    queue deadline refused."""

    def __init__(self, shape: EngineShape, cost: StepCostModel, on_finish: Finished,
                 name: int = 0, techniques: Techniques = Techniques(),
                 on_refused: Finished | None = None, seed: int = 0) -> None:
        self.shape = shape
        self.cost = cost
        self.name = name
        self.on_finish = on_finish
        self.on_refused = on_refused
        self.techniques = techniques
        self.rng = random.Random(seed)  # the drafts each verified decode accepts
        self.reloads = 0  # times the model loaded again after an idle unload
        self.block_manager = BlockManager(shape.num_kv_blocks, shape.block_size,
                                          shape.enable_prefix_caching)
        self.scheduler = Scheduler(shape.engine_config(), self.block_manager)
        # whether decode runs may be taken: not when speculation decides each step's tokens
        self.runs = runs_exact(self.scheduler) and not techniques.speculative
        self.inbox: deque[tuple[float, SimSequence]] = deque()
        self.step_end: float | None = None  # None: idle
        self.last_end = 0.0  # when the last step ended
        self._pending = None  # the step in progress: a SchedulerOutput, or k decode steps
        self.steps = 0  # steps started
        self.decode_steps = 0  # steps taken in decode runs
        self.outstanding = 0  # submitted, not finished
        # Decode-run state: valid while `stable` (every running sequence decoding).
        self.stable = False
        self.context = 0  # Σ computed tokens of the running sequences
        self.groups = 0  # decode groups at a decode run's first step (kept through it)
        self.owed = 0  # at most this many blocks the decode runs took, not yet allocated
        self._finishes: list[tuple[int, int, SimSequence]] = []
        self._tie = itertools.count()
        # Every step (or decode run) as a segment: its first step, start, a, b (seconds).
        self.seg_first = array("q")
        self.seg_start = array("d")
        self.seg_a = array("d")
        self.seg_b = array("d")
        self.trace: list | None = None  # when a list: every step's [(request id, tokens)]
        self.speed: Callable[[float], float] | None = None  # a drawn world's cost factor at t

    # -- requests in -----------------------------------------------------------------------

    @property
    def num_waiting(self) -> int:
        """What latlab serve counts against --max-waiting: queued and not yet taken in."""
        return len(self.scheduler.waiting) + len(self.inbox)

    def submit(self, seq: SimSequence, at: float) -> None:
        """The request reaches the engine's queue at `at` (after preprocessing)."""
        seq.arrived = at
        self.inbox.append((at, seq))
        self.outstanding += 1

    # -- time ------------------------------------------------------------------------------

    def advance(self, until: float) -> None:
        """Run every step that ends by `until`. A decode run in progress may reach past it:
        `cut` ends it at the first step end after a request submitted later arrives."""
        while True:
            if self.step_end is not None:
                if self.step_end > until:
                    return
                now = self.step_end
                self._complete(now)
            else:
                if not self.inbox or self.inbox[0][0] > until:
                    return
                now = self.inbox[0][0]
                if self._asleep(now):  # the model loads again before the first step
                    self.reloads += 1
                    self.step_end, self._pending = now + self.techniques.reload_s, RELOAD
                    continue
            while self.inbox and self.inbox[0][0] <= now:
                self.scheduler.add(self.inbox.popleft()[1])
            self._start(now, self.inbox[0][0] if self.inbox else INF)

    def _start(self, now: float, horizon: float) -> None:
        sched = self.scheduler
        self._expire(now)
        if not sched.running and not sched.waiting:
            self.step_end = None
            self.stable = False
            return
        if self.runs and self.stable and sched.running:
            if not may_admit(sched):
                if self._decode_run(now, min(horizon, self._deadline())):
                    return
            elif n := admits_alone(sched, self.owed):
                return self._admit(now, n)
        self._sync_running()
        self.stable = False
        speculative = self.techniques.speculative
        if speculative:
            self._propose()
        out = sched.schedule()
        if not out.scheduled:
            raise RuntimeError("the scheduler scheduled nothing with requests waiting: the "
                               "engine shape cannot serve them")
        f = self._spec_features(out.scheduled) if speculative else step_features(out.scheduled)
        for seq, n in out.scheduled:
            if seq.first_scheduled < 0:
                seq.first_scheduled = now
                seq.num_cached_tokens = seq.num_computed_tokens  # what its prompt found cached
        dt = self.cost.seconds(*f)
        if speculative and any(s.spec_token_ids for s in sched.running):
            dt += self.techniques.draft_ms / 1e3
        if self.speed is not None:
            dt *= self.speed(now)
        if self.trace is not None:
            self.trace.append([(seq.request_id, n) for seq, n in out.scheduled])
        self._segment(now, dt, 0.0)
        self._pending = out
        self.steps += 1
        self.step_end = now + dt

    def _segment(self, start: float, a: float, b: float) -> None:
        self.seg_first.append(self.steps)
        self.seg_start.append(start)
        self.seg_a.append(a)
        self.seg_b.append(b)

    # -- step completion ---------------------------------------------------------------------

    def _complete(self, now: float) -> None:
        self.last_end = now
        pending, self._pending = self._pending, None
        if pending is RELOAD:
            return
        if isinstance(pending, int):
            self._complete_run(now, pending)
        elif isinstance(pending, Admission):
            self._complete_admission(now, pending)
        else:
            self._complete_step(pending, now)

    def _complete_step(self, out, now: float) -> None:
        step = self.steps - 1
        for seq, n in out.scheduled:
            drafts = len(seq.spec_token_ids)
            if drafts:
                emitted = self._emitted(seq, drafts)
                self.scheduler.advance(seq, n, [0] * emitted)
            else:
                self.scheduler.advance(seq, n, [])
                if seq.num_computed_tokens != len(seq.token_ids):
                    continue
                emitted = 1
            emitted = min(emitted, seq.target - (len(seq.token_ids) - seq.num_prompt_tokens))
            seq.token_ids.extend(itertools.repeat(0, emitted))
            if seq.events is not None:
                seq.events.append((step, emitted))
            if seq.first_step < 0:
                seq.first_step = seq.run_start = step
            elif seq.last_step != step - 1:
                if seq.runs is None:
                    seq.runs = []
                seq.runs.append((seq.run_start, seq.last_step))
                seq.run_start = step
            seq.last_step = step
            if len(seq.token_ids) - seq.num_prompt_tokens >= seq.target:
                self._finish(seq, now)
        for seq in out.preempted:
            seq.finish_step = -1
        if self.runs:
            self._restabilize()

    def _restabilize(self) -> None:
        """After a step the scheduler ran: is every running sequence decoding? If so, the
        decode-run state (context, decode groups, when each finishes) from scratch."""
        running = self.scheduler.running
        size = self.shape.block_size
        context, widths = 0, []
        for seq in running:
            c = seq.num_computed_tokens
            if c + 1 != len(seq.token_ids) or seq.first_step < 0:  # (a last prompt token)
                self.stable = False
                return
            context += c
            widths.append(-(-(c + 1) // size))
        self.stable, self.context = True, context
        last, done = self.steps - 1, self.decode_steps
        for seq in running:
            seq.sync, seq.sync_step = done, last + 1
            fs = last + seq.target - (len(seq.token_ids) - seq.num_prompt_tokens)
            if fs != seq.finish_step:
                seq.finish_step = fs
                heapq.heappush(self._finishes, (fs, next(self._tie), seq))
        widths.sort(reverse=True)
        self.groups = len(decode_groups(widths))  # at the next step; kept through the run

    def _sync(self, seq: SimSequence) -> None:
        """Bring a sequence up to date with the decode steps it took since it was last seen."""
        k = self.decode_steps - seq.sync
        if k:
            self.block_manager.allocate(seq, k)
            seq.num_computed_tokens += k
            seq.token_ids.extend(itertools.repeat(0, k))
            if seq.last_step != seq.sync_step - 1:  # it missed a step: a new run of tokens
                if seq.runs is None:
                    seq.runs = []
                seq.runs.append((seq.run_start, seq.last_step))
                seq.run_start = seq.sync_step
            seq.last_step = self.steps - 1
            seq.sync, seq.sync_step = self.decode_steps, self.steps

    def _sync_running(self) -> None:
        if self.stable:
            done = self.decode_steps
            for seq in self.scheduler.running:
                if seq.sync != done:
                    self._sync(seq)
        self.owed = 0

    def _finish(self, seq: SimSequence, now: float) -> None:
        seq.finish_step = -1
        self.scheduler.finish(seq, FinishReason.LENGTH)
        self.outstanding -= 1
        self.on_finish(seq, now)
        seq.token_ids = []
