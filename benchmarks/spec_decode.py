"""Speculative decoding (n-gram prompt lookup) against plain decoding, at low and high batch.

    python benchmarks/spec_decode.py            # 32 requests per run (a few minutes)
    python benchmarks/spec_decode.py --quick    # 8 requests at concurrency 1, 32 at 16
    python benchmarks/spec_decode.py --users 32,64 --requests 64   # where it stops paying

Repetitive prompts: a random 24-token passage repeated 8 times (192 tokens), the kind of text
prompt lookup is made for (code edits, documents quoting themselves); 128 output tokens,
greedy (the only case drafts are proposed for), ignore_eos. The `default` preset, one torch
thread, in-process against `LLMEngine`, closed loops of 1 and 16 users (`--users`); plain
decoding and `speculative_method="ngram"` (k = `--k`) alternate over `--rounds`. Prints TPOT p50,
output tok/s and the acceptance rate (accepted / proposed drafts), and the speedup per concurrency.
The greedy outputs are compared: identical in float32; in bfloat16 a verification pass rounds
differently from single-token decodes, so near-ties can flip (the share identical is printed).
"""

from __future__ import annotations

import argparse
import random

from replay import Request, ms, output_tokens_per_s, replay, tpot_ms

from latlab.engine.engine import LLMEngine
from latlab.engine.sampling_params import SamplingParams
from latlab.records.engine import EngineConfig


def requests(n: int, seed: int) -> list[Request]:
    rng = random.Random(seed)
    params = SamplingParams(max_tokens=128, temperature=0.0, ignore_eos=True)
    return [Request(0.0, [rng.randrange(16, 8192) for _ in range(24)] * 8, params)
            for _ in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--users", default="1,16", help="closed-loop concurrencies, e.g. 1,16,64")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    concurrencies = [int(u) for u in args.users.split(",")]
    base = EngineConfig(model="default", threads=1, dtype=args.dtype,
                        max_num_seqs=max(concurrencies))
    engines = {"plain": LLMEngine(base),
               "ngram": LLMEngine(base.with_overrides(speculative_method="ngram",
                                                      num_speculative_tokens=args.k))}
    print(f"repetitive 192-token prompts, 128 output tokens, greedy; default preset, "
          f"{args.dtype}, 1 thread; n-gram k={args.k}; rounds alternate plain and ngram")
    print(f"{'users':>5} {'round':>5}  {'decoding':<9}{'TPOT p50':>10}{'out tok/s':>10}"
          f"{'accepted':>9}")
    for users in concurrencies:
        n = 8 if args.quick and users == 1 else args.requests
        tps = {name: 0.0 for name in engines}
        for round_ in range(1 if args.quick else args.rounds):
            work = requests(n, seed=round_)
            outputs = {}
            for name, engine in engines.items():
                before = engine.stats()
                seqs, elapsed = replay(engine, work, concurrency=users)
                after = engine.stats()
                drafts = after.num_draft_tokens - before.num_draft_tokens
                accepted = after.num_accepted_tokens - before.num_accepted_tokens
                tps[name] += output_tokens_per_s(seqs, elapsed)
                outputs[name] = [s.output_token_ids for s in seqs]
                rate = f"{100 * accepted / drafts:.0f}%" if drafts else "-"
                print(f"{users:>5} {round_ + 1:>5}  {name:<9}{ms(tpot_ms(seqs), 50):>8.1f}ms"
                      f"{output_tokens_per_s(seqs, elapsed):>10.0f}{rate:>9}", flush=True)
            same = sum(a == b for x, y in zip(outputs["plain"], outputs["ngram"])
                       for a, b in zip(x, y)) / sum(map(len, outputs["plain"]))
            if same < 1:  # bf16: a k-token verification rounds differently from k decodes
                print(f"      greedy tokens identical to plain decoding: {100 * same:.1f}%")
        print(f"{users:>5} users: n-gram speculation gives {tps['ngram'] / tps['plain']:.2f}x "
              "the output tok/s of plain decoding")


if __name__ == "__main__":
    main()
