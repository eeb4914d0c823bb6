"""Weight-only int8 and bf16 against float32: decode step time and logit error.

    python benchmarks/quantization.py             # about a minute
    python benchmarks/quantization.py --threads 2

Four engines on the same `default` preset weights: float32; bfloat16 (weights, activations and
KV); `quantization="int8"` (int8 weights with a scale per output channel through
`torch._weight_int8pack_mm`, bf16 activations into it, float32 elsewhere); and int8 weights
in an otherwise bfloat16 model. Decode step time
(median of `--steps` whole `LLMEngine.step()` calls, 128-token prompts) at batch 1 and 32, the
three measured in turn for `--rounds` rounds in the same process, as a speedup over float32.
Logit error over 4 prompts of 256 tokens, every position: the largest absolute difference
from float32 relative to the float32 logits' spread (max - min), the mean absolute difference,
and how often the top-1 token agrees.
"""

from __future__ import annotations

import argparse

import torch
from engine_step import decode_steps

from latlab.engine.engine import LLMEngine
from latlab.records.engine import EngineConfig

SETTINGS = {"float32": {}, "bfloat16": {"dtype": "bfloat16"}, "int8": {"quantization": "int8"},
            "int8+bf16": {"quantization": "int8", "dtype": "bfloat16"}}


def decode_step_ms(engine: LLMEngine, batch: int, steps: int) -> float:
    return decode_steps(engine, None, batch, steps, temperature=0.0)[0]


@torch.inference_mode()
def logit_errors(engines: dict[str, LLMEngine]) -> dict[str, tuple[float, float, float]]:
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(16, 8192, (256,), generator=g) for _ in range(4)]
    logits = {name: [e.runner.model.compute_logits(e.runner.model(p, torch.arange(256)))
                     for p in prompts] for name, e in engines.items()}
    out = {}
    for name, rows in logits.items():
        worst, mean, agree = 0.0, 0.0, 0.0
        for ref, got in zip(logits["float32"], rows):
            diff = (got - ref).abs()
            spread = (ref.amax(dim=-1) - ref.amin(dim=-1)).unsqueeze(1)
            worst = max(worst, float((diff / spread).max()))
            mean += float(diff.mean()) / len(prompts)
            agree += float((got.argmax(-1) == ref.argmax(-1)).float().mean()) / len(prompts)
        out[name] = (worst, mean, agree)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    engines = {name: LLMEngine(EngineConfig(model="default", threads=args.threads,
                                            max_num_seqs=32, **options))
               for name, options in SETTINGS.items()}
    print(f"default preset, {args.threads} thread(s), 128-token prompts; decode step: median of "
          f"{args.steps} steps, best of {args.rounds} interleaved rounds")
    best = {(name, b): float("inf") for name in engines for b in (1, 32)}
    for _ in range(args.rounds):
        for batch in (1, 32):
            for name, engine in engines.items():
                best[name, batch] = min(best[name, batch],
                                        decode_step_ms(engine, batch, args.steps))
    errors = logit_errors(engines)
    print(f"{'weights':<10}{'step b=1':>10}{'speedup':>8}{'step b=32':>11}{'speedup':>8}"
          f"{'max |err|':>11}{'mean |err|':>11}{'top-1':>8}")
    for name in engines:
        one, many = best[name, 1], best[name, 32]
        worst, mean, agree = errors[name]
        print(f"{name:<10}{one:>8.2f}ms{best['float32', 1] / one:>7.2f}x{many:>9.2f}ms"
              f"{best['float32', 32] / many:>7.2f}x{100 * worst:>10.2f}%{mean:>11.4f}"
              f"{100 * agree:>7.1f}%")
    print("max |err|: largest |logit - float32 logit| over the float32 logits' spread")


if __name__ == "__main__":
    main()
