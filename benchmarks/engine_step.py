"""Where an engine step's time goes: the model against the bookkeeping around it.

    python benchmarks/engine_step.py                     # the default preset, 1 and 2 threads
    python benchmarks/engine_step.py --dtype bfloat16
    python benchmarks/engine_step.py --model tiny --threads 1
    python benchmarks/engine_step.py --split-all          # every step over all the threads

For batches of 1 to 64 decoding sequences (128-token prompts, temperature 1) it times whole
`LLMEngine.step()` calls and, inside them, the model (forward pass and logits); the rest is
scheduling, batch building, sampling and detokenization. It also times one 512-token prefill chunk.
Tokens/s per batch size is printed as a ratio against batch 1, measured in the same process;
with several `--threads` the same engine is measured at each thread count in turn, and the
speedup over the first thread count is printed too. A step splits over the threads only when
it is big enough (`latlab.engine.intra_op`); `--split-all` splits every step, to see what
that costs.
"""

from __future__ import annotations

import argparse
import time

import torch

from latlab.engine.engine import LLMEngine
from latlab.engine.intra_op import IntraOpThreads
from latlab.engine.sampling_params import SamplingParams
from latlab.metrics.stats import percentile
from latlab.records.engine import EngineConfig

PROMPT_TOKENS = 128
PREFILL_CHUNK = 512
BATCHES = (1, 8, 32, 64)


class ForwardTimer:
    """Wraps the model's forward pass and its logits head, and adds up their wall time."""

    def __init__(self, engine: LLMEngine) -> None:
        model = engine.runner.model
        self.total_ns = 0
        model.forward = self.timed(model.forward)
        model.compute_logits = self.timed(model.compute_logits)

    def timed(self, inner):
        def call(*args, **kwargs):
            start = time.perf_counter_ns()
            try:
                return inner(*args, **kwargs)
            finally:
                self.total_ns += time.perf_counter_ns() - start
        return call


def decode_steps(engine: LLMEngine, timer: ForwardTimer | None, batch: int, steps: int,
                 temperature: float = 1.0) -> tuple[float, float]:
    """Median step time and median model time (ms; 0 without a timer) of `steps` steps of
    `batch` decodes of `PROMPT_TOKENS`-token prompts."""
    params = SamplingParams(max_tokens=steps + 4, temperature=temperature, ignore_eos=True)
    generator = torch.Generator().manual_seed(batch)
    vocab = engine.model_config.vocab_size
    for i in range(batch):
        prompt = torch.randint(0, vocab, (PROMPT_TOKENS,), generator=generator).tolist()
        engine.add_request(f"b{batch}-{i}-{time.perf_counter_ns()}", prompt, params)
    while any(s.num_computed_tokens < s.num_prompt_tokens for s in engine.scheduler.running) \
            or engine.scheduler.waiting:
        engine.step()
    step_ms, model_ms = [], []
    for _ in range(steps):
        if timer:
            timer.total_ns = 0
        start = time.perf_counter_ns()
        engine.step()
        step_ms.append((time.perf_counter_ns() - start) / 1e6)
        model_ms.append(timer.total_ns / 1e6 if timer else 0.0)
    while engine.has_unfinished():
        engine.step()
    return percentile(sorted(step_ms), 50), percentile(sorted(model_ms), 50)


def prefill_chunk(engine: LLMEngine, timer: ForwardTimer, rounds: int = 5) -> float:
    """Median time (ms) of a step that prefills one `PREFILL_CHUNK`-token prompt."""
    params = SamplingParams(max_tokens=1, temperature=1.0, ignore_eos=True)
    times = []
    for i in range(rounds):
        prompt = [(i * 7 + j) % engine.model_config.vocab_size for j in range(PREFILL_CHUNK)]
        engine.add_request(f"prefill-{i}", prompt, params)
        start = time.perf_counter_ns()
        engine.step()
        times.append((time.perf_counter_ns() - start) / 1e6)
        while engine.has_unfinished():
            engine.step()
    return percentile(sorted(times), 50)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--quantization", default=None)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--split-all", action="store_true",
                        help="every step over all the threads, however small")
    args = parser.parse_args()
    engine = LLMEngine(EngineConfig(model=args.model, max_num_seqs=max(BATCHES),
                                    max_num_batched_tokens=PREFILL_CHUNK, dtype=args.dtype,
                                    quantization=args.quantization, threads=args.threads[0]))
    timer = ForwardTimer(engine)
    params = engine.model_config.num_parameters
    print(f"model {args.model} ({params / 1e6:.1f}M parameters, {args.dtype}"
          f"{', ' + args.quantization if args.quantization else ''}), {PROMPT_TOKENS}-token "
          f"prompts, median of {args.steps} steps")
    print(f"{'threads':>7} {'batch':>6} {'step ms':>9} {'model ms':>9} {'other ms':>9} "
          f"{'tok/s':>8} {'x batch 1':>10} {'x threads':>10}")
    first: dict[int, float] = {}
    shape = engine.model_config
    for threads in args.threads:
        torch.set_num_threads(threads)
        engine.runner.threads = IntraOpThreads(threads, shape.hidden_size,
                                               shape.intermediate_size)
        if args.split_all:  # however small the step
            engine.runner.threads.min_tokens = 1
        base = None
        for batch in BATCHES:
            step, model = decode_steps(engine, timer, batch, args.steps)
            tokens_per_s = batch / step * 1000
            base = base or tokens_per_s
            first.setdefault(batch, tokens_per_s)
            print(f"{threads:>7} {batch:>6} {step:>9.2f} {model:>9.2f} {step - model:>9.2f} "
                  f"{tokens_per_s:>8.0f} {tokens_per_s / base:>9.1f}x "
                  f"{tokens_per_s / first[batch]:>9.2f}x", flush=True)
        print(f"{threads:>7} one {PREFILL_CHUNK}-token prefill step: "
              f"{prefill_chunk(engine, timer):.1f} ms")

if __name__ == "__main__":
    main()
