"""One request inside the engine: its tokens, KV blocks, status and stage timestamps."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from latlab.engine.detokenizer import Detokenizer
    from latlab.engine.sampling_params import SamplingParams


class SequenceStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(StrEnum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"
    QUEUE_TIMEOUT = "queue_timeout"  # waited longer than --max-queue-delay: refused, never run


@dataclass(slots=True)
class StageTimes:
    """`time.perf_counter_ns()` of each stage on the server's clock; None until it happens."""

    received: int
    enqueued: int
    first_scheduled: int | None = None
    first_token: int | None = None
    last_token: int | None = None
    completed: int | None = None


@dataclass(eq=False)
class Sequence:
    """Prompt plus generated tokens; `num_computed_tokens` of them are in the KV cache."""

    request_id: str
    token_ids: list[int]
    params: SamplingParams
    times: StageTimes
    priority: int = 0
    tenant: str | None = None
    num_prompt_tokens: int = 0
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    block_table: list[int] = field(default_factory=list)
    # Content hashes of the sequence's first full blocks (prefix caching), chained.
    block_hashes: list[int] = field(default_factory=list)
    # Speculative decoding: tokens proposed for the next step, and the running tally.
    spec_token_ids: list[int] = field(default_factory=list)
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: FinishReason | None = None
    token_times: list[int] = field(default_factory=list)
    detokenizer: Detokenizer | None = None
    generator: torch.Generator | None = None

    def __post_init__(self) -> None:
        self.num_prompt_tokens = len(self.token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def is_decoding(self) -> bool:
        """Its whole context is in the KV cache but for the last token sampled."""
        return self.num_computed_tokens >= self.num_tokens - 1

    def append_token(self, token_id: int, now_ns: int) -> None:
        self.token_ids.append(token_id)
        self.token_times.append(now_ns)
        if self.times.first_token is None:
            self.times.first_token = now_ns
        self.times.last_token = now_ns

    def mark_scheduled(self) -> None:
        if self.times.first_scheduled is None:
            self.times.first_scheduled = time.perf_counter_ns()
