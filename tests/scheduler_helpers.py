"""A scheduler and its sequences without a model, stepped as the engine steps them."""

from __future__ import annotations

from latlab.engine.block_manager import BlockManager
from latlab.engine.sampling_params import SamplingParams
from latlab.engine.scheduler import Scheduler, SchedulerOutput
from latlab.engine.sequence import Sequence, StageTimes
from latlab.records.engine import EngineConfig


def seq(name: str, prompt_len: int, priority: int = 0, tenant: str | None = None,
        enqueued: int = 0) -> Sequence:
    return Sequence(name, [1] * prompt_len, SamplingParams(), StageTimes(enqueued, enqueued),
                    priority=priority, tenant=tenant)


def scheduler(num_blocks: int = 100, block_size: int = 4, **options: object) -> Scheduler:
    config = EngineConfig(**{"max_num_seqs": 4, "max_num_batched_tokens": 16, **options})
    return Scheduler(config, BlockManager(num_blocks, block_size))


def run(s: Scheduler) -> SchedulerOutput:
    """One step as the engine does it: computed tokens advance, finished prompts get a token."""
    out = s.schedule()
    assert out.num_batched_tokens <= s.max_num_batched_tokens
    assert len(s.running) <= s.max_num_seqs
    for sq, n in out.scheduled:
        done = sq.num_computed_tokens + n == sq.num_tokens
        s.advance(sq, n, [2] if done else [])
        if done:
            sq.token_ids.append(2)
    return out


def plan(out: SchedulerOutput) -> list[tuple[str, int]]:
    return [(sq.request_id, n) for sq, n in out.scheduled]
