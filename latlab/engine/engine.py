"""`LLMEngine`: requests in, one scheduling step at a time, tokens and text out.

Single-threaded by design; `latlab.server.engine_core` runs it in a thread or a process.
"""

from __future__ import annotations

import gc
import itertools
import logging
import time
from collections.abc import Callable

import torch

from latlab.engine.batching import step_features
from latlab.engine.block_manager import BlockManager
from latlab.engine.detokenizer import Detokenizer
from latlab.engine.device import resolve_device
from latlab.engine.draft_proposer import make_proposer
from latlab.engine.intra_op import IntraOpThreads
from latlab.engine.loader import LoadedModel, load_model
from latlab.engine.model_runner import ModelRunner
from latlab.engine.outputs import EngineStats, RequestOutput
from latlab.engine.paged_attention import resolve_backend
from latlab.engine.sampling import Sampler
from latlab.engine.sampling_params import SamplingParams
from latlab.engine.scheduler import Scheduler
from latlab.engine.sequence import FinishReason, Sequence, StageTimes
from latlab.records.engine import EngineConfig

log = logging.getLogger("latlab.engine")


class LLMEngine:
    """Owns the model, the KV pool, the scheduler; `step()` advances every running request."""

    def __init__(self, config: EngineConfig) -> None:
        config.validate_techniques()
        self.device = resolve_device(config.device, config.quantization)
        torch.set_num_threads(config.threads)
        self.dtype = getattr(torch, config.dtype)
        loaded = load_model(config.model, self.dtype, config.seed, config.quantization,
                            self.device)
        config = config.model_copy(
            update={"max_model_len": config.resolve_max_model_len(loaded.config)})
        self.config = config
        self.model_config = loaded.config
        self.attention = resolve_backend(config.attention, self.device,
                                         loaded.config.attention_head_dim)
        self.tokenizer = loaded.tokenizer
        self.stop_token_ids = set(loaded.stop_token_ids)
        num_blocks = config.resolve_kv_blocks(loaded.config, self.dtype.itemsize)
        config.validate_for(loaded.config, num_blocks)
        self.block_manager = BlockManager(num_blocks, config.block_size,
                                          enable_caching=config.enable_prefix_caching)
        self.scheduler = Scheduler(config, self.block_manager)
        self.runner: ModelRunner | None = self._runner(loaded)
        self.sequences: dict[str, Sequence] = {}
        self.num_steps = 0
        # Called after each step that ran the model: its start and end (perf_counter ns)
        # and `batching.step_features` of what it scheduled (`latlab serve --step-log`).
        self.on_step: Callable[[int, int, list[int]], None] | None = None
        self.num_queue_timeouts = 0
        self.num_model_loads = 0
        self.last_load_s: float | None = None
        self._generate_ids = itertools.count()
        if config.warmup:
            self.warmup()

    def _runner(self, loaded: LoadedModel) -> ModelRunner:
        num_blocks, config = self.block_manager.num_blocks, self.config
        vocab = loaded.tokenizer.backend.get_vocab(with_added_tokens=True)
        proposer = make_proposer(config, self.dtype, self.device, num_blocks,
                                 config.max_model_len, vocab)
        shape = loaded.config
        threads = (IntraOpThreads(config.threads, shape.hidden_size, shape.intermediate_size)
                   if self.device.type == "cpu" else None)
        loaded.model.set_attention(self.attention)
        return ModelRunner(loaded.model, Sampler(config.seed, loaded.stop_token_ids),
                           num_blocks, config.block_size, proposer,
                           static_decode=self.device.type == "cuda" and not config.enforce_eager,
                           max_num_seqs=config.max_num_seqs, max_model_len=config.max_model_len,
                           threads=threads)

    @property
    def is_sleeping(self) -> bool:
        return self.runner is None

    def sleep(self) -> None:
        """Unload the model, its KV cache and the prefix cache (scale to zero); nothing may be
        running. `wake_up` (or the next `step`) loads them again."""
        if self.has_unfinished():
            raise RuntimeError("the engine cannot sleep with requests in flight")
        self.runner = None
        self.block_manager.reset()
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # give the freed memory back to the GPU

    def wake_up(self) -> None:
        """Load the model again after `sleep` (a cold start; no warm-up)."""
        if self.runner is not None:
            return
        started = time.perf_counter()
        config = self.config
        self.runner = self._runner(load_model(config.model, self.dtype, config.seed,
                                              config.quantization, self.device))
        self.num_model_loads += 1
        self.last_load_s = time.perf_counter() - started

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
        """Schedule, run the model once, and report every request that got tokens (or was
        refused for waiting too long, or failed)."""
        self.wake_up()
        started = time.perf_counter_ns()  # a model load (after --idle-unload) is not a step's
        out = self.scheduler.schedule()
        outputs = [self._refused(seq) for seq in out.refused]
        if not out.scheduled:
            return outputs
        features = step_features(out.scheduled) if self.on_step else None
        tokens, failed = self._execute(out.scheduled)
        outputs += failed
        now = time.perf_counter_ns()
        self.num_steps += 1
        for (seq, n), new in zip(out.scheduled, tokens):
            if seq.is_finished:  # failed in _execute
                continue
            self.scheduler.advance(seq, n, new)
            if new:
                try:
                    outputs.append(self._append(seq, new, now))
                except Exception as e:
                    outputs.append(self._fail(seq, e))
        self.runner.propose(self.scheduler.running)
        if features:
            self.on_step(started, time.perf_counter_ns(), features)
        return outputs

    def _execute(self, scheduled: list[tuple[Sequence, int]]
                 ) -> tuple[list[list[int]], list[RequestOutput]]:
        """Run the batch; if it raises, run each sequence alone and fail only those that
        raise again, so one request's bad input never takes the others down with it."""
        try:
            return self.runner.execute(scheduled), []
        except Exception as e:
            if len(scheduled) == 1:
                return [[]], [self._fail(scheduled[0][0], e)]
            log.warning("a batch of %d failed; running its sequences one by one",
                        len(scheduled))
        tokens: list[list[int]] = []
        failed = []
        for seq, n in scheduled:
            try:
                tokens += self.runner.execute([(seq, n)])
            except Exception as e:
                tokens.append([])
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

    def _append(self, seq: Sequence, tokens: list[int], now: int) -> RequestOutput:
        """Append a step's tokens (several with speculative decoding) until one ends it."""
        params = seq.params
        reason = None
        for token in tokens:
            seq.append_token(token, now)
            may_stop = seq.num_output_tokens >= params.min_tokens
            hit_stop_string = seq.detokenizer.push(token, check_stop=may_stop)
            if may_stop and (hit_stop_string or token in params.stop_token_ids
                             or (token in self.stop_token_ids and not params.ignore_eos)):
                reason = FinishReason.STOP
            elif (seq.num_output_tokens >= params.max_tokens
                  or seq.num_tokens >= self.config.max_model_len):
                reason = FinishReason.LENGTH
            if reason is not None:
                self.scheduler.finish(seq, reason)
                del self.sequences[seq.request_id]
                break
        return self._output(seq, seq.detokenizer.release(final=reason is not None), now, reason)

    def _refused(self, seq: Sequence) -> RequestOutput:
        self.num_queue_timeouts += 1
        del self.sequences[seq.request_id]
        return self._output(seq, "", time.perf_counter_ns(), FinishReason.QUEUE_TIMEOUT)

    def _output(self, seq: Sequence, text: str, now: int,
                reason: FinishReason | None) -> RequestOutput:
        return RequestOutput(seq.request_id, text, seq.num_prompt_tokens, seq.num_cached_tokens,
                             seq.num_output_tokens, now, reason, seq.times,
                             num_draft_tokens=seq.num_draft_tokens,
                             num_accepted_tokens=seq.num_accepted_tokens)

    def stats(self) -> EngineStats:
        bm = self.block_manager
        s = self.scheduler
        return EngineStats(
            num_running=len(s.running), num_waiting=len(s.waiting),
            num_free_blocks=bm.num_free_blocks, num_blocks=bm.num_blocks, kv_usage=bm.usage,
            num_preemptions=s.num_preemptions, num_steps=self.num_steps,
            prefix_cache_queries=bm.num_queried_tokens, prefix_cache_hits=bm.num_hit_tokens,
            num_draft_tokens=s.num_draft_tokens, num_accepted_tokens=s.num_accepted_tokens,
            num_queue_timeouts=self.num_queue_timeouts, model_loaded=not self.is_sleeping,
            num_model_loads=self.num_model_loads, last_load_s=self.last_load_s)

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
            return torch.randint(0, vocab, (n,), generator=generator, device="cpu").tolist()

        delay, self.scheduler.max_queue_delay_ns = self.scheduler.max_queue_delay_ns, None
        size = 1
        while True:
            self.generate([prompt(self.config.block_size) for _ in range(size)], params)
            if size >= self.config.max_num_seqs:
                break
            size = min(2 * size, self.config.max_num_seqs)
        longest = min(self.config.max_num_batched_tokens, self.config.max_model_len - 3)
        self.generate([prompt(longest)], params)
        self.scheduler.max_queue_delay_ns = delay  # warm-up requests are never refused
        self.scheduler.num_preemptions = self.num_steps = self.num_queue_timeouts = 0
        self.scheduler.num_draft_tokens = self.scheduler.num_accepted_tokens = 0
        self.block_manager.num_queried_tokens = self.block_manager.num_hit_tokens = 0
