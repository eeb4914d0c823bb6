"""Calibrate the step-cost model on latlab's own engine: time `LLMEngine.step()` in process
over a grid of batch shapes and fit (as `benchmarks/engine_step.py` times steps).

For each context length the decode batch grows through `BATCHES` (at the longest context to
`LONG_CONTEXT_BATCH`, in the pass of spread prompts to `SPREAD_BATCH`: their prefills are the
grid's costliest steps, and batch 31's decodes are timed at the shortest context): the new
requests' prompts are prefilled beside the batch's decodes (those steps are samples too:
several prefill chunks at once, chunked continuations), a few pure decode steps are timed
(`DECODE_STEPS`: 4 fitted as well as 8, refitted from recorded grids), then prompts join the
decoding batch one at a time (a step of decodes plus one prefill chunk): half of `PREFILLS`'
lengths at a batch size, the other half at the next, so each pass joins every length (a full
set at every size cost a third of the grid's time and fitted no better; all of them where
only one size has room to join). Every timed step is
the whole `step()`: the model, the scheduler, sampling, detokenization. The engine is built
without its warm-up (one untimed request instead: the grid's first steps warm it further,
and the fit trims those that stay slow). torch is imported here only.

The *reference* (`REFERENCE`) is a fixed set of steps (decodes at batch 1 and 16, a prefill),
timed right after the grid (on the engine the grid warmed) and kept in the calibration;
`reference_ms` times it again on a fresh engine (a few seconds) to tell whether the machine
has become slower since.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from latlab.engine.batching import step_features
from latlab.records.engine import EngineShape
from latlab.sim.stepcost import features

CONTEXTS = (64, 320, 960)
BATCHES = (1, 2, 4, 8, 16, 31)
LONG_CONTEXT_BATCH = 4  # at the longest context, batches up to this (the prefills are slow)
SPREAD_BATCH = 16  # in the pass of spread prompts, batches up to this
PREFILLS = (16, 64, 192, 448)
DECODE_STEPS = 4
REPEATS = 1
REFERENCE = ((1, 20), (16, 10), (0, 256))  # (decode batch, steps), then one prefill of 256
REFERENCE_REPEATS = 3

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Pass:
    """One pass of the grid: a batch grown through `sizes` at `context` (`spread`: prompts
    from a quarter to 2.5 times it), the prompts joining it split in `halves` between sizes;
    its longest sequence reaches `longest` tokens."""

    context: int
    spread: bool
    sizes: tuple[int, ...]
    halves: bool
    longest: int


def grid(max_num_seqs: int, max_model_len: int, kv_tokens: int) -> list[Pass]:
    """The passes timed for an engine of these limits (`kv_tokens`: its KV pool's tokens).
    Each pass grows one batch through `BATCHES`: the requests of the batch before keep
    decoding (their contexts a few steps longer), so each prompt is prefilled once a pass.
    The middle context's pass spreads its prompts (more decode groups, mixed contexts)."""
    passes = []
    for i, context in enumerate(CONTEXTS):
        spread = i == len(CONTEXTS) // 2
        largest = (LONG_CONTEXT_BATCH if context == CONTEXTS[-1] else
                   SPREAD_BATCH if spread else max_num_seqs)
        sizes = [b for b in BATCHES if b <= min(largest, max_num_seqs)]
        halves = sum(b < max_num_seqs for b in sizes) > 1  # else all lengths at the one
        joins = (len(PREFILLS) + 1) // 2 if halves else len(PREFILLS)
        steps = len(sizes) * (DECODE_STEPS + joins * REPEATS + 2)
        longest = int(context * (2.5 if spread else 1)) + steps
        if longest < max_model_len:
            sizes = [b for b in sizes if b * longest <= kv_tokens]
            passes.append(Pass(context, spread, tuple(sizes), halves, longest))
    return passes


def time_engine(config, progress: Progress | None = None,
                before_timing: Callable[[], None] | None = None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, EngineShape, list[float]]:
    """(features, step ms, when each step started (s), the engine's shape, the reference's
    step ms) over the grid, for an `EngineConfig`. `before_timing` is called once the engine
    is built, before the first step is timed (whatever starts beside the calibration, e.g.
    the probe's server, waits there to be done, so no step is timed beside it)."""
    from latlab.engine.engine import LLMEngine
    from latlab.engine.sampling_params import SamplingParams

    engine = LLMEngine(config.model_copy(update={"warmup": False}))
    c = engine.config
    vocab = engine.model_config.vocab_size
    engine.generate([np.random.default_rng(1).integers(0, vocab, c.block_size).tolist()],
                    SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
    if before_timing:
        before_timing()
    t0 = time.perf_counter_ns()
    shape = EngineShape.of(c, engine.block_manager.num_blocks)
    rows: list[list[int]] = []
    ms: list[float] = []
    started: list[float] = []
    schedule = engine.scheduler.schedule
    current: list[int] = []

    def spy():
        out = schedule()
        current[:] = step_features(out.scheduled)
        return out

    engine.scheduler.schedule = spy
    rng = np.random.default_rng(0)
    ids = iter(range(10**9))

    def prompt(n: int) -> list[int]:
        return rng.integers(0, vocab, n).tolist()

    def step() -> None:
        start = time.perf_counter_ns()
        engine.step()
        elapsed = (time.perf_counter_ns() - start) / 1e6
        if current[0]:
            rows.append(list(current))
            ms.append(elapsed)
            started.append((start - t0) / 1e9)

    gc.collect()
    one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    passes = grid(c.max_num_seqs, c.max_model_len, shape.num_kv_blocks * c.block_size)
    shapes, done = sum(len(p.sizes) for p in passes), 0
    for p in passes:
        context, spread, halves = p.context, p.spread, p.halves
        params = SamplingParams(max_tokens=c.max_model_len - p.longest, temperature=0.0,
                                ignore_eos=True)
        running: list[str] = []
        for size, batch in enumerate(p.sizes):
            done += 1
            if progress:
                progress(f"batch {batch} at context {context}" + (" (spread)" if spread else "")
                         + f" ({done}/{shapes})")
            new = batch - len(running)
            contexts = (np.geomspace(context / 4, context * 2.5, new).astype(int)
                        if spread and new > 1 else np.full(new, context))
            for n in contexts:
                running.append(f"c{next(ids)}")
                engine.add_request(running[-1], prompt(max(1, int(n))), params)
            while engine.scheduler.waiting or any(
                    s.num_computed_tokens < s.num_prompt_tokens for s in engine.scheduler.running):
                step()
            for _ in range(DECODE_STEPS):
                step()
            for _ in range(REPEATS if batch < c.max_num_seqs else 0):  # room to join
                for n in PREFILLS[size % 2::2] if halves else PREFILLS:
                    if n + batch > c.max_num_batched_tokens and not c.enable_chunked_prefill:
                        continue
                    engine.add_request(f"p{next(ids)}", prompt(min(n, c.max_model_len - 1)),
                                       one)
                    while engine.scheduler.waiting or len(engine.scheduler.running) > batch:
                        step()
        for rid in running:
            engine.abort(rid)
    engine.scheduler.schedule = schedule
    if progress:
        progress("the reference steps (what a machine check times again later)")
    reference = time_reference(engine, warm=True)
    return features(rows), np.asarray(ms), np.asarray(started), shape, reference


def time_reference(engine, warm: bool = False) -> list[float]:
    """Each step of `REFERENCE` on `engine` (ms: the repeat of median total among
    `REFERENCE_REPEATS`, after one untimed unless the engine is `warm`: it has just run the
    grid), within the engine's limits."""
    from latlab.engine.sampling_params import SamplingParams

    c, vocab = engine.config, engine.model_config.vocab_size
    repeats = []
    for repeat in range(1 if warm else 0, REFERENCE_REPEATS + 1):
        rng = np.random.default_rng([1, repeat])  # the same prompts in every engine timed
        ms = []
        for batch, n in REFERENCE:
            steps = n if batch else 1
            prompt = min(64 if batch else n, c.max_model_len - steps - 1)
            params = SamplingParams(max_tokens=steps, temperature=0.0, ignore_eos=True)
            for i in range(min(batch, c.max_num_seqs) or 1):
                engine.add_request(f"reference-{repeat}-{batch}-{i}",
                                   rng.integers(0, vocab, prompt).tolist(), params)
            while engine.has_unfinished():
                start = time.perf_counter_ns()
                engine.step()
                ms.append((time.perf_counter_ns() - start) / 1e6)
        if repeat:
            repeats.append(ms)
    timed = sorted(repeats, key=sum)
    return timed[len(timed) // 2]


def reference_ms(config) -> list[float]:
    """`REFERENCE` timed now on a fresh engine of `config` (an `EngineConfig`)."""
    from latlab.engine.engine import LLMEngine

    return time_reference(LLMEngine(config.model_copy(update={"warmup": False})))
