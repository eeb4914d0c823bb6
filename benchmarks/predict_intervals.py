"""Whether `latlab predict`'s intervals decide anything: calibrate latlab's engine, measure
held-out runs of one latlab serve (CPU) at three shares of its measured capacity, and check
each against the intervals of two versions of latlab side by side (`latlab predict --check
RUN --calibration CAL`, each version with the calibration it makes itself, both before the
runs): this checkout's, and `--baseline-src`'s (a source tree of an older latlab, e.g. `git
archive` of main before the change).

    python benchmarks/predict_intervals.py --baseline-src /tmp/latlab-before   # ≤ 10 min
    python benchmarks/predict_intervals.py --measured runs/…-intervals --calibration C \
        --baseline-src /tmp/latlab-before                        # check again, no load
    python benchmarks/predict_intervals.py --measured runs/…-intervals \
        --recalibrate runs/calibration-samples     # this checkout's fit of the same timings

Per run, metric and percentile (TTFT, TPOT, E2E at p50, p90, p99): measured, each version's
interval, its width (hi/lo) and whether the measurement falls inside. Then per version: the
coverage (goal ≥ 85%), the intervals that end at ∞, and those at most 1.5× wide below 70% of
capacity. The runs are held out: the calibration (made first, or given) never saw them. Runs
of the same rate and seed (several invocations with `--repeats 1 --first-seed S`) are
identical but for the machine: how far they differ is the bar no interval narrower than it
can cover (`identical`). `--fractions ''` measures the capacity alone.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from intervals_calibration import baseline_calibration, keeping_samples, recalibrated
from intervals_runs import load_average, measure, served_levels
from intervals_scoring import ROOT, cell, checked, identical, verdict
from intervals_spread import level_variants, parts, probed

from latlab.commands.common import console
from latlab.load.target.interrupts import interrupt_on_sigterm
from latlab.records.engine import EngineConfig
from latlab.services.calibrate import calibrate_engine
from latlab.sim import calibration as calibrations


def options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-src", type=Path, help="an older latlab's source tree")
    parser.add_argument("--fractions", default="0.3,0.5,0.7",
                        help="shares of the capacity to run at ('': measure the capacity only)")
    parser.add_argument("--repeats", type=int, default=2, help="runs at each load")
    parser.add_argument("--duration", type=float, default=40.0, help="seconds a run")
    parser.add_argument("--requests", type=int,
                        help="at least this many requests a run (its duration from the rate)")
    parser.add_argument("--capacity", type=float,
                        help="req/s measured before (skips the capacity probe: runs split over "
                             "several locked invocations share their rates)")
    parser.add_argument("--first-seed", type=int, default=0, help="the first run's seed")
    parser.add_argument("--draws", type=int, default=20)
    parser.add_argument("--calibration", type=Path, help="reuse a calibration file")
    parser.add_argument("--baseline-calibration", type=Path,
                        help="the baseline's calibration file (default: --calibration, else "
                             "the baseline calibrates too, before the runs)")
    parser.add_argument("--measured", type=Path, action="append",
                        help="a folder of an earlier run: check only (again: their runs "
                             "together)")
    parser.add_argument("--out", default="runs")
    parser.add_argument("--json", type=Path, help="write the numbers here")
    parser.add_argument("--recalibrate", type=Path, metavar="SAMPLES",
                        help="instead of --calibration: fit the samples an earlier run kept "
                             "(its calibration-samples folder) with this checkout")
    parser.add_argument("--measure-only", action="store_true",
                        help="calibrate and measure, then stop: check later with --measured "
                             "(outside a benchmark lock: the checks time nothing)")
    parser.add_argument("--levels", action="store_true",
                        help="also the level known or probed (level_variants)")
    parser.add_argument("--parts", action="store_true",
                        help="also the width with each part of the spread turned off")
    return parser.parse_args()


def main() -> None:
    args = options()
    interrupt_on_sigterm()  # SIGTERM stops the server this script started, as Ctrl-C does
    args.fractions = [float(f) for f in args.fractions.split(",") if f]  # none: capacity
    err = console(stderr=True)
    print(f"load average {load_average()} at the start")
    if args.recalibrate:
        args.calibration = recalibrated(args.recalibrate, Path(args.out))
    if args.calibration:
        cal = calibrations.load(args.calibration)
    else:
        keeping_samples(Path(args.out) / "calibration-samples")
        started = time.perf_counter()
        cal = calibrate_engine(EngineConfig(), [], err)
        args.calibration = calibrations.save(cal, Path(args.out) / "intervals-calibration.json")
        print(f"calibrated in {time.perf_counter() - started:.0f} s")
    print(f"calibration {args.calibration}: {cal.headline()}")
    print(f"  spread: {cal.spread.describe() if cal.spread else 'none'}")
    args.calibration = args.calibration.resolve()  # each version checks in its own tree
    if args.baseline_src and not args.baseline_calibration:
        args.baseline_calibration = (args.calibration if args.measured else
                                     baseline_calibration(args.baseline_src, Path(args.out)))
    if args.baseline_calibration:
        args.baseline_calibration = args.baseline_calibration.resolve()
    folders = args.measured or [measure(args, cal, err)]
    if args.measure_only:
        print(f"measured: {folders[0]}; check with --measured {folders[0]} --calibration "
              f"{args.calibration}" + (f" --baseline-calibration {args.baseline_calibration}"
                                       if args.baseline_src else ""))
        return
    each = [json.loads((f / "measured.json").read_text()) for f in folders]
    for f, m in zip(folders, each):  # absolute: the checks run in each version's own tree
        m["runs"] = [r | {"run": str((f / Path(r["run"]).name).resolve())} for r in m["runs"]]
    measured = {"capacity": each[0]["capacity"], "runs": [r for m in each for r in m["runs"]]}
    runs = measured["runs"]
    print(f"measured capacity {measured['capacity']:.2f} req/s; runs (achieved, load average "
          "before/after):")
    for r in runs:
        print(f"  {Path(r['run']).name}: {r['fraction']:.0%}, achieved {r['achieved']:.2f} "
              f"req/s, load {' → '.join(r['load_average'])}")
    for name, calibration in (("this version", args.calibration),
                              ("the baseline", args.baseline_calibration)):
        levels = [v for f, m in zip(folders, each)
                  for v in (served_levels(f, m["runs"], calibration) or [])
                  ] if calibration else None
        if levels:
            print(f"the runs' served steps against {name}'s calibration (log(served / "
                  "charged), mean): " + ", ".join(f"{v:+.2f}" for v in levels))
    versions = {"new": (ROOT, args.calibration)} | (
        {"old": (args.baseline_src, args.baseline_calibration)} if args.baseline_src else {})
    checks, took = {}, {}
    for name, (src, calibration) in versions.items():
        checks[name], took[name] = checked(src, runs, calibration, args.draws)
        print(f"{name} ({src}): checked in {took[name]:.0f} s, load average {load_average()}")
    if all("reference_ms" in r for r in runs):  # what the machine probe would have done
        for name, (src, calibration) in list(versions.items()):
            print(f"{name} with the machine probe before each run (--on-drift rescale):")
            # the baseline's --on-drift rescale acted beyond the spread only
            checks[f"{name}+probe"] = probed(src, runs, calibration, args.draws,
                                             Path(args.out).resolve() / "probed", name == "old")
            versions[f"{name}+probe"] = versions[name]
    names = list(versions)[::-1]
    print_table(runs, checks, names, args.repeats)
    print()
    result = {name: verdict(name, checks[name], runs) for name in names}
    same = identical(runs)
    split = parts(runs, args.calibration, args.draws, Path(args.out)) if args.parts else None
    levels = None
    if args.levels:
        served = [v for f, m in zip(folders, each)
                  for v in served_levels(f, m["runs"], args.calibration, total=True)]
        levels = level_variants([r | {"served_level": v} for r, v in zip(runs, served)],
                                args.calibration, args.draws, Path(args.out) / "levels")
    if args.json:
        args.json.write_text(json.dumps({"calibration": cal.headline(), "measured": measured,
                                         "verdict": result, "seconds": took, "parts": split,
                                         "levels": levels, "identical": same},
                                        indent=2))


def print_table(runs: list[dict], checks: dict, names: list[str], repeats: int) -> None:
    """Per run, metric and percentile: measured, and each version's interval."""
    print(f"\n{'load':>4} {'run':>3} {'metric':<9} {'measured':>8}  "
          + "  ".join(f"{n + ': interval, hi/lo':<28}" for n in names))
    for i, r in enumerate(runs):
        for key in [k for k in checks["new"] if k[0] == r["run"]]:
            c = checks["new"][key]
            print(f"{r['fraction']:>4.0%} {i % repeats + 1:>3} "
                  f"{key[1] + ' ' + key[2]:<9} {c['measured']:>8.0f}  "
                  + "  ".join(f"{cell(checks[n].get(key)):<28}" for n in names))


if __name__ == "__main__":
    sys.exit(main())
