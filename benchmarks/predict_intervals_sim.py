"""Intervals old against new where the truth is known: a calibration with the spread of a
quiet host (the test calibration's step costs; ±5% across step sizes, probes that agree,
±2% drift), "measured" 45 s runs simulated in worlds drawn at random from that spread (a
level from a normal of the spread's level deviation, held-out workload seeds), and the 90%
intervals `latlab predict` gives for a 45 s run at the same rate: their coverage and width
(hi/lo), for this checkout and `--baseline-src`'s (each run in its own process).

    python benchmarks/predict_intervals_sim.py --baseline-src /tmp/latlab-before
    python benchmarks/predict_intervals_sim.py --duration 180       # the floor of longer runs
    python benchmarks/predict_intervals_sim.py --paired --fractions 0.3,0.5   # a change

No server runs: a few minutes of simulation, no timing in the figures.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
METRICS = ("ttft", "tpot", "e2e")
PERCENTILES = ("p50", "p90", "p99")


def one(fractions: list[float], truths: int, draws: int, duration: float) -> dict:
    """This process's latlab: per load, each check's (inside, hi/lo), and the floor: each
    percentile's 90% range (hi/lo) over `truths` runs of one world at the fit's own level
    with no drift — how much a run of `duration` seconds varies by its arrivals and lengths
    alone, the narrowest an interval can be and still hold 90% of them."""
    sys.path.insert(0, str(ROOT / "tests"))
    from sim_helpers import calibration

    from latlab.metrics.summary import summarize
    from latlab.records.arrivals import ArrivalConfig
    from latlab.records.bench import BenchConfig
    from latlab.records.calibration import RequestSpread, Spread
    from latlab.records.simulation import Fleet
    from latlab.records.window import run_window
    from latlab.records.workload import WorkloadConfig
    from latlab.services import predict_intervals as pi
    from latlab.services.predict import settings
    from latlab.sim import calibration as calibrations
    from latlab.sim.fleet import simulate
    from latlab.sim.folder import on_clock
    from latlab.sim.spread import level_sd
    from latlab.sim.table import request_table
    from latlab.sim.world import Draw

    calm = Spread(step=0.1, shape=0.05, drift=0.02, between=0.0, windows=20, runs=4,
                  request=RequestSpread(preprocess=0.5, network=0.2, postprocess=0.3))
    cal = calibration().model_copy(update={"spread": calm})
    capacity = calibrations.capacity(cal, cal.engine.max_num_seqs)

    def run(bench, draw=None):
        workload = pi.reseeded(bench, 20_000)(0)
        config = on_clock(settings(bench, cal, "sim", Fleet()), workload)
        result = simulate(workload, cal, Fleet(), draw)
        table = request_table(result, workload.ensure(len(result)), workload.config.api)
        return workload, config, summarize(table, run_window(config, table))

    def bench_at(rate, seed):
        return BenchConfig(workload=WorkloadConfig(seed=seed), duration_s=duration,
                           arrivals=ArrivalConfig(process="poisson", rate=rate, seed=seed),
                           warmup_s=5.0, cooldown_s=2.0)

    out = {}
    for fraction in fractions:
        rate = round(fraction * capacity, 2)
        bench = bench_at(rate, 0)
        workload, config, summary = run(bench)
        intervals = pi.Intervals(draws=draws)
        extra = ({"runs": pi.runs_for(workload, intervals)}
                 if "runs" in inspect.signature(pi.run_draws).parameters else {})
        outcomes = pi.run_draws(cal, pi.reseeded(bench, intervals.requests), Fleet(), config,
                                intervals, **extra)
        summary = pi.attach(summary, outcomes, intervals, cal)
        checks = []
        rng = np.random.default_rng(2026)
        for k in range(truths):
            truth = Draw(level=float(rng.normal(0, level_sd(calm))), drift=calm.drift,
                         window_s=calm.window_s, request_sd=(0.0005, 0.0003),
                         rng=np.random.default_rng([77, k]))
            measured = run(bench_at(rate, 1000 + k), truth)[2]
            for m in METRICS:
                for q in PERCENTILES:
                    p = summary.latency[m].percentiles[q]
                    v = measured.latency[m].percentiles[q].value
                    checks.append([p.lo <= v <= p.hi, p.hi / p.lo if p.lo else math.inf])
        floor = []
        for k in range(truths):
            same = Draw(level=0.0, drift=0.0, window_s=calm.window_s,
                        request_sd=(0.0005, 0.0003), rng=np.random.default_rng([78, k]))
            measured = run(bench_at(rate, 2000 + k), same)[2]
            floor.append([measured.latency[m].percentiles[q].value for m in METRICS
                          for q in PERCENTILES])
        v = np.array(floor)
        ranges = (np.quantile(v, 0.95, axis=0) / np.quantile(v, 0.05, axis=0)).tolist()
        # what predict says the floor is (its runs within each world), where it says it
        said = ({(f.metric, f.percentile): f.run for f in pi.run_floors(
            outcomes, intervals, summary.in_window)} if hasattr(pi, "run_floors") else {})
        out[str(fraction)] = {"checks": checks, "floor": ranges,
                              "requests": len(workload.arrival),
                              "said_floor": [said.get((m, q)) for m in METRICS
                                             for q in PERCENTILES],
                              "requests_for_width": getattr(summary.prediction,
                                                            "requests_for_width", None)}
    return out


def paired(fractions: list[float], draws: int) -> list[str]:
    """A change's effect as both sides of it give it in the same worlds (what advice and tune
    rank by): each side's 90% range (hi/lo) of E2E p50 and p99 and the range of their ratio,
    `--max-num-seqs` 32 → 8, 1,000 and 200 requests at each load."""
    sys.path.insert(0, str(ROOT / "tests"))
    from sim_helpers import calibration

    from latlab.analysis.findings import Change
    from latlab.records.arrivals import ArrivalConfig
    from latlab.records.bench import BenchConfig
    from latlab.records.calibration import RequestSpread, Spread
    from latlab.records.simulation import Fleet
    from latlab.records.workload import WorkloadConfig
    from latlab.services.advice_effects import changed
    from latlab.services.predict import settings
    from latlab.services.predict_intervals import Intervals, reseeded, run_draws
    from latlab.sim import calibration as calibrations

    calm = Spread(step=0.1, shape=0.05, drift=0.02, between=0.0, windows=20, runs=4,
                  request=RequestSpread(preprocess=0.5, network=0.2, postprocess=0.3))
    cal = calibration().model_copy(update={"spread": calm})
    capacity = calibrations.capacity(cal, cal.engine.max_num_seqs)
    other = changed(cal, Change("max_num_seqs", 8, "latlab", "--max-num-seqs 8"))
    lines = []
    for fraction in fractions:
        for requests in (1000, 200):
            bench = BenchConfig(workload=WorkloadConfig(), requests=requests, duration_s=None,
                                arrivals=ArrivalConfig(process="poisson",
                                                       rate=round(fraction * capacity, 2)))
            intervals = Intervals(draws=draws, requests=requests)
            config = settings(bench, cal, "sim", Fleet())
            for q in ("p50", "p99"):
                a, b = (np.array([o.judged for o in run_draws(
                    c, reseeded(bench, requests), Fleet(), config, intervals,
                    lambda run, q=q: run.summary.percentile("e2e", q))]) for c in (cal, other))

                def span(v: np.ndarray) -> tuple[float, float]:
                    return float(np.quantile(v, 0.05)), float(np.quantile(v, 0.95))

                (alo, ahi), (blo, bhi), (rlo, rhi) = span(a), span(b), span(b / a)
                lines.append(f"{fraction:>5.0%} {requests:>6} e2e {q}: each side "
                             f"{ahi / alo:.2f}× / {bhi / blo:.2f}× wide; the effect (8 over "
                             f"32) {rlo:.3f}–{rhi:.3f} ({rhi / rlo:.2f}× wide) paired, "
                             f"{blo / ahi:.2f}–{bhi / alo:.2f} from the sides apart")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-src", type=Path)
    parser.add_argument("--fractions", default="0.3,0.5,0.7")
    parser.add_argument("--truths", type=int, default=30)
    parser.add_argument("--draws", type=int, default=20)
    parser.add_argument("--duration", type=float, default=45.0, help="seconds a run")
    parser.add_argument("--paired", action="store_true",
                        help="instead: a change's effect, paired, against its sides' widths")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    fractions = [float(f) for f in args.fractions.split(",")]
    if args.paired:
        print(f"{args.draws} worlds, the calm calibration; 90% ranges")
        print("\n".join(paired(fractions, args.draws)))
        return
    if args.one:
        print(json.dumps(one(fractions, args.truths, args.draws, args.duration), default=str))
        return
    versions = {"new": ROOT} | ({"old": args.baseline_src} if args.baseline_src else {})
    results = {}
    for name, src in versions.items():
        done = subprocess.run(
            [sys.executable, __file__, "--one", "--fractions", args.fractions, "--truths",
             str(args.truths), "--draws", str(args.draws), "--duration", str(args.duration)],
            env=os.environ | {"PYTHONPATH": str(src)}, capture_output=True, text=True,
            timeout=1800)
        if done.returncode != 0:
            raise SystemExit(f"{name} ({src}) failed:\n{done.stderr[-2000:]}")
        results[name] = json.loads(done.stdout.splitlines()[-1])
    print(f"{args.truths} simulated {args.duration:g} s runs a load, 9 percentiles each; 90% "
          f"intervals of {args.draws} draws; the floor: a percentile's 90% range over "
          f"{args.truths} runs of one world (its arrivals and lengths alone), median over "
          "TTFT, TPOT, E2E")
    print(f"{'load':>5} {'requests':>8} {'floor p50 p90 p99':>18} "
          + " ".join(f"{n + ': inside, ∞, hi/lo median p50 p90 p99':>40}" for n in versions))
    for f in fractions:
        cells = []
        first = results[next(iter(versions))][str(f)]
        floor = np.array(first["floor"])
        cells.append(f"{first['requests']:>8} "
                     + " ".join(f"{np.median(floor[i::len(PERCENTILES)]):>5.2f}"
                                for i in range(len(PERCENTILES))))
        for name in versions:
            checks = results[name][str(f)]["checks"]
            inside = [c[0] for c in checks]
            widths = np.array([float(c[1]) for c in checks])
            by_q = [np.median(widths[i::len(PERCENTILES)]) for i in range(len(PERCENTILES))]
            cells.append(f"{100 * np.mean(inside):>4.0f}% {int(np.isinf(widths).sum()):>3} ∞ "
                         + " ".join(f"{w:>5.2f}" for w in by_q))
        print(f"{f:>5.0%} {cells[0]} " + " ".join(f"{c:>40}" for c in cells[1:]))
        said = first.get("said_floor") or []
        if said and None not in said:
            s = np.array(said, dtype=float)
            print(f"{'':>5} predict's floor (runs within its worlds, drift included) p50 p90 "
                  "p99: " + " ".join(f"{np.median(s[i::len(PERCENTILES)]):.2f}"
                                     for i in range(len(PERCENTILES)))
                  + f"; 1.5× from {first.get('requests_for_width')} requests")

if __name__ == "__main__":
    sys.exit(main())
