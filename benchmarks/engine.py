"""Continuous batching against static batching and a naive one-request-at-a-time loop.

    python benchmarks/engine.py            # 64 requests (a few minutes on 2 cores)
    python benchmarks/engine.py --quick    # 16 shorter requests (well under a minute)

One fixed workload (mixed prompt lengths, a fixed output length held with ignore_eos) runs
in-process on the same model (the `default` preset, one torch thread) three ways:

* continuous: latlab's engine (iteration-level scheduling, chunked prefill);
* static: the same engine with `batching="static"` (a batch admits nobody until it is done);
* naive: the same engine fed one request at a time (a plain prefill-then-decode loop with a
  KV cache, batch size 1), each request waiting for the previous one.

Each runs with every request arriving at once, and with a Poisson stream. A request's clock
starts at its scheduled arrival. TTFT = first token computed - arrival; ITL = gaps between
a request's consecutive tokens; output tokens/s = all output tokens / time to the last one.
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import dataclass

import torch

from latlab.engine.engine import LLMEngine
from latlab.engine.sampling_params import SamplingParams
from latlab.engine.sequence import Sequence
from latlab.metrics.stats import percentile
from latlab.records.engine import EngineConfig

PROMPT_LENGTHS = (16, 32, 64, 128, 256)


@dataclass
class Workload:
    prompts: list[list[int]]
    arrivals_s: list[float]
    params: SamplingParams


@dataclass
class Result:
    tokens_per_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    itl_p99_ms: float
    duration_s: float


def workload(n: int, output_tokens: int, rate: float | None, seed: int = 0) -> Workload:
    rng = random.Random(seed)
    lengths = [PROMPT_LENGTHS[i % len(PROMPT_LENGTHS)] for i in range(n)]
    rng.shuffle(lengths)
    prompts = [[rng.randrange(8192) for _ in range(length)] for length in lengths]
    arrivals, t = [], 0.0
    for _ in range(n):
        arrivals.append(t)
        t += rng.expovariate(rate) if rate else 0.0
    params = SamplingParams(max_tokens=output_tokens, temperature=1.0, ignore_eos=True)
    return Workload(prompts, arrivals, params)


def run(engine: LLMEngine, w: Workload, one_at_a_time: bool = False) -> Result:
    """Feed `w` to `engine` on its arrival schedule; step until every request is done."""
    start = time.perf_counter_ns()
    seqs: list[Sequence] = []
    arrivals = [start + int(a * 1e9) for a in w.arrivals_s]
    while len(seqs) < len(arrivals) or engine.has_unfinished():
        now = time.perf_counter_ns()
        idle = not engine.has_unfinished()
        while len(seqs) < len(arrivals) and arrivals[len(seqs)] <= now and (
                idle or not one_at_a_time):
            i = len(seqs)
            seqs.append(engine.add_request(f"bench-{start}-{i}", w.prompts[i], w.params,
                                           received_ns=arrivals[i]))
            idle = False
        if engine.has_unfinished():
            engine.step()
        elif len(seqs) < len(arrivals):
            time.sleep(max(0.0, (arrivals[len(seqs)] - time.perf_counter_ns()) / 1e9))
    end = max(s.times.last_token for s in seqs)
    ttft = sorted((s.times.first_token - s.times.received) / 1e6 for s in seqs)
    itl = sorted((b - a) / 1e6 for s in seqs for a, b in zip(s.token_times, s.token_times[1:]))
    tokens = sum(s.num_output_tokens for s in seqs)
    return Result(tokens / ((end - start) / 1e9), percentile(ttft, 50), percentile(ttft, 99),
                  percentile(itl, 99), (end - start) / 1e9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="16 requests of 32 tokens")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--rate", type=float, default=4.0, help="Poisson arrivals per second")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    args = parser.parse_args()
    if args.quick:
        args.requests, args.output_tokens, args.rate = 16, 32, 8.0
    torch.manual_seed(0)
    base = EngineConfig(model="default", max_num_seqs=args.max_num_seqs, threads=1)
    continuous = LLMEngine(base)
    static = LLMEngine(base.with_overrides(batching="static"))
    prompt_mean = sum(PROMPT_LENGTHS) / len(PROMPT_LENGTHS)
    print(f"{args.requests} requests, prompts {'/'.join(map(str, PROMPT_LENGTHS))} tokens "
          f"(mean {prompt_mean:.0f}), {args.output_tokens} output tokens each; model default "
          f"({continuous.model_config.num_parameters / 1e6:.1f}M parameters), 1 torch thread, "
          f"max_num_seqs {args.max_num_seqs}")
    header = (f"{'arrivals':<16}{'engine':<12}{'out tok/s':>10}{'x naive':>9}"
              f"{'TTFT p50':>11}{'TTFT p99':>11}{'ITL p99':>10}{'time':>8}")
    print(header)
    print("-" * len(header))
    for label, rate in (("all at once", None), (f"Poisson {args.rate:g}/s", args.rate)):
        w = workload(args.requests, args.output_tokens, rate)
        results = {"naive": run(continuous, w, one_at_a_time=True),
                   "static": run(static, w), "continuous": run(continuous, w)}
        naive = results["naive"]
        for name, r in results.items():
            print(f"{label:<16}{name:<12}{r.tokens_per_s:>10.0f}"
                  f"{r.tokens_per_s / naive.tokens_per_s:>8.1f}x"
                  f"{r.ttft_p50_ms:>9.0f}ms{r.ttft_p99_ms:>9.0f}ms{r.itl_p99_ms:>8.0f}ms"
                  f"{r.duration_s:>7.1f}s", flush=True)


if __name__ == "__main__":
    main()
