"""How accurate `latlab predict` is on latlab's own engine: calibrate it, measure a sweep of
it, predict the same sweep, and compare — in one script.

    python benchmarks/predict_accuracy.py                     # about 15 minutes
    python benchmarks/predict_accuracy.py --measured runs/…-sweep-accuracy   # predict again

1. Calibrate the default engine as `latlab calibrate` does (steps timed in process over a
   grid, then probes through latlab serve for the per-request costs and serving overhead).
2. Measure its capacity: the achieved rate of a closed loop of 64 users (latlab sweep's
   saturation probe), and measure a sweep at --fractions of it (Poisson arrivals, bench's
   default mixed lengths: prompts lognormal 256 ± 128, outputs 64 ± 32), --duration each.
3. Predict every point two ways: *replay* (the point's own requests — its scheduled times,
   prompt and output lengths — on the calibrated server) and *fresh* (`latlab predict` at the
   point's rate, --predict-requests requests: the long-run distribution, independent of the
   measured sample); and the capacity (the probe replayed).
4. Print per point the measured and predicted p50 and p99 of TTFT, TPOT and E2E with the
   errors, and the SLO-max (--slo) of the measured sweep and of both predicted sweeps.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

import numpy as np

from latlab.analysis import analyze, capacity
from latlab.analysis.slo_max import slo_max
from latlab.commands.bench import run_bench
from latlab.commands.calibrate import calibrate_engine
from latlab.commands.common import console
from latlab.commands.predicting import predict_point, settings
from latlab.commands.sweep_points import SweepConfig, run_sweep
from latlab.records.config import BenchConfig, parse_slo
from latlab.records.folder import RunFolder, read_json
from latlab.records.simulation import Fleet
from latlab.records.sweep import SWEEP_JSON, SweepRecord
from latlab.records.workload import ArrivalConfig, WorkloadConfig
from latlab.sim import calibration as calibrations
from latlab.sim.validate import METRICS, QUANTILES, compare
from latlab.sim.workload import build, replay

PROBE_USERS = 64


def measure(args, err) -> tuple[Path, float, Path]:
    """The capacity probe and the measured sweep (folders), and the capacity (req/s)."""
    out = Path(args.out)
    probe = run_bench(BenchConfig(arrivals=ArrivalConfig(process="closed", users=PROBE_USERS),
                                  duration_s=args.duration, warmup_s=5.0, cooldown_s=2.0,
                                  out=out, name="accuracy-capacity"), console=err)
    top = probe.summary.throughput.achieved_rate
    rates = [round(f * top, 2) for f in args.fractions]
    err.print(f"measured capacity {top:.2f} req/s; sweeping {rates}")
    base = BenchConfig(duration_s=args.duration, warmup_s=5.0, cooldown_s=2.0, out=out,
                       name="accuracy", slos=args.slos)
    sweep = run_sweep(SweepConfig(base=base, rates=rates, max_error_rate=1.0), console=err)
    return probe.run.path, top, sweep.path


def predicted_sweep(cal, points, how: str, args, tmp: Path):
    """Predicted points at the measured points' rates: `replay` or `fresh`."""
    out = []
    for p in points:
        run = RunFolder(Path(p.run))
        bench = run.read_config().bench.model_copy(update={"out": tmp, "slos": args.slos})
        if how == "replay":  # the same requests, the same measurement window
            workload = replay(run)
        else:
            bench = bench.model_copy(update={"requests": args.predict_requests,
                                             "duration_s": None, "warmup_s": 0.0,
                                             "cooldown_s": 0.0})
            workload = build(WorkloadConfig(), bench.arrivals, args.predict_requests, None)
        predicted = predict_point(cal, workload, Fleet(), settings(bench, cal, "bench", Fleet()),
                                  tmp, f"{how}-{p.label}", explain=False)
        analysis = analyze(predicted.run)
        out.append(capacity.measure(analysis, p.label, p.mode, p.load, args.slos, 99.0))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=90.0, help="seconds per point")
    parser.add_argument("--fractions", default="0.25,0.4,0.55,0.7,0.8,0.9")
    parser.add_argument("--slo", action="append", default=[], help="e.g. e2e=2500ms")
    parser.add_argument("--predict-requests", type=int, default=20_000)
    parser.add_argument("--measured", help="a sweep folder of an earlier run: predict only")
    parser.add_argument("--calibration", type=Path, help="reuse a calibration file")
    parser.add_argument("--out", default="runs")
    parser.add_argument("--json", type=Path, help="write the numbers here")
    args = parser.parse_args()
    args.fractions = [float(f) for f in args.fractions.split(",")]
    args.slos = dict(parse_slo(s) for s in (args.slo or ["e2e=2500ms"]))
    err = console(stderr=True)
    if args.calibration:
        cal = calibrations.load(args.calibration)
    else:
        cal = calibrate_engine([], err)
        calibrations.save(cal, Path(args.out) / "accuracy-calibration.json")
    print(f"calibration: {cal.headline()}")
    for note in cal.notes:
        print(f"  {note}")
    if args.measured:
        folder = Path(args.measured)
        probe_path = Path(json.loads((folder / "probe.txt").read_text())["probe"])
    else:
        probe_path, _, folder = measure(args, err)
        (folder / "probe.txt").write_text(json.dumps({"probe": str(probe_path)}))
    record = read_json(folder / SWEEP_JSON, SweepRecord)
    points = capacity.curve(record.points)
    probe_check = compare(cal, RunFolder(probe_path))
    measured_top = RunFolder(probe_path).read_summary().throughput.achieved_rate
    print(f"\ncapacity probe ({PROBE_USERS} users, closed loop), replayed: {probe_check.line()}")
    report(cal, points, record, measured_top, probe_path, args)


def report(cal, points, record, measured_top, probe_path, args) -> None:
    rows, numbers = [], []
    with tempfile.TemporaryDirectory() as tmp:
        replayed = predicted_sweep(cal, points, "replay", args, Path(tmp))
        fresh = predicted_sweep(cal, points, "fresh", args, Path(tmp))
        comparisons = [compare(cal, RunFolder(Path(p.run))) for p in points]
    print(f"\n{'point':<12} {'n':>4}  " + "  ".join(f"{m} p{q:g} meas→pred (err)".ljust(27)
                                                   for m in METRICS for q in QUANTILES))
    for p, c, f in zip(points, comparisons, fresh):
        cells = [f"{c.measured[m][q]:>7.0f}→{c.predicted[m][q]:<7.0f}({100 * c.error(m, q):+5.1f}%)"
                 .ljust(27) for m in METRICS for q in QUANTILES]
        print(f"{p.label:<12} {c.requests:>4}  " + "  ".join(cells))
        fresh_lat = f.latencies
        numbers.append({"point": p.label, "requests": c.requests, "measured": c.measured,
                        "replay": c.predicted,
                        "fresh": {m: {q: fresh_lat[m][f"p{q:g}"] for q in QUANTILES}
                                  for m in METRICS}})
    print("\nfresh predictions (the long-run distribution at the point's rate), error against "
          "the measured point:")
    for n in numbers:
        cells = []
        for m in METRICS:
            for q in QUANTILES:
                meas, pred = n["measured"][m][q], n["fresh"][m][q]
                cells.append(f"{m} p{q:g} {100 * (pred - meas) / meas:+5.1f}%")
        print(f"  {n['point']:<12} " + ", ".join(cells))
    errs = {how: {f"p{q:g}": [abs((n[how][m][q] - n["measured"][m][q]) / n["measured"][m][q])
                             for n in numbers for m in METRICS] for q in QUANTILES}
            for how in ("replay", "fresh")}
    for how, by_q in errs.items():
        print(f"{how}: mean |error| " + ", ".join(f"{q} {100 * np.mean(v):.1f}% (max "
                                                    f"{100 * np.max(v):.1f}%)"
                                                    for q, v in by_q.items()))
    answers = {"measured": record.slo_max, "replay": slo_max(replayed, args.slos, 99.0),
               "fresh": slo_max(fresh, args.slos, 99.0)}
    for how, best in answers.items():
        load = best.load if best else None
        print(f"SLO-max {how}: {load if load is None else round(load, 2)} req/s — "
              f"{best.statement if best else 'no SLO'}")
    m = answers["measured"].load if answers["measured"] else None
    for how in ("replay", "fresh"):
        p = answers[how].load if answers[how] else None
        if m and p:
            print(f"SLO-max error ({how}): {100 * (p - m) / m:+.1f}%")
    if args.json:
        args.json.write_text(json.dumps({"calibration": cal.headline(), "points": numbers,
                                         "slo_max": {k: (v.load if v else None)
                                                     for k, v in answers.items()},
                                         "capacity": measured_top}, indent=2, default=str))


if __name__ == "__main__":
    sys.exit(main())
