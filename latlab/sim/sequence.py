"""The simulator's sequences: the engine's own `Sequence`, with what the simulator tracks
about its request, built with token ids that make a shared prompt prefix the same ids; and
the arithmetic of decode runs (how many steps, whether they are exact)."""

from __future__ import annotations

import itertools
import math

from latlab.engine.scheduler import Scheduler
from latlab.engine.sequence import Sequence, StageTimes

_TIMES = StageTimes(0, 0)  # shared: the scheduler stamps first_scheduled once, harmlessly


class SimSequence(Sequence):
    """The engine's `Sequence` plus what the simulator tracks about its request."""

    index: int
    target: int  # output tokens it will have when it finishes
    sync: int  # the replica's decode-run steps when this one was last brought up to date
    sync_step: int  # ... and the step that came next
    first_scheduled: float
    first_step: int
    run_start: int
    last_step: int
    finish_step: int
    runs: list[tuple[int, int]] | None
    arrived: float  # when it reached the engine's queue (s)
    acceptance: float  # speculative decoding: the chance it accepts each draft
    events: list[tuple[int, int]] | None  # speculative decoding: (step, tokens) it got


def steps_to(a: float, b: float, span: float) -> int:
    """The fewest steps of `a + b·j` seconds (j from 0) that last at least `span`."""
    def total(j: int) -> float:
        return a * j + b * j * (j - 1) / 2

    if b > 0:
        q = a - b / 2
        j = max(1, math.ceil((-q + math.sqrt(q * q + 2 * b * span)) / b))
    else:
        j = max(1, math.ceil(span / a))
    while j > 1 and total(j - 1) >= span:
        j -= 1
    while total(j) < span:
        j += 1
    return j


def new_sequence(index: int, prompt_tokens: int, output_tokens: int,
                 prefix: list[int] | None = None, priority: int = 0,
                 tenant: str | None = None) -> SimSequence:
    """A sequence of `prompt_tokens` tokens that will generate `output_tokens`: a shared
    `prefix` (the same ids for every request that shares it) and ids unique to the request."""
    own = prompt_tokens - (len(prefix) if prefix else 0)
    ids = (prefix or []) + [1 + (index >> 13) % 8191, 1 + index % 8191][:own]
    ids.extend(itertools.repeat(0, own - min(own, 2)))
    seq = SimSequence(str(index), ids, None, _TIMES,  # type: ignore[arg-type]
                      priority=priority, tenant=tenant)
    seq.index = index
    seq.target = output_tokens
    seq.sync = seq.sync_step = 0
    seq.first_scheduled = -1.0
    seq.first_step = seq.run_start = seq.last_step = seq.finish_step = -1
    seq.runs = seq.events = None
    seq.arrived = seq.acceptance = 0.0
    return seq


BLOCK_MARK = 1 << 20  # a block's first token: BLOCK_MARK + its hash id (others are below)
AFFINITY_BLOCKS = 2  # a trace request's first blocks: prefix-affinity routing's key


def block_ids(hash_ids, tokens: int, limit: int) -> list[int]:
    """The token ids of a trace's blocks (each `tokens` long, its first token naming its hash
    id, so equal ids give equal blocks), the first `limit` of them."""
    ids: list[int] = []
    for h in hash_ids[: -(-limit // tokens)].tolist():
        ids.append(BLOCK_MARK + h)
        ids.extend(itertools.repeat(0, tokens - 1))
    return ids[:limit]


def shared_prefix(lengths, index: int, prompt: int, prefix: list[int]
                  ) -> tuple[list[int] | None, int | None]:
    """The token ids request `index` may share with others (a trace's blocks, or the
    workload's shared `prefix`), and what prefix-affinity routing keys it by: a trace's
    first `AFFINITY_BLOCKS` blocks, the shared prefix (0), or nothing (None)."""
    blocks = lengths.blocks
    if blocks is not None:
        ids = blocks.of(index)
        if len(ids):
            return (block_ids(ids, blocks.tokens, prompt),
                    hash(tuple(ids[:AFFINITY_BLOCKS].tolist())))
        return None, None
    if lengths.shared[index]:
        return prefix, 0
    return None, None


def block_limit(running: list[Sequence], block_size: int, free: int, k: int) -> int:
    """The most decode steps (≤ k) all of `running` can take before the KV pool runs dry."""
    held = [(s.num_computed_tokens, len(s.block_table)) for s in running]

    def need(j: int) -> int:
        return sum(max(0, -(-(c + j) // block_size) - n) for c, n in held)

    lo, hi = 0, k
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if need(mid) <= free else (lo, mid - 1)
    return lo


def runs_exact(scheduler: Scheduler) -> bool:
    """Whether decode runs (steps taken without the scheduler) can be what it would do: not
    when it rotates decodes under a cap, or charges each step's tokens to tenants."""
    s = scheduler
    return (s.waiting.fair_share is None
            and min(s.max_num_batched_tokens, s.max_decode_tokens) >= s.max_num_seqs)


def may_admit(scheduler: Scheduler) -> bool:
    """Whether the scheduler might admit the head of its queue this step, all running
    sequences decoding (or preempt one for it): True where unsure."""
    s = scheduler
    if s.static or not s.waiting:
        return False
    if s.by_priority:
        return True
    if len(s.running) >= s.max_num_seqs:
        return False
    head = s.waiting.peek()
    n = min(head.num_uncomputed_tokens, s.max_num_batched_tokens - len(s.running),
            s.max_prefill_tokens)
    if n < head.num_uncomputed_tokens and not s.chunked_prefill:
        return False
    return n > 0 and (s.block_manager.enable_caching  # its cached prefix might fit
                      or s.block_manager.can_allocate(head, n))


def admits_alone(scheduler: Scheduler, owed: int) -> int:
    """The prompt tokens the scheduler gives the head of its queue this step when that is
    all it does beside every running sequence's decode — FCFS without a prefix cache, the
    whole prompt fits the step, nobody else can join, and the KV pool (less the `owed`
    blocks decode runs took) holds a new block for every decode too — else 0."""
    s = scheduler
    if s.static or s.by_priority or not s.waiting or s.block_manager.enable_caching:
        return 0
    batch = len(s.running)
    if batch >= s.max_num_seqs:
        return 0
    head = s.waiting.peek()
    n = head.num_uncomputed_tokens
    room = min(s.max_num_batched_tokens - batch, s.max_prefill_tokens)
    if n > room or (len(s.waiting) > 1 and room > n and batch + 1 < s.max_num_seqs):
        return 0
    if s.block_manager.num_free_blocks - owed < batch + s.block_manager.blocks_needed(head, n):
        return 0
    return n
