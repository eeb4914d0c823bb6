"""Does the advice hold? One bench run with its advice tested (`bench --test-advice`), then a
real `latlab ab` of every "try first" it printed that names a setting: the start against the
start with that setting. Prints, side by side, what was predicted (or why it was not) and
what ab measured of the finding's metric and of output tokens/s, with the host's load.

    python benchmarks/advice_holds.py --users 4           # latlab serve, as `latlab bench`
    python benchmarks/advice_holds.py \
        --launch "/work/build/llama-server -m M -t 1 -c 8192 --port {port} {args}" \
        --serve-args "-np 4" --users 4 --prompt-tokens 1024 --output-tokens fixed:64
    python benchmarks/advice_holds.py ... --ruled-out     # ab the advice left out too
    python benchmarks/advice_holds.py ... --only "-b 512 -ub 512" --max-rounds 8  # just one

The advice holds when every printed suggestion ab measures makes its metric better, and
(with --ruled-out) no suggestion left out as predicted worse is measured better.
"""

from __future__ import annotations

import argparse
import os
import shlex
import time
from dataclasses import dataclass
from pathlib import Path

from latlab.analysis.advice import with_args
from latlab.analysis.findings import Finding
from latlab.commands.common import console
from latlab.load.target.launch import interrupt_on_sigterm
from latlab.records.ab import ABConfig
from latlab.records.bench import BenchConfig
from latlab.services.ab import compare_sides, run_ab
from latlab.services.bench import run_bench


@dataclass(frozen=True)
class Tried:
    """One suggestion: the finding, its arguments, printed or left out, what was said of it
    before it was measured."""

    rule: str
    metric: tuple[str, str]
    args: str
    printed: bool
    said: str


@dataclass(frozen=True)
class Measured:
    metric_a: float | None
    metric_b: float | None
    metric_verdict: str
    output_a: float | None
    output_b: float | None
    output_verdict: str
    ttft: str  # TTFT p50 A → B (verdict): the trade beside a metric of the decode
    rounds: int
    folder: str


def load() -> str:
    return "/".join(f"{v:.2f}" for v in os.getloadavg())


def suggestions(findings: list[Finding]) -> list[Tried]:
    """Every setting a finding named: those printed (still in its tries) and, from its notes,
    those left out as predicted worse or no effect."""
    out = []
    for f in findings:
        if f.metric is None:
            continue
        for advice in f.tries:
            if advice.change is None:
                continue
            said = next((n for n in f.notes if f"`{advice.change.args}`" in n), "")
            out.append(Tried(f.rule, f.metric, advice.change.args, True, said))
        for note in f.notes:
            if note.startswith("not advised:") and "`" in note:
                args = note.split("`")[1]
                out.append(Tried(f.rule, f.metric, args, False, note))
    return out


def measure(tried: Tried, start: str, bench: BenchConfig, args: argparse.Namespace) -> Measured:
    ab = ABConfig(a=start, b=with_args(start, tried.args), rounds=args.rounds,
                  max_rounds=args.max_rounds, bench=bench)
    done = run_ab(ab, console(stderr=True))
    comparison = compare_sides(done)
    key = f"{tried.metric[1]}_{tried.metric[0]}"
    metric = comparison.change(key)
    output = comparison.change("output_tokens_per_s")
    ttft = comparison.change("p50_ttft")
    return Measured(metric.a if metric else None, metric.b if metric else None,
                    metric.verdict if metric else "–", output.a if output else None,
                    output.b if output else None, output.verdict if output else "–",
                    f"{_ms(ttft.a)} → {_ms(ttft.b)} ({ttft.verdict})" if ttft else "–",
                    min(len(done.analyses[s]) for s in ("A", "B")), str(done.folder))


def holds(tried: Tried, m: Measured) -> str:
    """"yes" when a printed suggestion made its metric better (one left out: when it did
    not), "undecided" when ab could not tell, else "no"."""
    if m.metric_verdict == "can't tell":
        return "undecided"
    return "yes" if (m.metric_verdict == "better") == tried.printed else "no"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launch", help="a server command with {port} and {args}")
    parser.add_argument("--serve-args", default="", help="the start: latlab serve's "
                        "arguments, or the --launch command's {args}")
    parser.add_argument("--users", type=int, default=4)
    parser.add_argument("--prompt-tokens", help="default: bench's")
    parser.add_argument("--output-tokens", help="default: bench's")
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-rounds", type=int, default=3)
    parser.add_argument("--ruled-out", action="store_true",
                        help="also ab the suggestions left out as predicted worse")
    parser.add_argument("--only", metavar="ARGS",
                        help="ab only the suggestion with these arguments (e.g. \"-b 512 "
                             "-ub 512\"): one left undecided, measured with more rounds")
    parser.add_argument("--out", type=Path, default=Path("runs"))
    args = parser.parse_args()
    interrupt_on_sigterm()
    started, load_before = time.monotonic(), load()
    workload = {k: v for k, v in (("prompt_tokens", args.prompt_tokens),
                                  ("output_tokens", args.output_tokens)) if v is not None}
    bench = BenchConfig.model_validate({
        "serve_args": args.serve_args, "launch": args.launch, "duration_s": args.duration,
        "out": args.out, "arrivals": {"users": args.users}, "workload": workload})
    result = run_bench(bench.model_copy(update={"name": "advice"}), console=console(stderr=True),
                       test_advice=True)
    if result.analysis is None:
        raise SystemExit(f"the run could not be analysed: {result.message}")
    tried = [t for t in suggestions(result.analysis.findings) if t.printed or args.ruled_out]
    if args.only is not None:
        named = [t for t in suggestions(result.analysis.findings) if t.args == args.only]
        if not named:
            raise SystemExit(f"--only {args.only}: not among this run's suggestions ("
                             + ", ".join(t.args for t in tried) + ")")
        tried = named[:1]
    start = shlex.join(bench.serve_args)
    print(f"start: {start or '(defaults)'}; run {result.run.path}; load {load_before}")
    for f in result.analysis.findings:
        print(f"finding {f.rule}: try first: {f.fix}")
    if not tried:
        print("no suggestion named a setting: nothing to measure")
    rows = []
    for t in tried:
        m = measure(t, start, bench, args)
        rows.append((t, m))
        name = f"{t.metric[0].upper()} {t.metric[1]}"
        print(f"\n{t.rule}: {t.args} ({'printed' if t.printed else 'left out'})")
        print(f"  said:     {t.said or '(nothing)'}")
        print(f"  measured: {name} {_ms(m.metric_a)} → {_ms(m.metric_b)} ({m.metric_verdict}); "
              f"output tok/s {_n(m.output_a)} → {_n(m.output_b)} ({m.output_verdict}); "
              f"TTFT p50 {m.ttft}; {m.rounds} rounds a side; {m.folder}")
        print(f"  holds:    {holds(t, m)}; load {load()}")
    told = [holds(t, m) for t, m in rows]
    print(f"\n{told.count('yes')} of {len(rows)} hold, {told.count('undecided')} undecided "
          f"(ab could not tell), {told.count('no')} do not; {time.monotonic() - started:.0f} s; "
          f"load {load_before} before, {load()} after")


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:,.1f} ms"


def _n(value: float | None) -> str:
    return "–" if value is None else f"{value:,.1f}"


if __name__ == "__main__":
    main()
