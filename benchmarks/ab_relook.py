"""Look again at a recorded `latlab ab` with the verdict rules of this checkout: its rounds,
re-analysed, looked at as `ab` would look at them now (from `--rounds` on, one look a pair,
at most `--max-rounds`), deciding on `--decide-on`. Shows, for each look, the key's interval
and verdict, and for the rounds themselves the per-round value of the key beside the host's
other work — what the spread between rounds is made of. No server runs.

    python benchmarks/ab_relook.py /tmp/stall/runs-aa2/20261128-144441-ab \
        --decide-on mean_itl_max
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from latlab.analysis import analyze
from latlab.analysis.ab import Sequential
from latlab.analysis.replicates import values
from latlab.records.ab import AB_JSON, ABConfig
from latlab.records.folder import RunFolder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ab", type=Path, help="an ab folder (holding ab.json)")
    parser.add_argument("--decide-on", action="append", default=None, metavar="KEY")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-rounds", type=int, default=None,
                        help="default: the rounds the ab ran (its last look is final)")
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


if __name__ == "__main__":
    main()
