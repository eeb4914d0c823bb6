"""How far to trust `latlab predict` on latlab's own engine: calibrate it, measure held-out
points at 25–90% of its capacity, predict each from its settings alone (with intervals), and
count the measured percentiles inside the predicted intervals.

    python benchmarks/predict_accuracy.py                     # about 20 minutes
    python benchmarks/predict_accuracy.py --measured runs/…-sweep-accuracy   # predict again

1. Calibrate the default engine as `latlab calibrate` does (or reuse --calibration).
2. Against one latlab serve, measure its capacity — the achieved rate of a closed loop of 64
   users — then Poisson points at --fractions of it (bench's default mixed lengths: prompts
   lognormal 256 ± 128, outputs 64 ± 32), --duration each. The machine is shared: each
   point waits (at most --patience s) for the other processes to use under --quiet cores,
   and records their CPU, the load average, and the calibration's reference steps timed in
   this process before and after (the machine's speed as a multiple of calibration's).
3. Predict every point as `latlab predict --check` does (its settings, not its requests;
   --draws worlds) and print measured against predicted with the intervals, the coverage,
   the widths below 70% of capacity, the SLO-max (--slo, default: the p99 E2E measured near
   55% of capacity) measured and predicted, and the replicas that goal needs at
   --fleet-rate (default 2.5 × capacity) measured (`predict_trust.py` says how) and
   predicted; then the coverage again as the machine probe would have had it (`latlab
   predict --on-drift rescale` just before each point).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from predict_trust import (
    Background,
    checked,
    evaluate,
    load_average,
    middle_slo,
    print_rows,
    print_verdict,
)

from latlab.commands.common import console
from latlab.load.target.interrupts import interrupt_on_sigterm
from latlab.load.target.launch import ServerLaunch, start_server
from latlab.records.arrivals import ArrivalConfig
from latlab.records.bench import BenchConfig
from latlab.records.engine import EngineConfig
from latlab.records.folder import RunFolder
from latlab.records.slo import parse_slo
from latlab.services.bench import run_bench
from latlab.services.calibrate import calibrate_engine
from latlab.services.predict_intervals import Intervals
from latlab.sim import calibration as calibrations
from latlab.sim.calibrate_engine import time_reference

PROBE_USERS = 64


def measure(args, err, cal, background: Background) -> Path:
    """The capacity probe and the measured points against one latlab serve, each started
    when the machine is quiet (or after --patience), with what else ran meanwhile."""
    from latlab.engine.engine import LLMEngine

    reference = LLMEngine(EngineConfig(warmup=False))
    then = sum(cal.reference.ms) if cal.reference else float("nan")
    folder = RunFolder.create(Path(args.out), "sweep-accuracy").path
    engine = start_server(ServerLaunch.embedded(["--step-log", str(folder / "steps.jsonl")]),
                          log_path=folder / "engine.log")
    points = []
    try:
        def point(arrivals: ArrivalConfig, name: str) -> dict:
            background.wait_quiet(err, args.quiet, args.patience)
            before, load = sum(time_reference(reference)) / then, load_average()
            started = time.monotonic()
            result = run_bench(BenchConfig(url=engine.url, arrivals=arrivals,
                                           duration_s=args.duration, warmup_s=5.0,
                                           cooldown_s=2.0, out=folder, name=name), console=err)
            return {"run": str(result.run.path), "other_cores":
                    background.mean(started, time.monotonic()), "load_average":
                    [load, load_average()], "speed": [before,
                                                       sum(time_reference(reference)) / then],
                    "achieved": result.summary.throughput.achieved_rate}

        probe = point(ArrivalConfig(process="closed", users=PROBE_USERS), "capacity")
        top = args.capacity or probe["achieved"]
        err.print(f"measured capacity {top:.2f} req/s")
        for fraction in args.fractions:
            rate = round(fraction * top, 2)
            points.append(point(ArrivalConfig(process="poisson", rate=rate), f"rate-{rate:g}")
                          | {"fraction": fraction, "rate": rate})
    finally:
        engine.stop()
    (folder / "measured.json").write_text(json.dumps({"capacity": top, "probe": probe,
                                                      "points": points}, indent=2))
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=90.0, help="seconds per point")
    parser.add_argument("--fractions", default="0.25,0.4,0.55,0.7,0.8,0.9")
    parser.add_argument("--capacity", type=float,
                        help="req/s the fractions are of (default: the measured probe's)")
    parser.add_argument("--slo", help="e.g. e2e=2500ms (default: the p99 E2E measured at the "
                        "point nearest 55%% of capacity, to the 100 ms: an SLO-max inside the "
                        "points)")
    parser.add_argument("--fleet-rate", type=float, help="req/s the replicas are sized for "
                        "(default: 2.5 × the measured capacity)")
    parser.add_argument("--draws", type=int, default=20)
    parser.add_argument("--measured", help="a sweep folder of an earlier run: predict only")
    parser.add_argument("--calibration", type=Path, help="reuse a calibration file")
    parser.add_argument("--out", default="runs")
    parser.add_argument("--json", type=Path, help="write the numbers here")
    parser.add_argument("--quiet", type=float, default=0.3,
                        help="start a point when other processes used under this many cores")
    parser.add_argument("--patience", type=float, default=120.0,
                        help="seconds to wait for a quiet machine before each point")
    args = parser.parse_args()
    interrupt_on_sigterm()  # SIGTERM stops the servers this script started, as Ctrl-C does
    args.fractions = [float(f) for f in args.fractions.split(",")]
    err = console(stderr=True)
    background = Background()
    if args.calibration:
        cal = calibrations.load(args.calibration)
    else:
        background.wait_quiet(err, args.quiet, args.patience)
        print(f"calibrating: load average {load_average():.2f}")
        cal = calibrate_engine(EngineConfig(), [], err)
        args.calibration = Path(args.out) / "accuracy-calibration.json"
        calibrations.save(cal, args.calibration)
    print(f"calibration {args.calibration}: {cal.headline()}")
    print(f"  spread: {cal.spread.describe() if cal.spread else 'none'}")
    for note in cal.notes:
        print(f"  {note}")
    folder = Path(args.measured) if args.measured else measure(args, err, cal, background)
    measured = json.loads((folder / "measured.json").read_text())
    print(f"\ncapacity {measured['capacity']:.2f} req/s; per point: other processes' CPU "
          "(cores), load average before/after, the machine's speed before/after (the "
          "calibration's reference steps, × the time they took at calibration):")
    for p in [measured["probe"], *measured["points"]]:
        print(f"  {Path(p['run']).name}: {p['other_cores']:.2f} cores, load "
              + "/".join(f"{x:.2f}" for x in p["load_average"]) + ", speed "
              + "/".join(f"{x:.2f}" for x in p["speed"]))
    slos = dict([parse_slo(args.slo)]) if args.slo else middle_slo(measured["points"])
    print(f"SLO: {slos}")
    intervals = Intervals(draws=args.draws)
    started = time.perf_counter()
    result = evaluate(cal, measured["points"], slos, args.fleet_rate or
                      2.5 * measured["capacity"], intervals, Path(args.out))
    print(f"(predicted in {time.perf_counter() - started:.0f} s, load average "
          f"{load_average():.2f})")
    print_verdict(result, intervals)
    print("\nwith the machine probe (as `latlab predict --on-drift rescale` just before each "
          "point: the step costs scaled by the machine's speed then, where beyond the spread):")
    probed = checked(cal, measured["points"], intervals, probed=True)
    print_rows(probed, intervals)
    if args.json:
        args.json.write_text(json.dumps({"calibration": cal.headline(), "measured": measured,
                                         "probed": probed} | result, indent=2, default=str))


if __name__ == "__main__":
    sys.exit(main())
