"""The predicted sweep (the throughput–latency curve, knee and SLO-max: a sweep folder of
predicted points that `latlab sweep`'s reports read) and the replicas a goal needs (the
fewest that meet a latency goal at a rate)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from rich.console import Console

from latlab.analysis import RunAnalysis
from latlab.metrics.stats import percentile
from latlab.records.bench import BenchConfig
from latlab.records.calibration import Calibration
from latlab.records.folder import RunFolder
from latlab.records.predict import Goal, PredictConfig
from latlab.records.simulation import Fleet
from latlab.records.sweep import SweepConfig
from latlab.services.errors import InputError
from latlab.services.predict import Predicted, predict_point, settings
from latlab.services.sweep import Sweep, trace_speed_per_rate
from latlab.sim.fleet import simulate
from latlab.sim.results import OK
from latlab.sim.workload import build

MAX_REPLICAS = 4096


def predict_sweep(config: PredictConfig, cal: Calibration, where: str, err: Console
                  ) -> Sweep:
    """The predicted sweep: `latlab sweep`'s plan and stop rule (`services.sweep.Sweep`:
    explicit --rates, else the synchronous point, a saturation probe, rates up to it, ×1.5
    past it), each point a predicted run folder."""
    bench, fleet = config.bench, config.fleet
    shape = config.plan.shape
    if bench.arrivals.open_loop and bench.arrivals.process != "trace":
        shape = bench.arrivals  # the shape of the rate given, for every point
    plan = SweepConfig(base=bench, **config.plan.model_dump(exclude={"shape"}),
                       shape=shape.model_dump(include={"process", "burstiness",
                                                       "max_concurrency"},
                                              exclude_unset=True))
    folder = RunFolder.create(bench.out, f"sweep-{bench.name}").path
    sweep = Sweep(plan, folder, [], target={
        "simulated": True, "model": cal.server, "calibration": where,
        "calibration_fit": cal.headline(), "fleet": fleet.model_dump(mode="json")},
        definitions={"predicted": "every point is a simulated run (latlab predict)"})

    def simulated(point: BenchConfig) -> RunAnalysis:
        workload = build(bench.workload, point.arrivals, bench.requests, bench.duration_s)
        p = predict_point(cal, workload, fleet, settings(point, cal, where, fleet), folder,
                          point.name, config.records, store=bench.out)
        return p.analysis

    with sweep.recording(bench.out):
        sweep.run(simulated, err)
    return sweep


def _value(result, goal: Goal) -> float:
    """The goal's percentile over every request, a failure counting as infinitely slow."""
    values = np.where(result.columns.outcome == OK, result.latencies_ms()[goal.metric], np.inf)
    values = np.sort(values[~np.isnan(values)])
    return percentile(values, goal.percentile) if len(values) else math.inf


@dataclass
class Sizing:
    """The fewest replicas meeting the goal, what each count tried gave, and the answer's
    predicted run."""

    goal: Goal
    replicas: int
    tried: dict[int, float]
    fleet: Fleet
    point: Predicted


def replicas_for(config: PredictConfig, cal: Calibration, where: str, err: Console) -> Sizing:
    """The fewest replicas whose percentile meets the goal at the rate: doubling, then
    halving the gap, one simulation each; the answer's predicted run folder."""
    goal, bench, fleet = config.replicas_for, config.bench, config.fleet
    if bench.arrivals.process == "trace":  # the trace at the speed that gives the rate
        speed = goal.rate * trace_speed_per_rate(bench.arrivals, bench.requests)
        arrivals = bench.arrivals.model_copy(update={"trace_speed": speed})
    else:
        arrivals = bench.arrivals.model_copy(update={
            "process": bench.arrivals.open_loop_process(), "rate": goal.rate})
    bench = bench.model_copy(update={"arrivals": arrivals})
    tried: dict[int, float] = {}

    def meets(n: int) -> bool:
        workload = build(bench.workload, arrivals, bench.requests, bench.duration_s)
        tried[n] = _value(simulate(workload, cal, fleet.model_copy(update={"replicas": n,
                                                                            "autoscale": None})),
                          goal)
        err.print(f"  {n} replicas: p{goal.percentile:g} {goal.metric} {tried[n]:.0f} ms",
                  style="dim", highlight=False)
        return tried[n] <= goal.limit_ms

    low, high = 0, max(1, fleet.replicas)
    while not meets(high):
        low, high = high, high * 2
        if high > MAX_REPLICAS:
            raise InputError(f"--replicas-for: not met with {low} replicas; the goal may be "
                             "out of reach (e.g. below a single request's own latency)")
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if meets(mid) else (mid, high)
    best = fleet.model_copy(update={"replicas": high, "autoscale": None})
    workload = build(bench.workload, arrivals, bench.requests, bench.duration_s)
    p = predict_point(cal, workload, best, settings(bench, cal, where, best), bench.out,
                      f"{bench.name}-{high}-replicas", config.records)
    return Sizing(goal, high, tried, best, p)
