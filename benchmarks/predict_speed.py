"""How fast `latlab predict` simulates: requests per second of wall time, on one core.

    python benchmarks/predict_speed.py                    # 1M requests at 50% of capacity
    python benchmarks/predict_speed.py --requests 200000 --loads 0.25,0.5,0.9
    python benchmarks/predict_speed.py --profile          # where the time goes (cProfile)
    python benchmarks/predict_speed.py --requests 10000 --draws 20   # what intervals cost

The process pins itself to one CPU; on a shared machine the wall time (simulate s) includes
the other processes' turns on that core, the CPU time (CPU s) is the simulation's own. The
calibration is latlab's default engine's (the cached
one `latlab predict` uses, or --calibration FILE); its capacity is found by simulating a
closed loop of 64 users. Each load then simulates `--requests` Poisson arrivals of bench's
default workload (prompts lognormal 256 ± 128, outputs 64 ± 32) — the simulation alone
(workload built before the clock starts, then `simulate`), and separately the time to write
the predicted run folder (records, summary) for the first load. With --draws, the first
load's intervals are timed too: that many more simulations of at most --draw-requests
requests (the worlds `latlab predict --draws` draws), each summarized.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import tempfile
import time
from pathlib import Path

from latlab.records.arrivals import ArrivalConfig
from latlab.records.bench import BenchConfig
from latlab.records.simulation import Fleet
from latlab.records.workload import WorkloadConfig
from latlab.sim import calibration as calibrations
from latlab.sim.fleet import simulate
from latlab.sim.workload import build


def capacity(cal) -> float:
    probe = build(WorkloadConfig(), ArrivalConfig(process="closed", users=64), 5000, None)
    result = simulate(probe, cal)
    c = result.columns
    return len(result) / (c.done.max() - c.sent.min())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--loads", default="0.5", help="fractions of capacity")
    parser.add_argument("--calibration", type=Path)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--profile-lines", type=int, default=12, help="functions to list")
    parser.add_argument("--folder", action="store_true",
                        help="also time writing the predicted run folder")
    parser.add_argument("--draws", type=int, default=0, help="also time this many draws")
    parser.add_argument("--draw-requests", type=int, default=20_000)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    path = args.calibration or calibrations.cache_path([])
    if not path.is_file():
        raise SystemExit(f"no calibration at {path}: run `latlab calibrate` first")
    cal = calibrations.load(path)
    top = capacity(cal)
    print(f"calibration: {cal.headline()}")
    print(f"capacity (simulated closed loop of 64 users): {top:.2f} req/s; one core "
          f"(pid {os.getpid()} pinned)")
    print(f"{'load':>6} {'req/s':>7} {'requests':>9} {'workload s':>10} {'simulate s':>10} "
          f"{'CPU s':>7} {'k req/s':>8} {'steps':>10} {'in runs':>8} {'µs/req':>7}")
    for fraction in (float(x) for x in args.loads.split(",")):
        rate = fraction * top
        started = time.perf_counter()
        workload = build(WorkloadConfig(), ArrivalConfig(process="poisson", rate=rate),
                         args.requests, None)
        built = time.perf_counter() - started
        profile = cProfile.Profile() if args.profile else None
        started, cpu = time.perf_counter(), time.process_time()
        if profile:
            profile.enable()
        result = simulate(workload, cal, Fleet())
        if profile:
            profile.disable()
        took, cpu = time.perf_counter() - started, time.process_time() - cpu
        print(f"{fraction:>6.0%} {rate:>7.2f} {len(result):>9} {built:>10.2f} {took:>10.2f} "
              f"{cpu:>7.2f} "
              f"{len(result) / took / 1e3:>8.1f} {result.steps:>10} "
              f"{result.decode_run_steps / result.steps:>8.1%} {took / len(result) * 1e6:>7.1f}")
        if profile:
            pstats.Stats(profile).sort_stats("tottime").print_stats(args.profile_lines)
        if args.draws:
            from latlab.services.predict import settings
            from latlab.services.predict_intervals import Intervals, reseeded, run_draws

            bench = BenchConfig(workload=workload.config, arrivals=workload.arrivals,
                                requests=args.requests, duration_s=None)
            intervals = Intervals(draws=args.draws, requests=args.draw_requests)
            started, cpu = time.perf_counter(), time.process_time()
            run_draws(cal, reseeded(bench, intervals.requests), Fleet(),
                      settings(bench, cal, str(path), Fleet()), intervals)
            print(f"       intervals: {args.draws} draws of "
                  f"{min(args.requests, args.draw_requests):,} requests, simulated and "
                  f"summarized: {time.perf_counter() - started:.1f} s "
                  f"(CPU {time.process_time() - cpu:.1f} s)")
            args.draws = 0
        if args.folder:
            from latlab.services.predict import settings
            from latlab.sim.folder import write_run

            bench = BenchConfig(workload=workload.config, arrivals=workload.arrivals,
                                requests=args.requests, duration_s=None)
            with tempfile.TemporaryDirectory() as tmp:
                started = time.perf_counter()
                write_run(result, workload, settings(bench, cal, str(path), Fleet()),
                          Path(tmp), "speed")
                print(f"       writing the predicted run folder (20 000 records, "
                      f"summary of all): {time.perf_counter() - started:.1f} s")
            args.folder = False


if __name__ == "__main__":
    main()
