"""The steps a simulated replica takes without asking the scheduler, where what it would
schedule is known: *decode runs* (every running sequence decoding, nobody to admit: the
steps until the next event, charged in closed form) and *admissions* (every running
sequence decoding and the queue's head admitted with its whole prompt, nothing else: one
step). Their sequences are brought up to date lazily (tokens, blocks) before the scheduler
next looks at them; `tests/test_sim_schedule.py` checks the steps equal the engine's.

`LazySteps` is a part of `SimReplica` (`replica.py`), kept apart for size: it reads and
writes the replica's decode-run state (`context`, `groups`, `owed`, `decode_steps`, the
finish heap) and its segments.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from latlab.engine.batching import decode_groups
from latlab.engine.sequence import SequenceStatus
from latlab.sim.sequence import SimSequence, block_limit, steps_to


@dataclass(frozen=True, slots=True)
class Admission:
    """A step in progress that decodes every running sequence and prefills `head`'s `n`
    prompt tokens."""

    head: SimSequence
    n: int


class LazySteps:
    def cut(self, at: float) -> None:
        """End the decode run in progress at the first of its steps that ends at or after
        `at` (a request arriving then is taken in at that step's end, not the run's)."""
        k = self._pending
        if not isinstance(k, int) or self.step_end <= at:
            return
        start, a, b = self.seg_start[-1], self.seg_a[-1], self.seg_b[-1]
        j = steps_to(a, b, at - start) if at > start else 1
        if j >= k:
            return
        batch = len(self.scheduler.running)
        self._pending = j
        self.steps -= k - j
        self.decode_steps -= k - j
        self.context -= (k - j) * batch
        end = start + a * j + b * j * (j - 1) / 2
        self.step_end = end

    def _decode_run(self, now: float, horizon: float) -> int:
        """Start up to the next event's worth of decode-only steps; 0 if none can be taken."""
        batch = len(self.scheduler.running)
        first = self.steps
        heap = self._finishes
        while heap and heap[0][2].finish_step != heap[0][0]:
            heapq.heappop(heap)
        k = heap[0][0] - first + 1 if heap else 1
        size = self.shape.block_size
        if self.block_manager.num_free_blocks - self.owed < batch * (k // size + 1):
            k = min(k, self._block_limit(k))
            if k < 1:
                return 0
        a, b = self.cost.decode_run(batch, self.context + batch, min(self.groups, batch))
        if self.speed is not None:
            f = self.speed(now)
            a, b = a * f, b * f
        span = horizon - now
        if span <= a:
            k = 1
        elif k > 1 and span < a * k + b * k * (k - 1) / 2:
            k = max(1, min(k, steps_to(a, b, span)))
        self._segment(now, a, b)
        self.owed += batch * (k // size + 1)
        self._pending = k
        self.steps += k
        self.decode_steps += k
        self.context += k * batch
        dt = a * k + b * k * (k - 1) / 2
        self.step_end = now + dt
        return k

    def _block_limit(self, k: int) -> int:
        """The most decode steps (≤ k) every running sequence can take without preemption."""
        self._sync_running()
        return block_limit(self.scheduler.running, self.shape.block_size,
                           self.block_manager.num_free_blocks, k)

    def _admit(self, now: float, n: int) -> None:
        """Start the step `admits_alone` foresaw: the head admitted as the scheduler admits
        it, the decodes as one step of a decode run."""
        sched = self.scheduler
        head = sched.waiting.peek()
        batch = len(sched.running)
        groups = self._groups()
        if self.trace is not None:
            self.trace.append([(s.request_id, 1) for s in sched.running] + [(head.request_id, n)])
        sched.waiting.remove(head)
        head.status = SequenceStatus.RUNNING
        sched.running.append(head)
        self.block_manager.allocate(head, n)
        head.first_scheduled = now
        head.num_cached_tokens = head.num_computed_tokens
        dt = self.cost.seconds(batch + n, batch, 1, batch + 1, groups, self.context + batch,
                               n * (head.num_computed_tokens + n))
        if self.speed is not None:
            dt *= self.speed(now)
        self._segment(now, dt, 0.0)
        self._pending = Admission(head, n)
        self.steps += 1
        self.decode_steps += 1
        self.context += batch
        self.owed += batch
        self.step_end = now + dt

    def _complete_admission(self, now: float, step: Admission) -> None:
        self._finish_due(now)
        head = step.head
        self.scheduler.advance(head, step.n, [])
        head.token_ids.append(0)
        head.first_step = head.run_start = head.last_step = self.steps - 1
        if head.target <= 1:
            self._finish(head, now)
        else:
            head.sync, head.sync_step = self.decode_steps, self.steps
            head.finish_step = self.steps - 2 + head.target
            heapq.heappush(self._finishes, (head.finish_step, next(self._tie), head))
            self.context += head.num_computed_tokens
        self.groups = self._groups()

    def _complete_run(self, now: float, k: int) -> None:
        if self.trace is not None:
            self.trace.extend([[(s.request_id, 1) for s in self.scheduler.running]] * k)
        self._finish_due(now)

    def _finish_due(self, now: float) -> None:
        """Finish the decoding sequences whose last token was in the steps taken so far."""
        last = self.steps - 1
        heap = self._finishes
        while heap and heap[0][0] <= last:
            fs, _, seq = heapq.heappop(heap)
            if seq.finish_step != fs:
                continue
            self._sync(seq)
            self.context -= seq.num_computed_tokens
            self._finish(seq, now)

    def _groups(self) -> int:
        """The decode groups the running sequences make at the next step (their block
        tables then, counting the decode-run steps they have not been brought up to)."""
        size, done = self.shape.block_size, self.decode_steps
        widths = sorted((-(-(s.num_computed_tokens + done - s.sync + 1) // size)
                         for s in self.scheduler.running), reverse=True)
        return len(decode_groups(widths))
