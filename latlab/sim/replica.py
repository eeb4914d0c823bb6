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

import itertools
import math
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from latlab.engine.batching import step_features
from latlab.engine.block_manager import BlockManager
from latlab.engine.scheduler import Scheduler, SchedulerOutput
from latlab.engine.sequence import FinishReason
from latlab.records.engine import EngineShape
from latlab.sim.lazy_steps import Admission, DecodeRun, LazySteps, Speed
from latlab.sim.sequence import SimSequence, admits_alone, may_admit, runs_exact
from latlab.sim.stepcost import StepCostModel
from latlab.sim.techniques import Techniques, TechniqueSteps

INF = math.inf
NO_TECHNIQUES = Techniques()
Finished = Callable[[SimSequence, float], None]


@dataclass(frozen=True, slots=True)
class Reload:
    """A step in progress that is the model loading again (after an idle unload)."""


@dataclass(frozen=True, slots=True)
class ScheduledStep:
    """A step in progress that runs what the scheduler scheduled."""

    out: SchedulerOutput


InProgress = Reload | DecodeRun | Admission | ScheduledStep


class Segments:
    """Every step (or decode run) as a segment: the first step it holds, its start, and its
    steps' cost (step j from 0 of it takes `first_s + growth_s·j` seconds)."""

    def __init__(self) -> None:
        self.first_step = array("q")
        self.start = array("d")
        self.first_s = array("d")
        self.growth_s = array("d")

    def add(self, first_step: int, start: float, first_s: float, growth_s: float) -> None:
        self.first_step.append(first_step)
        self.start.append(start)
        self.first_s.append(first_s)
        self.growth_s.append(growth_s)


class SimReplica:
    """One engine. `advance(t)` runs it up to time `t` (seconds); `submit` hands it a request.
    `on_finish(seq, t)` hears of every request done; `on_refused(seq, t)` of every one the
    queue deadline refused."""

    def __init__(self, shape: EngineShape, cost: StepCostModel, on_finish: Finished,
                 name: int = 0, techniques: Techniques = NO_TECHNIQUES,
                 on_refused: Finished | None = None, seed: int = 0) -> None:
        self.shape = shape
        self.cost = cost
        self.name = name
        self.on_finish = on_finish
        self.on_refused = on_refused
        self.reloads = 0  # times the model loaded again after an idle unload
        self.block_manager = BlockManager(shape.num_kv_blocks, shape.block_size,
                                          shape.enable_prefix_caching)
        self.scheduler = Scheduler(shape.engine_config(), self.block_manager)
        self.techniques = techniques
        self.technique_steps = TechniqueSteps(techniques, self.scheduler, shape.max_model_len,
                                              seed)
        self.lazy = LazySteps(self.scheduler, self.block_manager, shape.block_size, cost,
                              self._finish)
        # whether decode runs may be taken: not when speculation decides each step's tokens
        self.runs = runs_exact(self.scheduler) and not techniques.speculative
        self.inbox: deque[tuple[float, SimSequence]] = deque()
        self.step_end: float | None = None  # None: idle
        self.last_end = 0.0  # when the last step ended
        self.in_progress: InProgress | None = None
        self.steps = 0  # steps started
        self.outstanding = 0  # submitted, not finished
        self.segments = Segments()
        self.trace: list | None = None  # when a list: every step's [(request id, tokens)]
        self.speed: Speed | None = None  # a drawn world's step costs
        self.started = 0.0  # when the fleet started paying for it (`fleet.py`)
        self.stopped: float | None = None  # when the fleet scaled it down

    @property
    def decode_steps(self) -> int:
        """Steps taken in decode runs (and admissions)."""
        return self.lazy.decode_steps

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
                if self.technique_steps.asleep(now, self.last_end):  # the model loads again first
                    self.reloads += 1
                    self.step_end = now + self.techniques.reload_s
                    self.in_progress = Reload()
                    continue
            while self.inbox and self.inbox[0][0] <= now:
                self.scheduler.add(self.inbox.popleft()[1])
            self._start(now, self.inbox[0][0] if self.inbox else INF)

    def cut(self, at: float) -> None:
        """End the decode run in progress at the first of its steps that ends at or after
        `at` (a request arriving then is taken in at that step's end, not the run's)."""
        run = self.in_progress
        if not isinstance(run, DecodeRun) or self.step_end <= at:
            return
        start = self.segments.start[-1]
        shorter = self.lazy.cut(run, start, at)
        if shorter is run:
            return
        self.in_progress = shorter
        self.steps -= run.steps - shorter.steps
        self.step_end = start + shorter.seconds

    def _start(self, now: float, horizon: float) -> None:
        sched, lazy = self.scheduler, self.lazy
        for seq in self.technique_steps.expired(now):
            self.scheduler.finish(seq, FinishReason.QUEUE_TIMEOUT)
            self.outstanding -= 1
            self.on_refused(seq, now)
            seq.token_ids = []
        if not sched.running and not sched.waiting:
            self.step_end = None
            lazy.drop()
            return
        if self.runs and lazy.stable and sched.running:
            if not may_admit(sched):
                if self._decode_run(now, min(horizon, self.technique_steps.deadline())):
                    return
            elif n := admits_alone(sched, lazy.owed):
                return self._admit(now, n)
        lazy.hand_over(self.steps)
        speculative = self.techniques.speculative
        if speculative:
            self.technique_steps.propose()
        out = sched.schedule()
        if not out.scheduled:
            raise RuntimeError("the scheduler scheduled nothing with requests waiting: the "
                               "engine shape cannot serve them")
        f = (TechniqueSteps.features(out.scheduled) if speculative
             else step_features(out.scheduled))
        for seq, _ in out.scheduled:
            if seq.first_scheduled < 0:
                seq.first_scheduled = now
                seq.num_cached_tokens = seq.num_computed_tokens  # what its prompt found cached
        dt = self.cost.seconds(*f)
        if speculative and any(s.spec_token_ids for s in sched.running):
            dt += self.techniques.draft_ms / 1e3
        if self.speed is not None:
            dt *= self.speed.step_speed(now)
        if self.trace is not None:
            self.trace.append([(seq.request_id, n) for seq, n in out.scheduled])
        self.segments.add(self.steps, now, dt, 0.0)
        self.in_progress = ScheduledStep(out)
        self.steps += 1
        self.step_end = now + dt

    def _decode_run(self, now: float, horizon: float) -> int:
        """Start up to the next event's worth of decode-only steps; 0 if none can be taken."""
        if self.speed is not None:  # one factor a run: it ends where the factor changes
            horizon = min(horizon, self.speed.steady_until(now))
        run = self.lazy.decode_run(now, horizon, self.steps, self.speed)
        if run is None:
            return 0
        self.segments.add(self.steps, now, run.first_s, run.growth_s)
        self.in_progress = run
        self.steps += run.steps
        self.step_end = now + run.seconds
        return run.steps

    def _admit(self, now: float, n: int) -> None:
        """Start the step that admits the queue's head (`n` prompt tokens) beside the
        decodes."""
        sched = self.scheduler
        if self.trace is not None:
            head = sched.waiting.peek()
            self.trace.append([(s.request_id, 1) for s in sched.running] + [(head.request_id, n)])
        step = self.lazy.admit(now, n, self.speed)
        self.segments.add(self.steps, now, step.seconds, 0.0)
        self.in_progress = step
        self.steps += 1
        self.step_end = now + step.seconds

    # -- step completion ---------------------------------------------------------------------

    def _complete(self, now: float) -> None:
        self.last_end = now
        step, self.in_progress = self.in_progress, None
        match step:
            case Reload():
                return
            case DecodeRun(steps=k):
                if self.trace is not None:
                    self.trace.extend([[(s.request_id, 1) for s in self.scheduler.running]] * k)
                self.lazy.finish_due(now, self.steps)
            case Admission():
                self.lazy.complete_admission(now, step, self.steps)
            case ScheduledStep(out=out):
                self._complete_step(out, now)

    def _complete_step(self, out: SchedulerOutput, now: float) -> None:
        step = self.steps - 1
        for seq, n in out.scheduled:
            drafts = len(seq.spec_token_ids)
            if drafts:
                emitted = self.technique_steps.emitted(seq, drafts)
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
            self.lazy.restabilize(self.steps)

    def _finish(self, seq: SimSequence, now: float) -> None:
        seq.finish_step = -1
        self.scheduler.finish(seq, FinishReason.LENGTH)
        self.outstanding -= 1
        self.on_finish(seq, now)
        seq.token_ids = []
