"""What `predict_accuracy.py` (latlab serve) and `predict_llamacpp.py` (llama-server) share:
the machine's load while they measure, and the verdict on a calibration's predictions of
held-out measured points — the share of (point, metric, percentile) inside the predicted
intervals, how wide those are, the SLO-max and the replicas a goal needs, measured against
predicted.

Measured answer to "how many replicas for p99 E2E ≤ SLO at RATE": with requests routed at
random, Poisson arrivals split into independent Poisson streams of RATE / N, so N replicas
meet the goal exactly when one server does at RATE / N: N = ⌈RATE / SLO-max⌉, the SLO-max
measured between its last passing and first failing point (so the measured answer is a
range when those two give different counts). The prediction is `latlab predict
--replicas-for` with `--router random`.
"""

from __future__ import annotations

import math
import os
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil
from rich.console import Console

from latlab.analysis import analyze, capacity
from latlab.analysis.slo_max import slo_max
from latlab.records.folder import RunFolder
from latlab.records.predict import Goal, PredictConfig
from latlab.records.simulation import Fleet
from latlab.records.sweep import SweepPlan
from latlab.services.predict_check import check_run
from latlab.services.predict_intervals import Intervals
from latlab.services.predict_plans import predict_sweep, replicas_for
from latlab.sim.calibration import rescaled
from latlab.sim.spread import drift_limit

METRICS = ("ttft", "tpot", "e2e")
PERCENTILES = ("p50", "p90", "p99")
NARROW_BELOW = 0.7  # intervals within ±20% of the value are asked for below this load
NARROW = 0.2


class Background:
    """CPU the rest of the machine uses (cores), sampled every second: all busy time less
    this process's and its children's (the server, the load generator)."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    @staticmethod
    def _ours() -> float:
        me = psutil.Process()
        total = 0.0
        for p in [me, *me.children(recursive=True)]:
            try:
                t = p.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
            except psutil.Error:
                pass
        return total

    @staticmethod
    def _busy() -> float:
        t = psutil.cpu_times()
        return sum(t) - t.idle - getattr(t, "iowait", 0.0)

    def _run(self) -> None:
        last = (time.monotonic(), self._busy(), self._ours())
        while not self._stop.wait(1.0):
            now = (time.monotonic(), self._busy(), self._ours())
            cores = ((now[1] - last[1]) - (now[2] - last[2])) / (now[0] - last[0])
            self.samples.append((now[0], max(0.0, cores)))
            last = now

    def mean(self, start: float, end: float) -> float:
        values = [c for t, c in self.samples if start <= t <= end]
        return float(np.mean(values)) if values else math.nan

    def wait_quiet(self, err: Console, limit: float, patience_s: float) -> None:
        """Wait until the last 10 s averaged under `limit` cores (at most `patience_s`)."""
        started = time.monotonic()
        while time.monotonic() - started < patience_s:
            now = time.monotonic()
            if len(self.samples) >= 10 and self.mean(now - 10, now) < limit:
                break
            time.sleep(2)
        if time.monotonic() - started > 5:
            now = time.monotonic()
            err.print(f"  waited {now - started:.0f} s for the machine to quieten (other "
                      f"processes now {self.mean(now - 10, now):.2f} cores)")


def load_average() -> float:
    return os.getloadavg()[0]


def middle_slo(points: list[dict]) -> dict[str, float]:
    """p99 E2E ≤ what the point nearest 55% of capacity measured, to the 100 ms: an SLO
    whose SLO-max lies among the points."""
    middle = min(points, key=lambda p: abs(p["fraction"] - 0.55))
    return {"e2e": round(RunFolder(Path(middle["run"])).read_summary().percentile("e2e", "p99"),
                         -2)}


def checked(cal, points: list[dict], intervals: Intervals, probed: bool = False) -> list[dict]:
    """Each measured point predicted from its settings (`latlab predict --check`): a row per
    metric and percentile. `probed`: as `latlab predict --on-drift rescale` would have
    predicted it just before — the calibration's step costs scaled by the machine's speed
    then (its reference steps timed before the point) when that was beyond the spread."""
    rows, limit = [], drift_limit(cal.spread) if cal.spread else math.inf
    for p in points:
        speed = p.get("speed", [1.0])[0]
        used = (rescaled(cal, speed, "the machine probe") if probed
                and not 1 / limit <= speed <= limit else cal)
        for c in check_run(RunFolder(Path(p["run"])), used, Fleet(), intervals):
            if c.metric in METRICS and c.percentile in PERCENTILES:
                rows.append({"fraction": p["fraction"], "rate": p["rate"], "metric": c.metric,
                             "percentile": c.percentile, "measured": c.measured,
                             "predicted": c.predicted, "lo": c.lo, "hi": c.hi,
                             "inside": c.inside, "rescaled": used is not cal,
                             "narrow": c.lo >= (1 - NARROW) * c.predicted
                             and c.hi <= (1 + NARROW) * c.predicted})
    return rows


def evaluate(cal, points: list[dict], slos: dict[str, float], fleet_rate: float,
             intervals: Intervals, out: Path) -> dict:
    """The verdict on `cal`'s predictions of the measured `points` (each {"run", "fraction",
    "rate"}): per point the measured and predicted percentiles with intervals, the coverage,
    the widths below `NARROW_BELOW` of capacity, the SLO-max and the replicas for
    `fleet_rate`."""
    rows = checked(cal, points, intervals)
    measured_points = [capacity.measure(analyze(RunFolder(Path(p["run"]))),
                                        capacity.PointLoad(f"{p['rate']:g} req/s", "rate",
                                                           p["rate"]),
                                        capacity.Judging(slos, 99.0)) for p in points]
    measured = slo_max(measured_points, slos, 99.0)
    rates = [p["rate"] for p in points]
    bench = RunFolder(Path(points[0]["run"])).read_config().bench.model_copy(
        update={"out": out, "slos": slos, "name": "predicted"})
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        bench = bench.model_copy(update={"out": Path(tmp)})
        config = PredictConfig(bench=bench, sweep=True, plan=SweepPlan(rates=rates),
                               draws=intervals.draws, level=intervals.level,
                               draw_requests=intervals.requests, calibration=None)
        quiet = Console(file=open(os.devnull, "w"))
        predicted = predict_sweep(config, cal, "benchmark", quiet, intervals).record().slo_max
        limit = next(iter(slos.values()))
        goal = Goal.model_validate(f"p99_{next(iter(slos))}<{limit:g}ms@{fleet_rate:g}rps")
        sizing = replicas_for(PredictConfig(bench=bench, replicas_for=goal,
                                            fleet=Fleet(router="random")),
                              cal, "benchmark", quiet, intervals)
    need = [math.ceil(fleet_rate / r.load) if r is not None and r.load else None
            for r in (measured.failing, measured.passing)] if measured else [None, None]
    return {"rows": rows, "slo_max": {
        "measured": measured.load if measured else None,
        "measured_between": [measured.passing.load if measured and measured.passing else None,
                             measured.failing.load if measured and measured.failing else None],
        "predicted": predicted.load if predicted else None,
        "lo": predicted.lo if predicted else None, "hi": predicted.hi if predicted else None},
        "replicas": {"goal": str(goal), "measured": (math.ceil(fleet_rate / measured.load)
                                                    if measured and measured.load else None),
                     "measured_range": need, "low": sizing.low, "high": sizing.high,
                     "point": sizing.point}}


def print_verdict(result: dict, intervals: Intervals) -> None:
    print_rows(result["rows"], intervals)
    s, n = result["slo_max"], result["replicas"]
    print(f"SLO-max: measured {s['measured']} req/s (between points {s['measured_between']}), "
          f"predicted {s['predicted']} req/s, interval {s['lo']}–{s['hi']}")
    print(f"replicas for {n['goal']} (random routing): measured {n['measured']} (from the "
          f"passing and failing points: {n['measured_range']}), predicted range "
          f"{n['low']}–{n['high']} (point estimate {n['point']}, provision {n['high']})")


def print_rows(rows: list[dict], intervals: Intervals) -> None:
    print(f"\n{'load':>5} {'rate':>6}  {'metric':<9} {'measured':>9} {'predicted':>9} "
          f"{'interval':>15}")
    for r in rows:
        print(f"{r['fraction']:>5.0%} {r['rate']:>6.2f}  {r['metric'] + ' ' + r['percentile']:<9} "
              f"{r['measured']:>9.0f} {r['predicted']:>9.0f} {r['lo']:>7.0f}–{r['hi']:<7.0f} "
              f"{'✓' if r['inside'] else '✗'}{'' if r['narrow'] else ' wide'}"
              f"{' (rescaled)' if r.get('rescaled') else ''}")
    inside = [r["inside"] for r in rows]
    low = [r for r in rows if r["fraction"] < NARROW_BELOW]
    print(f"\ncoverage: {sum(inside)} of {len(inside)} (point, percentile) pairs inside the "
          f"{100 * intervals.level:g}% intervals ({100 * np.mean(inside):.0f}%; goal ≥ 85%)")
    for f in sorted({r["fraction"] for r in rows}):
        mine = [r["inside"] for r in rows if r["fraction"] == f]
        print(f"  at {f:.0%} of capacity: {sum(mine)} of {len(mine)}")
    if low:
        half = [max(r["hi"] / r["predicted"] - 1, 1 - r["lo"] / r["predicted"]) for r in low]
        print(f"below {NARROW_BELOW:.0%} of capacity: {sum(r['narrow'] for r in low)} of "
              f"{len(low)} intervals within ±{NARROW:.0%} of the value; half-widths median "
              f"±{100 * np.median(half):.0f}%")
