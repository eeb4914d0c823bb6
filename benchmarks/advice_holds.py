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

    python benchmarks/advice_holds.py ... --aa           # the start against itself

Each ab runs rounds until the finding's metric is decided (`--decide-on`, as the advice's
printed command does); ITL p99 is shown beside a decode metric. The advice holds when every
printed suggestion ab measures makes its metric better, and (with --ruled-out) no suggestion
left out as predicted worse is measured better. An A/A (`--aa`: no advice run, the start
against the start, decided on the stall finding's metric unless --aa names another) holds
when it is "same", and fails when it is "better" or "worse".
"""

from __future__ import annotations

import argparse
import os
import shlex
import time
from dataclasses import dataclass
from pathlib import Path

from latlab.analysis.advice import with_args
from latlab.analysis.compare import Change
from latlab.analysis.findings import Finding
from latlab.analysis.rules.compute import STALL_METRIC
from latlab.commands.common import console
from latlab.load.target.interrupts import interrupt_on_sigterm
from latlab.records.ab import ABConfig
from latlab.records.bench import BenchConfig
from latlab.records.catalog import statistic_label
from latlab.records.verdict import key_of
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
    decided_at: int | None  # the rounds a side when the metric's verdict came
    itl_p99: str  # ITL p99 A → B (verdict): what the stall finding was judged by before
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


def measure(metric: tuple[str, str], start: str, b: str, bench: BenchConfig,
            args: argparse.Namespace) -> Measured:
    """ab of `start` against `b`, rounds until `metric` is decided (or --max-rounds)."""
    key = key_of(*metric)
    ab = ABConfig(a=start, b=b, rounds=args.rounds, max_rounds=args.max_rounds, bench=bench,
                  decide_on=(key,))
    done = run_ab(ab, console(stderr=True))
    comparison = compare_sides(done)
    found = comparison.change(key)
    output = comparison.change("output_tokens_per_s")
    return Measured(found.a if found else None, found.b if found else None,
                    found.verdict if found else "–", done.sequential.decided_at(key),
                    _change(comparison.change("p99_itl")), output.a if output else None,
                    output.b if output else None, output.verdict if output else "–",
                    _change(comparison.change("p50_ttft")),
                    min(len(done.analyses[s]) for s in ("A", "B")), str(done.folder))


def _change(c: Change | None) -> str:
    return f"{_ms(c.a)} → {_ms(c.b)} ({c.verdict})" if c else "–"


def said(metric: tuple[str, str], m: Measured) -> str:
    """What ab measured, in one line."""
    decided = f", decided after {m.decided_at} rounds" if m.decided_at else ""
    return (f"{statistic_label(*metric)} {_ms(m.metric_a)} → {_ms(m.metric_b)} "
            f"({m.metric_verdict}{decided}); ITL p99 {m.itl_p99}; output tok/s "
            f"{_n(m.output_a)} → {_n(m.output_b)} ({m.output_verdict}); TTFT p50 {m.ttft}; "
            f"{m.rounds} rounds a side; {m.folder}")


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
    parser.add_argument("--aa", nargs="?", const=key_of(*STALL_METRIC), metavar="KEY",
                        help="no advice run: ab the start against itself, decided on KEY "
                             f"(default {key_of(*STALL_METRIC)})")
    parser.add_argument("--out", type=Path, default=Path("runs"))
    args = parser.parse_args()
    interrupt_on_sigterm()
    started, load_before = time.monotonic(), load()
    workload = {k: v for k, v in (("prompt_tokens", args.prompt_tokens),
                                  ("output_tokens", args.output_tokens)) if v is not None}
    bench = BenchConfig.model_validate({
        "serve_args": args.serve_args, "launch": args.launch, "duration_s": args.duration,
        "out": args.out, "arrivals": {"users": args.users}, "workload": workload})
    if args.aa is not None:
        aa(bench, args, started, load_before)
        return
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
        m = measure(t.metric, start, with_args(start, t.args), bench, args)
        rows.append((t, m))
        print(f"\n{t.rule}: {t.args} ({'printed' if t.printed else 'left out'})")
        print(f"  said:     {t.said or '(nothing)'}")
        print(f"  measured: {said(t.metric, m)}")
        print(f"  holds:    {holds(t, m)}; load {load()}")
    told = [holds(t, m) for t, m in rows]
    print(f"\n{told.count('yes')} of {len(rows)} hold, {told.count('undecided')} undecided "
          f"(ab could not tell), {told.count('no')} do not; {time.monotonic() - started:.0f} s; "
          f"load {load_before} before, {load()} after")


def aa(bench: BenchConfig, args: argparse.Namespace, started: float, load_before: str
       ) -> None:
    """The start against itself: "same" holds, "better" or "worse" is noise taken for a
    change."""
    stat, _, metric = args.aa.partition("_")
    start = shlex.join(bench.serve_args)
    print(f"A/A: {start or '(defaults)'} against itself; load {load_before}")
    m = measure((metric, stat), start, start, bench, args)
    told = ("yes" if m.metric_verdict == "same" else
            "no" if m.metric_verdict in ("better", "worse") else "undecided")
    print(f"  measured: {said((metric, stat), m)}")
    print(f"  holds:    {told}; {time.monotonic() - started:.0f} s; load {load_before} before, "
          f"{load()} after")


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:,.1f} ms"


def _n(value: float | None) -> str:
    return "–" if value is None else f"{value:,.1f}"


if __name__ == "__main__":
    main()
