"""Look again at a recorded `latlab ab` with the verdict rules of this checkout: its rounds,
re-analysed, looked at as `ab` would look at them now (from `--rounds` on, one look a pair,
at most `--max-rounds`), deciding on `--decide-on`. Shows, for each look, the key's interval
and verdict, and for the rounds themselves the per-round value of the key beside the host's
other work — what the spread between rounds is made of. No server runs.

With `--project`, for an A/A: how many rounds "same" would take at the spread these rounds
had (the sd of the key's per-round logs, pooled over the sides, and how much of it a pair
shared): the whole sequential procedure simulated (looks from `--rounds` on, `ab`'s
spending, families and pairs, one key decided on), the chance of "same" and the rounds
used, for several `--max-rounds`.

    python benchmarks/ab_relook.py /tmp/stall/runs-aa2/20261128-144441-ab \
        --decide-on mean_itl_max --project
"""

from __future__ import annotations

import argparse
import json
import math
from functools import partial
from pathlib import Path

import numpy as np

from latlab.analysis import analyze
from latlab.analysis.ab import Sequential
from latlab.analysis.replicates import values
from latlab.analysis.verdicts import (
    FAMILY_ALPHA,
    PAIRED_FROM,
    judge_look,
    look_share,
    paired_interval,
    ratio_interval,
)
from latlab.records.ab import AB_JSON, ABConfig
from latlab.records.folder import RunFolder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ab", type=Path, help="an ab folder (holding ab.json)")
    parser.add_argument("--decide-on", action="append", default=None, metavar="KEY")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-rounds", type=int, default=None,
                        help="default: the rounds the ab ran (its last look is final)")
    parser.add_argument("--project", action="store_true",
                        help="simulate the rounds an A/A at this spread needs for 'same'")
    parser.add_argument("--min-effect", type=float, default=0.2)
    args = parser.parse_args()
    record = json.loads((args.ab / AB_JSON).read_text())
    runs: dict[str, list] = {"A": [], "B": []}
    others: dict[str, list[float]] = {"A": [], "B": []}
    for r in sorted(record["rounds"], key=lambda r: r["round"]):
        if r["round"]:
            runs[r["side"]].append(analyze(RunFolder.open(r["run"]), diagnosis=False))
            others[r["side"]].append(r["host_other_cores"] or math.nan)
    n = min(len(runs["A"]), len(runs["B"]))
    decide_on = tuple(args.decide_on or ("mean_itl_max",))
    config = ABConfig(a=record["a"] or "A", b=record["b"] or "B", rounds=args.rounds,
                      max_rounds=args.max_rounds or n, decide_on=decide_on)
    print(f"{args.ab}: {n} rounds a side; deciding on {', '.join(decide_on)}")
    for side in "AB":
        for key in decide_on:
            per_round = [values(a).get(key, math.nan) for a in runs[side][:n]]
            logs = np.log(per_round)
            print(f"  {side} {key} by round: " + ", ".join(f"{v:.1f}" for v in per_round)
                  + f" (sd of logs {logs.std(ddof=1):.3f}); other cores "
                  + ", ".join(f"{o:.2f}" for o in others[side][:n]))
    logs = {side: np.log([values(a).get(decide_on[0], math.nan) for a in runs[side][:n]])
            for side in "AB"}
    spread = math.sqrt((logs["A"].var(ddof=1) + logs["B"].var(ddof=1)) / 2)
    own = float(np.std(logs["B"] - logs["A"], ddof=1)) / math.sqrt(2)  # a round's own part
    if args.project:
        project(spread, min(own, spread), args.rounds, args.min_effect)
    sequential = Sequential(config, config.most_rounds, decide_on)
    for i in range(args.rounds, n + 1):
        comparison = sequential.look(runs["A"][:i], runs["B"][:i])
        for key in decide_on:
            c = comparison.change(key)
            iv = c.interval
            span = (f"[{100 * iv.low:+.0f}%, {100 * iv.high:+.0f}%] at "
                    f"{100 * iv.confidence:.3g}%") if iv else "no interval"
            print(f"  look at round {i}: {c.label} {c.a:.1f} → {c.b:.1f} ms {span}: "
                  f"{c.verdict}" + (f" ({c.why})" if c.why else ""))
        if not Sequential.undecided(comparison, decide_on):
            break


def project(spread: float, own: float, first: int, min_effect: float,
            tries: int = 400) -> None:
    """The chance an A/A is called "same" within each of several --max-rounds, and the
    rounds it ran, by simulation (fixed seed): rounds `spread` apart (sd of their logs), of
    which `own` their own and the rest a drift each pair shares; looked at as `ab` looks
    (pair by pair from PAIRED_FROM pairs)."""
    rng = np.random.default_rng(0)
    shared = math.sqrt(max(spread ** 2 - own ** 2, 0.0))
    print(f"  projected A/A: rounds {spread:.3f} apart (sd of logs), {own:.3f} of it their "
          f"own and {shared:.3f} shared by a pair; minimum effect {100 * min_effect:g}%:")
    for most in (10, 15, 20, 30, 40):
        same, used = 0, []
        for _ in range(tries):
            drift = rng.normal(0, shared, most)
            a = np.exp(drift + rng.normal(0, own, most))
            b = np.exp(drift + rng.normal(0, own, most))
            previous, verdict, ran = 0, "can't tell", most
            for k in range(first, most + 1):
                share = look_share(k, previous, most)
                previous = k
                interval = paired_interval if k >= PAIRED_FROM else ratio_interval
                found = judge_look(partial(interval, a[:k], b[:k]), FAMILY_ALPHA, share,
                                   min_effect, True)
                if found.verdict != "can't tell":
                    verdict, ran = found.verdict, k
                    break
            same += verdict == "same"
            used.append(ran)
        print(f"    --max-rounds {most}: same in {100 * same / tries:.0f}% of {tries}, "
              f"{np.mean(used):.1f} rounds a side on average")


if __name__ == "__main__":
    main()
