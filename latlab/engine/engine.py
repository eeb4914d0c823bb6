"""`LLMEngine`: requests in, one scheduling step at a time, tokens and text out.

Single-threaded by design; `latlab.server.async_engine` runs it in its own thread.
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass, replace

import torch

from latlab.engine.block_manager import BlockManager
from latlab.engine.config import EngineConfig
from latlab.engine.detokenizer import Detokenizer
from latlab.engine.loader import load_model
from latlab.engine.model_runner import ModelRunner
from latlab.engine.sampling import Sampler, SamplingParams
from latlab.engine.scheduler import Scheduler
from latlab.engine.sequence import FinishReason, Sequence, StageTimes

log = logging.getLogger("latlab.engine")


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

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True, slots=True)
class EngineStats:
    num_running: int
    num_waiting: int
    num_free_blocks: int
    num_blocks: int
    kv_usage: float
    num_preemptions: int
    num_steps: int


class LLMEngine:
    """Owns the model, the KV pool, the scheduler; `step()` advances every running request."""

    def __init__(self, config: EngineConfig) -> None:
        torch.set_num_threads(config.threads)
        dtype = getattr(torch, config.dtype)
        loaded = load_model(config.model, dtype, config.seed)
        config = replace(config, max_model_len=config.resolve_max_model_len(loaded.config))
        self.config = config
        self.model_config = loaded.config
        self.tokenizer = loaded.tokenizer
        self.stop_token_ids = set(loaded.stop_token_ids)
        num_blocks = config.resolve_kv_blocks(loaded.config, dtype.itemsize)
        config.validate(loaded.config, num_blocks)
        self.block_manager = BlockManager(num_blocks, config.block_size)
        self.scheduler = Scheduler(config, self.block_manager)
        self.runner = ModelRunner(loaded.model, Sampler(config.seed, loaded.stop_token_ids),
                                  num_blocks, config.block_size)
        self.sequences: dict[str, Sequence] = {}
        self.num_steps = 0
        self._generate_ids = itertools.count()
        if config.warmup:
            self.warmup()

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    *, received_ns: int | None = None, enqueued_ns: int | None = None,
                    priority: int = 0, tenant: str | None = None) -> Sequence:
        """Queue a request. Raises ValueError for a prompt the engine cannot take.

        `received_ns` and `enqueued_ns` (`perf_counter_ns`) default to now: a server passes
        when it got the request and when it handed it over after preprocessing.
        """
        now = time.perf_counter_ns()
        if request_id in self.sequences:
            raise ValueError(f"request id {request_id!r} is already in the engine")
        if not prompt_token_ids:
            raise ValueError("the prompt is empty")
        if len(prompt_token_ids) >= self.config.max_model_len:
            raise ValueError(f"the prompt has {len(prompt_token_ids)} tokens; the context holds "
                             f"{self.config.max_model_len} including at least one generated")
        vocab = self.model_config.vocab_size
        if not all(0 <= t < vocab for t in prompt_token_ids):
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        if not all(0 <= t < vocab for t in params.stop_token_ids):
            raise ValueError(f"stop token ids must be in [0, {vocab})")
        seq = Sequence(request_id, list(prompt_token_ids), params,
                       StageTimes(received=received_ns or now, enqueued=enqueued_ns or now),
                       priority=priority, tenant=tenant)
        seq.detokenizer = Detokenizer(self.tokenizer, params.stop)
        self.sequences[request_id] = seq
        self.scheduler.add(seq)
        return seq

    def abort(self, request_id: str) -> bool:
        """Drop a request and free its KV blocks; False if it is not (or no longer) here."""
        seq = self.sequences.pop(request_id, None)
        if seq is None:
            return False
        self.scheduler.finish(seq, FinishReason.ABORT)
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[RequestOutput]:
        """Schedule, run the model once, and report every request that got a token."""
        scheduled = self.scheduler.schedule().scheduled
        if not scheduled:
            return []
        tokens, outputs = self._execute(scheduled)
        now = time.perf_counter_ns()
        self.num_steps += 1
        for (seq, n), token in zip(scheduled, tokens):
            if seq.is_finished:  # failed in _execute
                continue
            seq.num_computed_tokens += n
            if token is not None:
                try:
                    outputs.append(self._append(seq, token, now))
                except Exception as e:
                    outputs.append(self._fail(seq, e))
        return outputs

    def _execute(self, scheduled: list[tuple[Sequence, int]]
                 ) -> tuple[list[int | None], list[RequestOutput]]:
        """Run the batch; if it raises, run each sequence alone and fail only those that
        raise again, so one request's bad input never takes the others down with it."""
        try:
            return self.runner.execute(scheduled), []
        except Exception as e:
            if len(scheduled) == 1:
                return [None], [self._fail(scheduled[0][0], e)]
            log.warning("a batch of %d failed; running its sequences one by one",
                        len(scheduled))
        tokens: list[int | None] = []
        failed = []
        for seq, n in scheduled:
            try:
                tokens += self.runner.execute([(seq, n)])
            except Exception as e:
                tokens.append(None)
                failed.append(self._fail(seq, e))
        return tokens, failed

    def _fail(self, seq: Sequence, error: Exception) -> RequestOutput:
        """End one request with an error and free its KV blocks; the engine goes on."""
        log.error("request %s failed in the engine", seq.request_id, exc_info=error)
        self.scheduler.finish(seq, FinishReason.ERROR)
        self.sequences.pop(seq.request_id, None)
        return RequestOutput(seq.request_id, "", seq.num_prompt_tokens, seq.num_cached_tokens,
                             seq.num_output_tokens, time.perf_counter_ns(), FinishReason.ERROR,
                             seq.times, error=f"{type(error).__name__}: {error}")

    def _append(self, seq: Sequence, token: int, now: int) -> RequestOutput:
        seq.append_token(token, now)
        params = seq.params
        may_stop = seq.num_output_tokens >= params.min_tokens
        hit_stop_string = seq.detokenizer.push(token, check_stop=may_stop)
        reason = None
        if may_stop and (hit_stop_string or token in params.stop_token_ids
                         or (token in self.stop_token_ids and not params.ignore_eos)):
            reason = FinishReason.STOP
        elif (seq.num_output_tokens >= params.max_tokens
              or seq.num_tokens >= self.config.max_model_len):
            reason = FinishReason.LENGTH
        if reason is not None:
            self.scheduler.finish(seq, reason)
            del self.sequences[seq.request_id]
        return RequestOutput(seq.request_id, seq.detokenizer.release(final=reason is not None),
                             seq.num_prompt_tokens, seq.num_cached_tokens, seq.num_output_tokens,
                             now, reason, seq.times)

    def stats(self) -> EngineStats:
        bm = self.block_manager
        return EngineStats(len(self.scheduler.running), len(self.scheduler.waiting),
                           bm.num_free_blocks, bm.num_blocks, bm.usage,
                           self.scheduler.num_preemptions, self.num_steps)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Sequence]:
        """Run `prompts` together to completion (offline use: tests, benchmarks, warm-up)."""
        seqs = [self.add_request(f"generate-{next(self._generate_ids)}", p, params)
                for p in prompts]
        while any(not s.is_finished for s in seqs):
            self.step()
        return seqs

    def warmup(self) -> None:
        """A few prefill and decode steps at every batch size the engine will run."""
        params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
        generator = torch.Generator().manual_seed(0)

        def prompt(n: int) -> list[int]:
            vocab = self.model_config.vocab_size
            return torch.randint(0, vocab, (n,), generator=generator).tolist()

        size = 1
        while True:
            self.generate([prompt(self.config.block_size) for _ in range(size)], params)
            if size >= self.config.max_num_seqs:
                break
            size = min(2 * size, self.config.max_num_seqs)
        longest = min(self.config.max_num_batched_tokens, self.config.max_model_len - 3)
        self.generate([prompt(longest)], params)
        self.scheduler.num_preemptions = 0
        self.num_steps = 0
