"""The steps a simulated replica takes without asking the scheduler, where what it would
schedule is known: *decode runs* (every running sequence decoding, nobody to admit: the
steps until the next event, charged in closed form) and *admissions* (every running
sequence decoding and the queue's head admitted with its whole prompt, nothing else: one
step). Their sequences are brought up to date lazily (tokens, blocks) before the scheduler
next looks at them; `tests/test_sim_schedule.py` checks the steps equal the engine's.

`LazySteps` owns the decode-run state (whether it holds, the running context, the decode
groups, the blocks owed, the decode steps taken, the finish heap); its replica (`replica.py`)
owns the step counter and passes it in, and hears of every sequence done (`finish`).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from latlab.engine.batching import decode_groups
from latlab.engine.block_manager import BlockManager
from latlab.engine.scheduler import Scheduler
from latlab.engine.sequence import SequenceStatus
from latlab.sim.sequence import SimSequence, block_limit, steps_to
from latlab.sim.stepcost import StepCostModel


class Speed(Protocol):
    """A drawn world's step costs (`world.Draw`): the factor on a step starting at `t`, with
    that step's own jitter (`step_speed`: a step the scheduler decides, or an admission),
    and until when the factor holds (a decode run is charged one factor: it ends there)."""

    def speed(self, t: float) -> float: ...

    def step_speed(self, t: float) -> float: ...

    def steady_until(self, t: float) -> float: ...


@dataclass(frozen=True, slots=True)
class DecodeRun:
    """A step in progress that is `steps` decode-only steps; step j (from 0) takes
    `first_s + growth_s·j` seconds."""

    steps: int
    first_s: float
    growth_s: float

    @property
    def seconds(self) -> float:
        k = self.steps
        return self.first_s * k + self.growth_s * k * (k - 1) / 2


@dataclass(frozen=True, slots=True)
class Admission:
    """A step in progress that decodes every running sequence and prefills `head`'s `n`
    prompt tokens; it takes `seconds`."""

    head: SimSequence
    n: int
    seconds: float


class LazySteps:
    """Decode runs and admissions of one replica, and the state they need between steps."""

    def __init__(self, scheduler: Scheduler, block_manager: BlockManager, block_size: int,
                 cost: StepCostModel, finish: Callable[[SimSequence, float], None]) -> None:
        self.scheduler = scheduler
        self.block_manager = block_manager
        self.block_size = block_size
        self.cost = cost
        self.finish = finish
        self.stable = False  # every running sequence decoding: the state below holds
        self.context = 0  # Σ computed tokens of the running sequences
        self.groups = 0  # decode groups at a decode run's first step (kept through it)
        self.owed = 0  # at most this many blocks the decode runs took, not yet allocated
        self.decode_steps = 0  # steps taken in decode runs (and admissions)
        self._finishes: list[tuple[int, int, SimSequence]] = []  # (finish step, tie, seq)
        self._tie = itertools.count()

    # -- starting ------------------------------------------------------------------------------

    def decode_run(self, now: float, horizon: float, first: int,
                   speed: Speed | None) -> DecodeRun | None:
        """Up to the next event's worth of decode-only steps from step `first`, ending by
        `horizon` where it can; None if none can be taken."""
        batch = len(self.scheduler.running)
        heap = self._finishes
        while heap and heap[0][2].finish_step != heap[0][0]:
            heapq.heappop(heap)
        k = heap[0][0] - first + 1 if heap else 1
        size = self.block_size
        if self.block_manager.num_free_blocks - self.owed < batch * (k // size + 1):
            self.sync_running(first)
            k = min(k, block_limit(self.scheduler.running, size,
                                   self.block_manager.num_free_blocks, k))
            if k < 1:
                return None
        a, b = self.cost.decode_run(batch, self.context + batch, min(self.groups, batch))
        if speed is not None:
            f = speed.speed(now)
            a, b = a * f, b * f
        span = horizon - now
        if span <= a:
            k = 1
        elif k > 1 and span < a * k + b * k * (k - 1) / 2:
            k = max(1, min(k, steps_to(a, b, span)))
        self.owed += batch * (k // size + 1)
        self.decode_steps += k
        self.context += k * batch
        return DecodeRun(k, a, b)

    def cut(self, run: DecodeRun, start: float, at: float) -> DecodeRun:
        """`run` (started at `start`) ended at the first of its steps that ends at or after
        `at`: the run itself when that is its last."""
        j = steps_to(run.first_s, run.growth_s, at - start) if at > start else 1
        if j >= run.steps:
            return run
        dropped = run.steps - j
        self.decode_steps -= dropped
        self.context -= dropped * len(self.scheduler.running)
        return DecodeRun(j, run.first_s, run.growth_s)

    def admit(self, now: float, n: int, speed: Speed | None) -> Admission:
        """The step `admits_alone` foresaw: the head admitted as the scheduler admits it, the
        decodes as one step of a decode run."""
        sched = self.scheduler
        head = sched.waiting.peek()
        batch = len(sched.running)
        groups = self.next_groups()
        sched.waiting.remove(head)
        head.status = SequenceStatus.RUNNING
        sched.running.append(head)
        self.block_manager.allocate(head, n)
        head.first_scheduled = now
        head.num_cached_tokens = head.num_computed_tokens
        dt = self.cost.seconds(batch + n, batch, 1, batch + 1, groups, self.context + batch,
                               n * (head.num_computed_tokens + n))
        if speed is not None:
            dt *= speed.step_speed(now)
        self.decode_steps += 1
        self.context += batch
        self.owed += batch
        return Admission(head, n, dt)

    # -- ending --------------------------------------------------------------------------------

    def complete_admission(self, now: float, step: Admission, steps: int) -> None:
        """`step` ended at `now`, the replica having started `steps` steps."""
        self.finish_due(now, steps)
        head = step.head
        self.scheduler.advance(head, step.n, [])
        head.token_ids.append(0)
        head.first_step = head.run_start = head.last_step = steps - 1
        if head.target <= 1:
            self.finish(head, now)
        else:
            head.sync, head.sync_step = self.decode_steps, steps
            head.finish_step = steps - 2 + head.target
            heapq.heappush(self._finishes, (head.finish_step, next(self._tie), head))
            self.context += head.num_computed_tokens
        self.groups = self.next_groups()

    def finish_due(self, now: float, steps: int) -> None:
        """Finish the decoding sequences whose last token was in the `steps` taken so far."""
        last = steps - 1
        heap = self._finishes
        while heap and heap[0][0] <= last:
            fs, _, seq = heapq.heappop(heap)
            if seq.finish_step != fs:
                continue
            self.sync(seq, steps)
            self.context -= seq.num_computed_tokens
            self.finish(seq, now)

    def restabilize(self, steps: int) -> None:
        """After a step the scheduler ran (the replica's `steps`th): is every running
        sequence decoding? If so, the decode-run state (context, decode groups, when each
        finishes) from scratch."""
        running = self.scheduler.running
        size = self.block_size
        context, widths = 0, []
        for seq in running:
            c = seq.num_computed_tokens
            if c + 1 != len(seq.token_ids) or seq.first_step < 0:  # (a last prompt token)
                self.stable = False
                return
            context += c
            widths.append(-(-(c + 1) // size))
        self.stable, self.context = True, context
        last, done = steps - 1, self.decode_steps
        for seq in running:
            seq.sync, seq.sync_step = done, last + 1
            fs = last + seq.target - (len(seq.token_ids) - seq.num_prompt_tokens)
            if fs != seq.finish_step:
                seq.finish_step = fs
                heapq.heappush(self._finishes, (fs, next(self._tie), seq))
        widths.sort(reverse=True)
        self.groups = len(decode_groups(widths))  # at the next step; kept through the run

    # -- bringing sequences up to date ---------------------------------------------------------

    def sync(self, seq: SimSequence, steps: int) -> None:
        """Bring a sequence up to date with the decode steps it took since it was last seen
        (the replica having started `steps` steps)."""
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
            seq.last_step = steps - 1
            seq.sync, seq.sync_step = self.decode_steps, steps

    def hand_over(self, steps: int) -> None:
        """The scheduler decides the next step: every running sequence brought up to date, and
        the decode-run state dropped until `restabilize` finds it again."""
        self.sync_running(steps)
        self.stable = False

    def drop(self) -> None:
        """Nothing runs: no decode-run state holds."""
        self.stable = False

    def sync_running(self, steps: int) -> None:
        """Every running sequence up to date, before the scheduler looks at them."""
        if self.stable:
            done = self.decode_steps
            for seq in self.scheduler.running:
                if seq.sync != done:
                    self.sync(seq, steps)
        self.owed = 0

    def next_groups(self) -> int:
        """The decode groups the running sequences make at the next step (their block
        tables then, counting the decode-run steps they have not been brought up to)."""
        size, done = self.block_size, self.decode_steps
        widths = sorted((-(-(s.num_computed_tokens + done - s.sync + 1) // size)
                         for s in self.scheduler.running), reverse=True)
        return len(decode_groups(widths))
