"""`latlab serve` under streaming users with its engine's loop in a thread against a process
of its own (`--engine-core`), side by side in one run.

    python benchmarks/engine_serving.py                      # tiny model, CPU, 64 users
    python benchmarks/engine_serving.py --device cuda --model default --dtype bfloat16 \\
        --duration 20 --rounds 1                             # the GPU check's run

Each round runs `latlab bench` against an embedded `latlab serve` once per side (in
alternating order): `--users` closed-loop streaming users, 256-token prompts, 128 output
tokens each (`ignore_eos`, `min_tokens`), `--max-num-seqs` = `--users`. From the run folder
it reads output tokens/s, ITL p50 and p99 and the serving processes' CPU (the server and
its children); from the server's `--step-log`, the median step and how much of the wall
time between the first and last step the engine spent stepping (`busy`: below 100 % the
loop waits between steps on something else: commands, outputs, the GIL). Each round also
runs the engine alone in this process (`LLMEngine.generate`, the same batch and lengths, no
HTTP): `of engine` is serving's output tok/s over it. Figures are the medians over the
rounds.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

SIDES = ("thread", "process")


def run_side(core: str, args: argparse.Namespace, folder: Path) -> dict[str, float]:
    step_log = folder / f"steps-{core}.jsonl"
    serve = (f"--device {args.device} --model {args.model} --dtype {args.dtype} "
             f"--max-num-seqs {args.users} --engine-core {core} --step-log {step_log}")
    runs = folder / f"runs-{core}"
    command = [sys.executable, "-m", "latlab", "bench", "--serve-args", serve,
               "--users", str(args.users), "--duration", str(args.duration),
               "--prompt-tokens", "256", "--output-tokens", "fixed:128", "--out", str(runs)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    summaries = sorted(runs.glob("*/summary.json"))
    if not summaries:
        sys.exit(f"engine_serving: the {core} run failed:\n{done.stdout[-1500:]}"
                 f"{done.stderr[-1500:]}")
    summary = json.loads(summaries[-1].read_text())
    itl = summary["latency"]["itl"]["percentiles"]
    if not itl:
        sys.exit(f"engine_serving: no request of the {core} run ended in its window: "
                 "give it a longer --duration")
    host = (summary["client"].get("host") or {}).get("server") or {}
    steps = [json.loads(line) for line in step_log.read_text().splitlines()]
    step_ms = [(s["end_ns"] - s["start_ns"]) / 1e6 for s in steps]
    wall_ms = (steps[-1]["end_ns"] - steps[0]["start_ns"]) / 1e6
    return {"tok_s": summary["throughput"]["output_tokens_per_s"],
            "itl_p50": itl["p50"]["value"], "itl_p99": itl["p99"]["value"],
            "cpu": host.get("mean", float("nan")), "step_ms": median(step_ms),
            "busy": sum(step_ms) / wall_ms}


def engine_alone(args: argparse.Namespace) -> float:
    """The engine's own output tok/s at the same batch, in this process without HTTP: `--users`
    sequences of 256-token prompts and 128 output tokens each, as bench asks them
    (temperature 1, `ignore_eos`), run together by `LLMEngine.generate` after a warm-up."""
    import torch

    from latlab.engine.engine import LLMEngine
    from latlab.engine.sampling_params import SamplingParams
    from latlab.records.engine import EngineConfig

    engine = LLMEngine(EngineConfig(model=args.model, device=args.device, dtype=args.dtype,
                                    max_num_seqs=args.users, warmup=True))
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(16, engine.model_config.vocab_size, (256,), generator=g).tolist()
               for _ in range(args.users)]
    params = SamplingParams(max_tokens=128, min_tokens=128, ignore_eos=True, temperature=1.0)
    start = time.perf_counter()
    engine.generate(prompts, params)
    return args.users * 128 / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--users", type=int, default=64)
    parser.add_argument("--duration", type=float, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="keep the run folders and step logs here")
    parser.add_argument("--cores", nargs="+", choices=SIDES, default=list(SIDES),
                        help="the engine cores to serve with")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        results: dict[str, list[dict[str, float]]] = {side: [] for side in args.cores}
        alone: list[float] = []
        for r in range(args.rounds):
            for side in (args.cores if r % 2 == 0 else list(reversed(args.cores))):
                results[side].append(run_side(side, args, folder / f"round{r + 1}"))
                last = results[side][-1]
                print(f"round {r + 1} {side:>7}: {last['tok_s']:.0f} output tok/s, ITL p50 "
                      f"{last['itl_p50']:.1f} ms p99 {last['itl_p99']:.1f} ms", flush=True)
            alone.append(engine_alone(args))
            print(f"round {r + 1} the engine alone: {alone[-1]:.0f} output tok/s", flush=True)
    print(f"\n{args.model} on {args.device} ({args.dtype}), {args.users} streaming users, "
          f"256/128 tokens, {args.duration:g} s; medians of {args.rounds} round(s)")
    engine_tok_s = median(alone)
    print(f"{'engine core':>11} {'tok/s':>7} {'of engine':>10} {'ITL p50':>8} {'ITL p99':>8} "
          f"{'p99/p50':>8} {'step ms':>8} {'busy':>6} {'server CPU':>11}")
    for side in args.cores:
        cell = {k: median(r[k] for r in results[side]) for k in results[side][0]}
        print(f"{side:>11} {cell['tok_s']:>7.0f} {cell['tok_s'] / engine_tok_s:>10.0%} "
              f"{cell['itl_p50']:>8.1f} {cell['itl_p99']:>8.1f} "
              f"{cell['itl_p99'] / cell['itl_p50']:>7.1f}x {cell['step_ms']:>8.2f} "
              f"{cell['busy']:>6.0%} {cell['cpu']:>10.2f}c")
    print(f"{'(alone)':>11} {engine_tok_s:>7.0f} {'100%':>10}  the engine's own tok/s at "
          f"batch {args.users}, no HTTP (goal on a GPU: serving at 80 % of it or more)")


if __name__ == "__main__":
    main()
