"""Iteration-level scheduling (vLLM v1 style): one token budget per step.

Each step serves, within the step's token budget:

1. the running sequences' decodes (one token each, plus their speculative tokens), which
   keep flowing whatever else happens; `max_decode_tokens` caps them (a decode batch cap:
   shorter steps for interactive traffic; the decodes left out go first next step);
2. prefill work, in the order of the request queue (`request_queue.py`: first come first
   served, or by priority, with or without tenant fair share): running sequences' next
   prompt chunks and waiting sequences admitted while the running-sequence limit and the KV
   pool allow; `max_prefill_tokens` caps the prefill tokens of a step. Long prompts are cut
   into chunks to fit, so decodes keep flowing.

A waiting sequence first takes the cached blocks that begin its prompt (prefix caching,
`block_manager.py`); only the rest is prefilled. When the KV pool runs dry a running
sequence is preempted (the newest; under `priority` the least urgent): its blocks are freed
and it goes back to the queue, to be recomputed. Under `priority` a waiting request more
urgent than a running one that finds no room preempts it. A request waiting longer than
`max_queue_delay` without ever being scheduled is refused.

`static` batching admits a batch only when nothing is running and nobody joins until the
whole batch has finished: the baseline continuous batching is measured against.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from heapq import merge

from latlab.engine.block_manager import BlockManager
from latlab.engine.request_queue import RequestQueue
from latlab.engine.sequence import FinishReason, Sequence, SequenceStatus
from latlab.records.engine import EngineConfig


@dataclass
class SchedulerOutput:
    scheduled: list[tuple[Sequence, int]] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    refused: list[Sequence] = field(default_factory=list)  # waited past max_queue_delay

    @property
    def num_batched_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)


@dataclass
class _Budget:
    total: int
    prefill: int
    decode: int

    def take(self, n: int, decode: bool) -> None:
        self.total -= n
        if decode:
            self.decode -= n
        else:
            self.prefill -= n


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager) -> None:
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.max_prefill_tokens = config.max_prefill_tokens or config.max_num_batched_tokens
        self.max_decode_tokens = config.max_decode_tokens or config.max_num_batched_tokens
        self.chunked_prefill = config.enable_chunked_prefill
        self.static = config.batching == "static"
        self.by_priority = config.scheduling_policy == "priority"
        delay = config.max_queue_delay
        self.max_queue_delay_ns = None if delay is None else int(delay * 1e9)
        self.block_manager = block_manager
        self.waiting = RequestQueue(config.scheduling_policy, config.fair_share)
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.num_draft_tokens = 0     # speculative tokens verified
        self.num_accepted_tokens = 0  # of which accepted
        self._decode_offset = 0       # where the next step's decodes begin when capped

    def add(self, seq: Sequence) -> None:
        self.waiting.add(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        if self.max_queue_delay_ns is not None:
            out.refused = self.waiting.pop_expired(time.perf_counter_ns()
                                                   - self.max_queue_delay_ns)
            for seq in out.refused:
                self._end(seq, FinishReason.QUEUE_TIMEOUT)
        if self.static and not self.running:
            self._admit_batch()
        if self.by_priority and not self.static:
            self._preempt_for_priority(out)
        budget = _Budget(self.max_num_batched_tokens, self.max_prefill_tokens,
                         self.max_decode_tokens)
        scheduled: set[int] = set()
        preempted_for_priority = len(out.preempted)
        self._schedule_decodes(out, budget, scheduled)
        kv_dry = len(out.preempted) > preempted_for_priority
        key = self.waiting.key
        prefilling = sorted((s for s in self.running if not s.is_decoding), key=key)
        waiting = [] if self.static or kv_dry else self.waiting.ordered()
        admitting, left = True, len(prefilling)  # left: running candidates not yet seen
        # fair share's keys change as this step charges tenants: ordered once, at its start
        ordered = (sorted(prefilling + waiting, key=key) if self.waiting.fair_share
                   else merge(prefilling, waiting, key=key))
        for seq in ordered:
            limit = min(budget.total, budget.prefill)
            if limit <= 0 or not (admitting or left):
                break
            if seq.status is SequenceStatus.RUNNING:
                left -= 1
                self.block_manager.take_cached_prefix(seq)  # static: admitted blockless
                n = self._chunk(seq, limit)
                if n and self._make_room(seq, n, out, scheduled):
                    self._schedule(seq, n, out, budget, scheduled)
            elif admitting and seq.status is SequenceStatus.WAITING:
                admitting = self._admit(seq, limit, out, budget, scheduled)
        self.waiting.end_step()
        return out

    def advance(self, seq: Sequence, n: int, new_tokens: list[int]) -> None:
        """After a step: `n` tokens of `seq` were computed, giving `new_tokens` (not yet
        appended). Rejected speculative tokens are rolled back: they do not count as
        computed and the blocks that only they used are given back."""
        before = seq.num_computed_tokens
        drafts = len(seq.spec_token_ids)
        rejected = drafts - (len(new_tokens) - 1) if drafts and new_tokens else drafts
        seq.num_computed_tokens += n - rejected
        if drafts:
            seq.num_draft_tokens += drafts
            seq.num_accepted_tokens += drafts - rejected
            self.num_draft_tokens += drafts
            self.num_accepted_tokens += drafts - rejected
            seq.spec_token_ids = []
            self.block_manager.trim(seq, seq.num_tokens + len(new_tokens))
        self.block_manager.cache_full_blocks(seq, before)

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        self._end(seq, reason)

    def _end(self, seq: Sequence, reason: FinishReason) -> None:
        self.block_manager.free(seq)
        self.waiting.forget(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason

    def _schedule_decodes(self, out: SchedulerOutput, budget: _Budget,
                          scheduled: set[int]) -> None:
        decodes = [s for s in self.running if s.is_decoding]
        start = self._decode_offset % len(decodes) if decodes else 0
        count = 0
        running, bm = SequenceStatus.RUNNING, self.block_manager
        for seq in decodes[start:] + decodes[:start] if start else decodes:
            if seq.status is not running:
                continue  # preempted to make room for an older one
            n = seq.num_uncomputed_tokens + len(seq.spec_token_ids)
            if n > min(budget.total, budget.decode):
                seq.spec_token_ids = []  # no room for the drafts: a plain decode
                n = seq.num_uncomputed_tokens
                if n > min(budget.total, budget.decode):
                    self._decode_offset = start + count  # the rest go first next step
                    return
            if bm.can_allocate(seq, n) or self._make_room(seq, n, out, scheduled):
                self._schedule(seq, n, out, budget, scheduled, decode=True)
                count += 1

    def _admit(self, seq: Sequence, limit: int, out: SchedulerOutput, budget: _Budget,
               scheduled: set[int]) -> bool:
        """Start a waiting sequence if it fits; False if it (and so the queue) must wait."""
        if len(self.running) >= self.max_num_seqs:
            return False
        self.block_manager.take_cached_prefix(seq)
        n = self._chunk(seq, limit)
        if n == 0 or not self.block_manager.can_allocate(seq, n):
            self.block_manager.free(seq)  # hand the cached blocks back
            seq.num_computed_tokens = 0
            return False
        self.waiting.remove(seq)
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)
        self._schedule(seq, n, out, budget, scheduled)
        return True

    def _chunk(self, seq: Sequence, budget: int) -> int:
        """Prompt tokens of `seq` to compute this step: 0 when its unchunked prefill does not
        fit."""
        n = min(seq.num_uncomputed_tokens, budget)
        return n if n == seq.num_uncomputed_tokens or self.chunked_prefill else 0

    def _make_room(self, seq: Sequence, n: int, out: SchedulerOutput,
                   scheduled: set[int]) -> bool:
        """Preempt running sequences not yet scheduled this step (the newest; by priority the
        least urgent) until `seq` fits; False if `seq` itself had to go."""
        while not self.block_manager.can_allocate(seq, n):
            others = [s for s in self.running if s is not seq and id(s) not in scheduled]
            victim = self._victim(others) if others else seq
            self.running.remove(victim)
            self._preempt(victim)
            out.preempted.append(victim)
            if victim is seq:
                return False
        return True

    def _victim(self, seqs: list[Sequence]) -> Sequence:
        return max(seqs, key=self.waiting.key) if self.by_priority else seqs[-1]

    def _preempt_for_priority(self, out: SchedulerOutput) -> None:
        """Preempt less urgent running sequences while the most urgent waiting one finds no
        free slot or too few free blocks for its first chunk."""
        while self.waiting and self.running:
            best, victim = self.waiting.peek(), self._victim(self.running)
            if victim.priority <= best.priority:
                return
            first = min(best.num_uncomputed_tokens, self.max_prefill_tokens)
            if (len(self.running) < self.max_num_seqs
                    and self.block_manager.can_allocate(best, first)):
                return
            self.running.remove(victim)
            self._preempt(victim)
            out.preempted.append(victim)

    def _schedule(self, seq: Sequence, n: int, out: SchedulerOutput, budget: _Budget,
                  scheduled: set[int], decode: bool | None = None) -> None:
        budget.take(n, seq.is_decoding if decode is None else decode)
        self.block_manager.allocate(seq, n)
        if seq.times.first_scheduled is None:
            self.block_manager.count_lookup(seq)
        seq.mark_scheduled()
        self.waiting.charge(seq, n)
        out.scheduled.append((seq, n))
        scheduled.add(id(seq))

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.spec_token_ids = []
        seq.num_preemptions += 1
        seq.status = SequenceStatus.WAITING
        self.waiting.add(seq)
        self.num_preemptions += 1

    def _admit_batch(self) -> None:
        """Static batching: move as many waiting sequences as the KV pool holds to running."""
        free = self.block_manager.num_free_blocks
        while self.waiting and len(self.running) < self.max_num_seqs:
            head = self.waiting.peek()
            need = self.block_manager.blocks_needed(head, head.num_tokens)
            if need > free and self.running:
                break
            free -= need
            self.waiting.remove(head)
            head.status = SequenceStatus.RUNNING
            self.running.append(head)
