"""`latlab predict --sweep` (the predicted throughput–latency curve, knee and SLO-max, a sweep
folder of predicted points that `latlab sweep`'s reports read) and `--replicas-for` (the
fewest replicas that meet a latency goal at a rate)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np

from latlab.analysis import RunAnalysis
from latlab.commands.common import EXIT_INTERRUPTED, RunFailed, UsageError
from latlab.commands.predicting import predict_point, settings
from latlab.commands.sweep_points import Sweep
from latlab.metrics.stats import percentile
from latlab.records.calibration import Calibration
from latlab.records.coldstart import COLDSTART_JSON, ColdstartRecord
from latlab.records.config import SLO_METRICS, BenchConfig
from latlab.records.folder import RunFolder, RunFolderError, read_json
from latlab.records.simulation import Fleet
from latlab.report.sweep import print_sweep
from latlab.sim.fleet import simulate
from latlab.sim.results import OK
from latlab.sim.workload import build

SIZING_METRICS = ("ttft", "ttft_sched", "tpot", "e2e", "e2e_sched")
MAX_REPLICAS = 4096
_GOAL = re.compile(r"^\s*p(?P<q>[0-9.]+)[_ ](?P<metric>[a-z][a-z0-9_]*)\s*<=?\s*(?P<value>[0-9.]+)\s*"
                   r"(?P<unit>ms|s)?\s*@\s*(?P<rate>[0-9.]+)\s*(?:rps|req/s)?\s*$")


def cold_start_s(value: str | None) -> float:
    """--cold-start: seconds, or a `latlab coldstart` folder (or its coldstart.json): the
    median time to ready."""
    if value is None:
        return 0.0
    try:
        return float(value.rstrip("s"))
    except ValueError:
        pass
    path = Path(value)
    path = path / COLDSTART_JSON if path.is_dir() else path
    try:
        record = read_json(path, ColdstartRecord)
    except RunFolderError as e:
        raise UsageError(f"--cold-start {value!r}: seconds or a coldstart folder ({e})") from None
    ready = record.summary.get("ready_s")
    if ready is None or ready.median is None:
        raise UsageError(f"--cold-start {value!r}: the coldstart run has no time to ready")
    return float(ready.median)


def predict_sweep(o, cal: Calibration, where: str, fleet: Fleet, bench: BenchConfig,
                  out, err) -> None:
    """The predicted sweep: `latlab sweep`'s plan and stop rule (`sweep_points.Sweep`:
    explicit --rates, else the synchronous point, a saturation probe, rates up to it, ×1.5
    past it), each point a predicted run folder."""
    config = o.plan(bench)
    folder = RunFolder.create(o.out, f"sweep-{bench.name}").path
    sweep = Sweep(config, folder, [], target={
        "simulated": True, "model": cal.server, "calibration": where,
        "calibration_fit": cal.headline(), "fleet": fleet.model_dump(mode="json")},
        definitions={"predicted": "every point is a simulated run (latlab predict)"})

    def simulated(point: BenchConfig) -> RunAnalysis:
        workload = build(bench.workload, point.arrivals, bench.requests, bench.duration_s)
        p = predict_point(cal, workload, fleet, settings(point, cal, where, fleet), folder,
                          point.name, o.records, store=o.out)
        return p.analysis

    with sweep.recording(o.out):
        sweep.run(simulated, err)
    print_sweep(out, sweep.record(), folder)
    err.print(f"predicted sweep folder: {folder} (sweep.json, sweep.html)", highlight=False)
    if sweep.stopped.reason == "interrupted":
        raise RunFailed(code=EXIT_INTERRUPTED)


def parse_goal(text: str) -> tuple[float, str, float, float]:
    """`"p99_e2e<2s@40rps"` → (99, "e2e", 2000 ms, 40 req/s)."""
    m = _GOAL.match(text)
    if not m:
        raise UsageError(f"--replicas-for {text!r}: expected pQ_METRIC<LIMIT@RATE, e.g. "
                         "p99_e2e<2s@40rps")
    metric, q = m["metric"], float(m["q"])
    if metric not in SLO_METRICS or metric not in SIZING_METRICS:
        raise UsageError(f"--replicas-for {text!r}: the metric is one of "
                         f"{', '.join(SIZING_METRICS)}")
    if not 0 < q < 100 or float(m["rate"]) <= 0 or float(m["value"]) <= 0:
        raise UsageError(f"--replicas-for {text!r}: a percentile in (0, 100), a positive limit "
                         "and rate")
    return q, metric, float(m["value"]) * (1000.0 if m["unit"] == "s" else 1.0), float(m["rate"])


def _value(result, metric: str, q: float) -> float:
    """`metric`'s `q` percentile over every request, a failure counting as infinitely slow."""
    values = np.where(result.columns.outcome == OK, result.latencies_ms()[metric], np.inf)
    values = np.sort(values[~np.isnan(values)])
    return percentile(values, q) if len(values) else math.inf


def replicas_for(o, cal: Calibration, where: str, fleet: Fleet, bench: BenchConfig,
                 out, err) -> None:
    """The fewest replicas whose percentile meets the goal at the rate: doubling, then
    halving the gap, one simulation each; the answer's predicted run folder."""
    q, metric, limit, rate = parse_goal(o.replicas_for)
    arrivals = bench.arrivals.model_copy(update={"process": o.arrival or "poisson",
                                                 "rate": rate})
    bench = bench.model_copy(update={"arrivals": arrivals})
    tried: dict[int, float] = {}

    def meets(n: int) -> bool:
        workload = build(bench.workload, arrivals, bench.requests, bench.duration_s)
        tried[n] = _value(simulate(workload, cal, fleet.model_copy(update={"replicas": n,
                                                                            "autoscale": None})),
                          metric, q)
        err.print(f"  {n} replicas: p{q:g} {metric} {tried[n]:.0f} ms", style="dim",
                  highlight=False)
        return tried[n] <= limit

    low, high = 0, max(1, fleet.replicas)
    while not meets(high):
        low, high = high, high * 2
        if high > MAX_REPLICAS:
            raise UsageError(f"--replicas-for: not met with {low} replicas; the goal may be "
                             "out of reach (e.g. below a single request's own latency)")
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if meets(mid) else (mid, high)
    best = fleet.model_copy(update={"replicas": high, "autoscale": None})
    workload = build(bench.workload, arrivals, bench.requests, bench.duration_s)
    p = predict_point(cal, workload, best, settings(bench, cal, where, best), o.out,
                      f"{bench.name}-{high}-replicas", o.records)
    below = f"; {high - 1}: {tried[high - 1]:.0f} ms ✗" if high - 1 in tried else ""
    out.print(f"{high} replicas ({best.router}) meet p{q:g} {metric} < {limit:g} ms at "
              f"{rate:g} req/s: {tried[high]:.0f} ms{below}", highlight=False)
    out.print(f"run folder: {p.run.path}", highlight=False)
