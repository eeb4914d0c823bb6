"""A heavy low-priority tenant and a light high-priority one: FCFS, priority, fair share.

    python benchmarks/priorities.py            # 12 s of arrivals per setting (about 2 minutes)
    python benchmarks/priorities.py --quick    # 5 s

"Big customers slow small ones": a `batch` tenant sends 512-token prompts (64 output tokens,
priority 10: not urgent) as a Poisson stream faster than the engine serves them, so a queue
builds; an `interactive` tenant sends 64-token prompts (16 output tokens, priority 0) at
1/s. The same arrivals run in-process against `LLMEngine` (the `default` preset, one thread,
32 running sequences at most) under three settings: first come first served; `priority`
scheduling (the queue by priority, and an urgent request preempts a less urgent running one
when there is no room); FCFS with tenant fair share (no priorities: the tenant served least
lately goes first). Prints each tenant's TTFT p50/p99, output tok/s and preemptions.
"""

from __future__ import annotations

import argparse
import random

from replay import Request, ms, output_tokens_per_s, replay, ttft_ms

from latlab.engine.engine import LLMEngine
from latlab.engine.sampling_params import SamplingParams
from latlab.records.engine import EngineConfig

SETTINGS = {
    "fcfs": {},
    "priority": {"scheduling_policy": "priority"},
    "fair share": {"fair_share": True},
}


def requests(duration_s: float, heavy_rate: float, light_rate: float,
             seed: int = 0) -> list[Request]:
    rng = random.Random(seed)
    out = []
    for tenant, rate, prompt, output, priority in (("batch", heavy_rate, 512, 64, 10),
                                                   ("interactive", light_rate, 64, 16, 0)):
        params = SamplingParams(max_tokens=output, temperature=0.0, ignore_eos=True)
        t = rng.expovariate(rate)
        while t < duration_s:
            out.append(Request(t, [rng.randrange(16, 8192) for _ in range(prompt)], params,
                               priority=priority, tenant=tenant))
            t += rng.expovariate(rate)
    return sorted(out, key=lambda r: r.arrival_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=12.0, help="seconds of arrivals")
    parser.add_argument("--heavy-rate", type=float, default=20.0)
    parser.add_argument("--light-rate", type=float, default=1.0)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.duration = 5.0
    work = requests(args.duration, args.heavy_rate, args.light_rate)
    counts = {t: sum(r.tenant == t for r in work) for t in ("batch", "interactive")}
    print(f"{args.duration:g} s of arrivals: batch {args.heavy_rate:g}/s ({counts['batch']} "
          f"requests, 512-token prompts, priority 10), interactive {args.light_rate:g}/s "
          f"({counts['interactive']}, 64-token prompts, priority 0); default preset, "
          f"{args.dtype}, 1 thread, max_num_seqs 32")
    print(f"{'scheduling':<12}{'interactive TTFT p50':>21}{'p99':>8}{'batch TTFT p50':>16}"
          f"{'p99':>8}{'out tok/s':>10}{'preempted':>10}")
    light_p99 = {}
    for name, options in SETTINGS.items():
        engine = LLMEngine(EngineConfig(model="default", threads=1, dtype=args.dtype,
                                        max_num_seqs=32, **options))
        seqs, elapsed = replay(engine, work)
        light = ttft_ms([s for s in seqs if s.tenant == "interactive"])
        heavy = ttft_ms([s for s in seqs if s.tenant == "batch"])
        light_p99[name] = ms(light, 99)
        print(f"{name:<12}{ms(light, 50):>19.0f}ms{ms(light, 99):>6.0f}ms{ms(heavy, 50):>14.0f}ms"
              f"{ms(heavy, 99):>6.0f}ms{output_tokens_per_s(seqs, elapsed):>10.0f}"
              f"{engine.stats().num_preemptions:>10}", flush=True)
    print(f"interactive p99 TTFT: priority {light_p99['fcfs'] / light_p99['priority']:.0f}x and "
          f"fair share {light_p99['fcfs'] / light_p99['fair share']:.0f}x lower than FCFS")


if __name__ == "__main__":
    main()
