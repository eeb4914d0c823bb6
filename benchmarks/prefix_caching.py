"""Prefix caching: a long shared system prompt, with and without `enable_prefix_caching`.

    python benchmarks/prefix_caching.py            # 96 requests, Poisson 3/s (about 2 minutes)
    python benchmarks/prefix_caching.py --quick    # 32 requests

90 % of the requests start with the same 1,024-token system prompt, then a user part of
32 to 256 tokens; the others are as long but share nothing. 32 output tokens each (ignore_eos),
greedy, the `default` preset, one torch thread, in-process against `LLMEngine`. The same
requests on the same arrival schedule run with the cache off, then on (alternating for
`--rounds`, each with a new system prompt, so that a noisy machine hits both alike). Prints
prefill time (first scheduled to
first token) and TTFT p50/p99, output tok/s and the share of prompt tokens served from cache.
"""

from __future__ import annotations

import argparse
import random

from replay import Request, ms, prefill_ms, replay, ttft_ms

from latlab.engine.engine import LLMEngine
from latlab.engine.sampling_params import SamplingParams
from latlab.records.engine import EngineConfig

SYSTEM_TOKENS = 1024


def requests(n: int, rate: float, seed: int = 0) -> list[Request]:
    rng = random.Random(seed)
    system = [rng.randrange(16, 8192) for _ in range(SYSTEM_TOKENS)]
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    out, t = [], 0.0
    for _ in range(n):
        user = [rng.randrange(16, 8192) for _ in range(rng.randrange(32, 257))]
        shared = rng.random() < 0.9
        prompt = system + user if shared else [rng.randrange(16, 8192)
                                               for _ in range(SYSTEM_TOKENS)] + user
        out.append(Request(t, prompt, params))
        t += rng.expovariate(rate)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=96)
    parser.add_argument("--rate", type=float, default=3.0, help="Poisson arrivals per second")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.requests, args.rounds = 32, 1
    base = EngineConfig(model="default", threads=1, dtype=args.dtype, max_num_seqs=32)
    engines = {"off": LLMEngine(base),
               "on": LLMEngine(base.with_overrides(enable_prefix_caching=True))}
    mean = sum(len(r.prompt) for r in requests(args.requests, args.rate)) / args.requests
    print(f"{args.requests} requests, Poisson {args.rate:g}/s, 90% share a {SYSTEM_TOKENS}-token "
          f"system prompt (mean prompt {mean:.0f} tokens), 32 output tokens; default preset, "
          f"{args.dtype}, 1 thread; each round a new system prompt, both settings in turn")
    print(f"{'round':<6}{'prefix cache':<13}{'prefill p50':>12}{'prefill p99':>12}{'TTFT p50':>10}"
          f"{'TTFT p99':>10}{'out tok/s':>10}{'cached':>8}")
    totals = {name: [0.0] * 4 for name in engines}
    for round_ in range(args.rounds):
        work = requests(args.requests, args.rate, seed=round_)
        for name, engine in engines.items():
            seqs, elapsed = replay(engine, work)
            cached = sum(s.num_cached_tokens for s in seqs) / sum(s.num_prompt_tokens for s in seqs)
            ttft, prefill = ttft_ms(seqs), prefill_ms(seqs)
            row = [ms(prefill, 50), ms(prefill, 99), ms(ttft, 50), ms(ttft, 99)]
            totals[name] = [a + b for a, b in zip(totals[name], row)]
            tps = sum(s.num_output_tokens for s in seqs) / elapsed
            print(f"{round_ + 1:<6}{name:<13}{row[0]:>10.0f}ms{row[1]:>10.0f}ms{row[2]:>8.0f}ms"
                  f"{row[3]:>8.0f}ms{tps:>10.0f}{100 * cached:>7.0f}%", flush=True)
    off, on = totals["off"], totals["on"]
    print(f"with the cache (means over rounds): prefill p50 {off[0] / on[0]:.1f}x lower, "
          f"TTFT p50 {off[2] / on[2]:.1f}x and p99 {off[3] / on[3]:.1f}x lower")

if __name__ == "__main__":
    main()
