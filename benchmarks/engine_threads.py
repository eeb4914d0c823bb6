"""Decode steps on one torch thread against two, side by side in one engine: does splitting
a small step pay on this host, now?

    python benchmarks/engine_threads.py                 # the default preset, batches 4 and 16
    python benchmarks/engine_threads.py --batches 1 8 32 --blocks 24

For each batch, that many sequences of 256-token prompts decode (temperature 1); the step's
threads are forced per block of `--steps` steps (`IntraOpThreads.threads`, every step split),
one thread and two in alternating order over `--blocks` blocks, so that a busy spell of the
host hits both alike. Each block's first step is left out (the switch); it prints each
choice's median step time and the speedup of two threads. The engine's own rule
(`latlab.engine.intra_op`) learns the same choice while it serves.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from latlab.engine.engine import LLMEngine
from latlab.engine.sampling_params import SamplingParams
from latlab.records.engine import EngineConfig

PROMPT_TOKENS = 256


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--batches", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--blocks", type=int, default=16, help="blocks of steps, alternating")
    parser.add_argument("--steps", type=int, default=8, help="steps per block")
    args = parser.parse_args()
    engine = LLMEngine(EngineConfig(model=args.model, threads=2, max_num_seqs=max(args.batches),
                                    warmup=False))
    threads = engine.runner.threads
    threads.min_tokens = 1  # every step over `threads.threads`, set per block below
    generator = torch.Generator().manual_seed(0)
    vocab = engine.model_config.vocab_size
    params = SamplingParams(max_tokens=args.blocks * 2 * args.steps + 8, ignore_eos=True,
                            temperature=1.0)
    for batch in args.batches:
        for i in range(batch):
            prompt = torch.randint(16, vocab, (PROMPT_TOKENS,), generator=generator).tolist()
            engine.add_request(f"b{batch}-{i}", prompt, params)
        while any(s.num_computed_tokens < s.num_prompt_tokens for s in engine.sequences.values()):
            engine.step()
        times: dict[int, list[float]] = {1: [], 2: []}
        for block in range(args.blocks):
            for n in (1, 2) if block % 2 == 0 else (2, 1):
                threads.threads = n
                for k in range(args.steps):
                    start = time.perf_counter()
                    engine.step()
                    if k:
                        times[n].append((time.perf_counter() - start) * 1e3)
        one, two = statistics.median(times[1]), statistics.median(times[2])
        print(f"batch {batch}: 1 thread {one:.2f} ms, 2 threads {two:.2f} ms, speedup "
              f"{one / two:.2f}x", flush=True)
        for request_id in list(engine.sequences):
            engine.abort(request_id)
    torch.set_num_threads(1)


if __name__ == "__main__":
    main()
