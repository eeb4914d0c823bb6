"""What the engine reports: each step's output per request, and its counters."""

from __future__ import annotations

from dataclasses import dataclass

from latlab.engine.sequence import FinishReason, StageTimes


@dataclass(slots=True)
class RequestOutput:
    """What one step produced for one request: the new text, cumulative counts, the end."""

    request_id: str
    text: str
    num_prompt_tokens: int
    num_cached_tokens: int
    num_output_tokens: int
    token_time_ns: int
    finish_reason: FinishReason | None
    times: StageTimes
    error: str | None = None  # set with FinishReason.ERROR: why the engine gave up on it
    num_draft_tokens: int = 0     # speculative tokens verified so far
    num_accepted_tokens: int = 0  # of which accepted

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineStats:
    num_running: int
    num_waiting: int
    num_free_blocks: int
    num_blocks: int
    kv_usage: float
    num_preemptions: int
    num_steps: int
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int = 0     # of which found there
    num_draft_tokens: int = 0      # speculative tokens verified
    num_accepted_tokens: int = 0   # of which accepted
    num_queue_timeouts: int = 0    # refused after --max-queue-delay
    model_loaded: bool = True      # False while unloaded (--idle-unload)
    num_model_loads: int = 0       # reloads after an unload
    last_load_s: float | None = None
