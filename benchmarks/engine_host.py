"""The host's time per engine step outside the model, at 64 streams: this tree against a git
revision (`--baseline`, default `main`), side by side in one run.

    python benchmarks/engine_host.py                          # tiny model, CPU, against main
    python benchmarks/engine_host.py --baseline HEAD~3 --rounds 5
    python benchmarks/engine_host.py --device cuda --model default --baseline none

The baseline's `latlab/` is exported with `git archive` into a temporary folder; each round
runs both sides, in alternating order, as fresh processes that import their own `latlab`
(this script's measuring half, `--measure`, uses only `LLMEngine`'s public methods, the same
in both). In each process:

* `decode`: `--streams` sequences decode together, as `latlab bench` asks (temperature 1,
  `min_tokens` = `max_tokens`, `ignore_eos`): the median of `--steps` whole `step()` calls.
* `mixed`: `--streams` requests kept in flight, each new one with a 256-token prompt and 32
  output tokens, so most steps carry prefill chunks beside the decodes (serving's steps).

Each step's model time (the forward pass and the logits, on CUDA synchronized at their end)
is timed inside it; `host` is the rest: scheduling, batch building, attention metadata,
sampling, the token ids' copy to the host, detokenization. On the CPU the times are the
engine thread's CPU time (`--threads 1`: torch computes on that thread), which other
processes on a busy host barely change; on CUDA they are wall times. Figures are the
medians over the rounds of each round's median; `--rounds` of at least 3 keep one busy
spell from deciding.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parent.parent
PROMPT_TOKENS = 256
MIXED_OUTPUT = 32
SCENARIOS = ("decode", "mixed")


def measure(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """This process's `latlab`, one engine, both scenarios: median step, model, host ms."""
    import torch

    from latlab.engine.engine import LLMEngine
    from latlab.engine.sampling_params import SamplingParams
    from latlab.records.engine import EngineConfig

    engine = LLMEngine(EngineConfig(
        model=args.model, device=args.device, dtype=args.dtype, threads=args.threads,
        max_num_seqs=args.streams, max_num_batched_tokens=512, max_model_len=1024,
        warmup=False))
    cuda = engine.device.type == "cuda"
    # On the CPU (one thread: torch computes on the calling thread) the thread's CPU time,
    # which other processes on a busy host do not inflate; on CUDA the wall time.
    clock = time.perf_counter_ns if cuda else time.thread_time_ns
    model = engine.runner.model
    model_ns = [0]

    def timed(inner):
        def call(*a, **k):
            start = clock()
            out = inner(*a, **k)
            if cuda:
                torch.cuda.synchronize()
            model_ns[0] += clock() - start
            return out
        return call

    model.forward = timed(model.forward)
    model.compute_logits = timed(model.compute_logits)
    generator = torch.Generator().manual_seed(0)
    vocab = engine.model_config.vocab_size
    ids = iter(range(1 << 30))

    def add(max_tokens: int) -> None:
        prompt = torch.randint(16, vocab, (PROMPT_TOKENS,), generator=generator).tolist()
        params = SamplingParams(max_tokens=max_tokens, min_tokens=max_tokens, ignore_eos=True,
                                temperature=1.0)
        engine.add_request(f"r{next(ids)}", prompt, params)

    def timed_steps(n: int, refill: bool) -> dict[str, float]:
        step_ms, model_ms = [], []
        for _ in range(n):
            while refill and len(engine.sequences) < args.streams:
                add(MIXED_OUTPUT)
            model_ns[0] = 0
            start = clock()
            engine.step()
            step_ms.append((clock() - start) / 1e6)
            model_ms.append(model_ns[0] / 1e6)
        host = [s - m for s, m in zip(step_ms, model_ms)]
        return {"step_ms": median(step_ms), "model_ms": median(model_ms),
                "host_ms": median(host)}

    out = {}
    for _ in range(args.streams):  # decode: every sequence past its prefill first
        add(args.steps + 8)
    while any(s.num_computed_tokens < s.num_prompt_tokens for s in engine.sequences.values()):
        engine.step()
    timed_steps(3, refill=False)  # warm-up
    out["decode"] = timed_steps(args.steps, refill=False)
    while engine.has_unfinished():
        engine.step()
    for i in range(args.streams):  # mixed: staggered ends, so requests arrive every step
        add(1 + i * MIXED_OUTPUT // args.streams)
    timed_steps(MIXED_OUTPUT, refill=True)  # into the steady state
    out["mixed"] = timed_steps(args.steps, refill=True)
    return out


def export(revision: str, into: Path) -> Path:
    """`revision`'s `latlab/` package under `into`."""
    archive = into / "latlab.tar"
    with archive.open("wb") as f:
        subprocess.run(["git", "-C", str(ROOT), "archive", revision, "latlab"], stdout=f,
                       check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into


def run_side(root: Path, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    command = [sys.executable, __file__, "--measure", "--model", args.model, "--device",
               args.device, "--dtype", args.dtype, "--threads", str(args.threads),
               "--streams", str(args.streams), "--steps", str(args.steps)]
    # the side's checkout first; what PYTHONPATH already held (a GPU machine's wheels) after
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"engine_host: the side at {root} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="main",
                        help="a git revision to compare against, or 'none'")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"))
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads; above 1 the CPU times miss the other threads")
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        sides = {"this tree": ROOT}
        if args.baseline != "none":
            sides = {args.baseline: export(args.baseline, Path(tmp)), **sides}
        rounds: dict[str, list[dict]] = {name: [] for name in sides}
        for r in range(args.rounds):
            order = list(sides) if r % 2 == 0 else list(reversed(sides))
            for name in order:
                rounds[name].append(run_side(sides[name], args))
            print(f"round {r + 1}: " + "; ".join(
                f"{name} host ms {rounds[name][-1]['decode']['host_ms']:.2f} decode, "
                f"{rounds[name][-1]['mixed']['host_ms']:.2f} mixed" for name in sides),
                flush=True)
    print(f"\n{args.model} on {args.device} ({args.dtype}, {args.threads} thread(s)), "
          f"{args.streams} streams; medians of {args.rounds} rounds' medians of "
          f"{args.steps} steps")
    print(f"{'scenario':>8} {'side':>14} {'step ms':>9} {'model ms':>9} {'host ms':>9} "
          f"{'host us/stream':>15}")
    for scenario in SCENARIOS:
        for name in sides:
            cell = {k: median(r[scenario][k] for r in rounds[name])
                    for k in ("step_ms", "model_ms", "host_ms")}
            print(f"{scenario:>8} {name[:14]:>14} {cell['step_ms']:>9.2f} "
                  f"{cell['model_ms']:>9.2f} {cell['host_ms']:>9.2f} "
                  f"{cell['host_ms'] * 1000 / args.streams:>15.1f}")


if __name__ == "__main__":
    main()
