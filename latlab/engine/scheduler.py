"""Iteration-level scheduling (vLLM v1 style): one token budget per step.

Each step the running sequences are served first, oldest first, then waiting ones are admitted
first-come first-served while the budget, the running-sequence limit and the KV pool allow. A
sequence needs `num_uncomputed_tokens` more tokens computed: one for a decode, the rest of its
prompt for a prefill, which is cut into chunks to fit the budget so decodes keep flowing.
When the KV pool runs dry the newest running sequence is preempted: its blocks are freed and
it goes back to the head of the queue, to be recomputed from scratch.

`static` batching admits a batch only when nothing is running and nobody joins until the
whole batch has finished: the baseline continuous batching is measured against.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from latlab.engine.block_manager import BlockManager
from latlab.engine.config import EngineConfig
from latlab.engine.sequence import FinishReason, Sequence, SequenceStatus


@dataclass
class SchedulerOutput:
    scheduled: list[tuple[Sequence, int]] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager) -> None:
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.chunked_prefill = config.enable_chunked_prefill
        self.static = config.batching == "static"
        self.block_manager = block_manager
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        if self.static and not self.running:
            self._admit_batch()
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = self._chunk(seq, budget)
            if n == 0:
                i += 1
                continue
            if not self._make_room(seq, n, out.preempted):
                break
            self._schedule(seq, n, out)
            budget -= n
            i += 1
        if self.static or out.preempted:
            return out
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            n = self._chunk(seq, budget)
            if n == 0 or not self.block_manager.can_allocate(seq, n):
                break
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            self._schedule(seq, n, out)
            budget -= n
        return out

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason

    def _chunk(self, seq: Sequence, budget: int) -> int:
        """Tokens of `seq` to compute this step: 0 when its unchunked prefill does not fit."""
        n = min(seq.num_uncomputed_tokens, budget)
        return n if n == seq.num_uncomputed_tokens or self.chunked_prefill else 0

    def _make_room(self, seq: Sequence, n: int, preempted: list[Sequence]) -> bool:
        """Preempt the newest running sequences until `seq` fits; False if `seq` itself went."""
        while not self.block_manager.can_allocate(seq, n):
            victim = self.running.pop()
            self._preempt(victim)
            preempted.append(victim)
            if victim is seq:
                return False
        return True

    def _schedule(self, seq: Sequence, n: int, out: SchedulerOutput) -> None:
        self.block_manager.allocate(seq, n)
        seq.mark_scheduled()
        out.scheduled.append((seq, n))

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def _admit_batch(self) -> None:
        """Static batching: move as many waiting sequences as the KV pool holds to running."""
        free = self.block_manager.num_free_blocks
        while self.waiting and len(self.running) < self.max_num_seqs:
            need = self.block_manager.blocks_needed(self.waiting[0], self.waiting[0].num_tokens)
            if need > free and self.running:
                break
            free -= need
            seq = self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
