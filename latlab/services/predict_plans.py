"""The predicted sweep (the throughput–latency curve, knee and SLO-max: a sweep folder of
predicted points that `latlab sweep`'s reports read) and the replicas a goal needs (the
fewest that meet a latency goal at a rate), each with the interval its draws give.

Draw d is the same world at every load and every fleet size (`run_draws`): the SLO-max of
draw d is read off draw d's points, and the replicas a goal needs in draw d off its counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.console import Console

from latlab.analysis import RunAnalysis, capacity
from latlab.analysis.slo_max import slo_max
from latlab.metrics.request import MetricColumns, metric_columns
from latlab.metrics.stats import percentile
from latlab.records.bench import BenchConfig
from latlab.records.calibration import Calibration
from latlab.records.folder import RunFolder
from latlab.records.predict import Goal, PredictConfig
from latlab.records.simulation import Fleet
from latlab.records.sweep import Point, SweepConfig, SweepRecord, SweepTarget
from latlab.records.table import RequestTable
from latlab.services.errors import InputError
from latlab.services.predict import Predicted, predict_point, settings
from latlab.services.predict_intervals import (
    QUEUED,
    Intervals,
    attach,
    quantile,
    queue_grows,
    reseeded,
    run_draws,
    span,
)
from latlab.services.replica_search import (
    MAX_REPLICAS,
    Count,
    Plateau,
    decided,
    fewest_below,
    provisioned,
    same_latency,
)
from latlab.services.sweep import Step, Sweep, trace_speed_per_rate
from latlab.sim.fleet import simulate
from latlab.sim.table import request_table
from latlab.sim.workload import build

# Requests in each draw of a replica count: enough for the goal's percentile in each world
# (a p99 from 20 beyond it), few enough that the counts a search tries answer in seconds.
SIZING_REQUESTS = 2_000


class PredictedSweep(Sweep):
    """A sweep whose points are simulated, each drawn again in the worlds of `intervals`:
    every point's latencies and SLO values get intervals, the SLO-max one from each draw's
    points."""

    def __init__(self, *args, cal: Calibration, fleet: Fleet, intervals: Intervals,
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.calibration, self.fleet, self.intervals = cal, fleet, intervals
        self.draws: dict[str, list[Point]] = {}  # a point's label → each draw's point

    def run_point(self, step: Step, run, console: Console) -> Point:
        point = super().run_point(step, run, console)
        point.slo_intervals = {}  # a simulated sample's CIs say nothing of the calibration's
        if not self.intervals.draws:
            return point
        bench = self.config.base.model_copy(update={"arrivals": step.arrivals})

        def judge(columns: capacity.RunColumns) -> Point:
            return capacity.point(columns, step.point, self.judging(ci=False))

        cal = self.calibration
        outcomes = run_draws(cal, reseeded(bench, self.intervals.requests), self.fleet,
                             settings(bench, cal, "", self.fleet), self.intervals, judge)
        draws = self.draws[step.point.label] = [o.judged for o in outcomes]
        run = RunFolder(Path(point.run))  # the point's own summary.json gets its intervals
        run.write_summary(attach(run.read_summary(), outcomes, self.intervals, self.calibration))
        grows = queue_grows(outcomes, self.intervals)
        point.latency_intervals = {
            m: {q: span([d.latencies[m][q] for d in draws], v, self.intervals,
                        grows and m in QUEUED)
                for q, v in values.items() if v is not None
                and all(d.latencies[m][q] is not None for d in draws)}
            for m, values in point.latencies.items()}
        point.slo_intervals = {m: span([d.slo_values[m] for d in draws], v, self.intervals,
                                       grows and m in QUEUED)
                               for m, v in point.slo_values.items()}
        self.write()
        return point

    def record(self) -> SweepRecord:
        record = super().record()
        best, c = record.slo_max, self.config
        labels = [p.label for p in self.points if p.label in self.draws]
        if best is None or not labels:
            return record
        loads = []
        for d in range(self.intervals.draws):
            answer = slo_max([self.draws[label][d] for label in labels], c.base.slos,
                             c.percentile)
            loads.append(0.0 if answer.load is None else
                         math.inf if answer.failing is None else answer.load)
        best.lo = quantile(loads, self.intervals.tail)
        best.hi = quantile(loads, 1 - self.intervals.tail)
        best.level = self.intervals.level
        if best.load is not None:
            best.lo, best.hi = min(best.lo, best.load), max(best.hi, best.load)
        return record


def predict_sweep(config: PredictConfig, cal: Calibration, where: str, err: Console,
                  intervals: Intervals) -> Sweep:
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
    sweep = PredictedSweep(plan, folder, [], target=SweepTarget(
        simulated=True, model=cal.server, calibration=where, calibration_fit=cal.headline(),
        fleet=fleet.model_dump(mode="json")),
        definitions={"predicted": "every point is a simulated run (latlab predict)"},
        cal=cal, fleet=fleet, intervals=intervals)

    def simulated(point: BenchConfig) -> RunAnalysis:
        workload = build(bench.workload, point.arrivals, bench.requests, bench.duration_s)
        p = predict_point(cal, workload, fleet, settings(point, cal, where, fleet), folder,
                          point.name, config.records, store=bench.out)
        return p.analysis

    with sweep.recording(bench.out):
        sweep.run(simulated, err)
    return sweep


def goal_value(goal: Goal, table: RequestTable, metrics: MetricColumns,
               chosen: np.ndarray) -> float:
    """The goal's percentile over the `chosen` requests, a failure infinitely slow."""
    values = np.where(table.ok, getattr(metrics, goal.metric), np.inf)[chosen]
    values = np.sort(values[~np.isnan(values)])
    return percentile(values, goal.percentile) if len(values) else math.inf


@dataclass
class Sizing:
    """The replicas a goal needs: `point` — the fewest that meet it at the point estimate —
    and the range the draws give: `low`, the fewest that meet it in the interval's
    favourable tail (`level`'s lower end), `high`, the fewest that meet it in all but its
    unfavourable tail: what to provision. `counts` holds every count tried."""

    goal: Goal
    point: int
    low: int
    high: int
    counts: dict[int, Count]
    level: float
    fleet: Fleet
    run: Predicted
    plateau: Plateau | None = None  # more replicas stop helping: a latency floor decides
    worlds: int = 0  # drawn worlds (a count's may be tried in fewer: its answer was decided)


def replicas_for(config: PredictConfig, cal: Calibration, where: str, err: Console,
                 intervals: Intervals) -> Sizing:
    """The fewest replicas whose percentile meets the goal at the rate at the point estimate
    (doubling, then halving the gap, one simulation each), then the range the draws give
    around it, bisected the same way: up to the fewest that all but the tail of the draws
    meet it with — or the plateau where doubling the replicas changes nothing, a latency
    floor and not capacity deciding — and down to the fewest any tail meets it with."""
    goal, bench, fleet = config.replicas_for, config.bench, config.fleet
    if bench.arrivals.process == "trace":  # the trace at the speed that gives the rate
        speed = goal.rate * trace_speed_per_rate(bench.arrivals, bench.requests)
        arrivals = bench.arrivals.model_copy(update={"trace_speed": speed})
    else:
        arrivals = bench.arrivals.model_copy(update={
            "process": bench.arrivals.open_loop_process(), "rate": goal.rate})
    bench = bench.model_copy(update={"arrivals": arrivals})
    counts: dict[int, Count] = {}
    run_config = settings(bench, cal, where, fleet)
    drawn_requests = min(intervals.requests, SIZING_REQUESTS)

    def sized(n: int) -> Fleet:
        return fleet.model_copy(update={"replicas": n, "autoscale": None})

    def judge(columns: capacity.RunColumns) -> float:
        return goal_value(goal, columns.table, columns.metrics, np.ones(len(columns.table), bool))

    def meets(n: int) -> bool:
        workload = build(bench.workload, arrivals, bench.requests, bench.duration_s)
        result = simulate(workload, cal, sized(n))
        table = request_table(result, workload.ensure(len(result)), workload.config.api)
        counts[n] = Count(goal_value(goal, table, metric_columns(table),
                                     np.ones(len(table), bool)))
        err.print(f"  {n} replicas: p{goal.percentile:g} {goal.metric} {counts[n].value:.0f} ms",
                  style="dim", highlight=False)
        return counts[n].value <= goal.limit_ms

    def world(n: int, d: int) -> float:
        """The goal's value with `n` replicas in drawn world `d`."""
        if n not in counts:
            meets(n)
        c = counts[n]
        if d not in c.by_world:
            (o,) = run_draws(cal, reseeded(bench, drawn_requests), sized(n), run_config,
                             intervals, judge, worlds=[d])
            c.by_world[d] = o.judged
        return c.by_world[d]

    def drawn(n: int) -> Count:
        """`n` replicas in every world."""
        if n in counts and len(counts[n].by_world) == intervals.draws:
            return counts[n]
        for d in range(1, intervals.draws + 1):
            world(n, d)
        err.print(f"  {n} replicas: the goal met in {100 * counts[n].met(goal.limit_ms):.0f}%"
                  f" of {intervals.draws} draws", style="dim", highlight=False)
        return counts[n]

    def share(n: int, needed: int, slowest_first: bool, within: int | None = None) -> bool:
        """Whether `needed` worlds meet the goal with `n` replicas (of the first `within` in
        that order), trying the worlds where the answer is likeliest to be decided first
        (world d's step costs are the d-th slowest)."""
        order = range(intervals.draws, 0, -1) if slowest_first else range(1, intervals.draws + 1)
        worlds = min(within or intervals.draws, intervals.draws)
        ok = decided((world(n, d) for d in list(order)[:worlds]), goal.limit_ms, worlds,
                     needed)
        tried = len(counts[n].by_world)
        err.print(f"  {n} replicas: {needed} of {intervals.draws} worlds meet the goal? "
                  f"{'yes' if ok else 'no'} ({tried} simulated)", style="dim",
                  highlight=False)
        return ok

    low, high = 0, max(1, fleet.replicas)
    while not meets(high):
        if low and same_latency(counts[low].value, counts[high].value):
            raise InputError(
                f"--replicas-for: out of reach: from {low} replicas on, more leave "
                f"p{goal.percentile:g} {goal.metric} at {counts[high].value:.0f} ms (with "
                f"{high}), above the goal's {goal.limit_ms:g} ms: a latency floor (each "
                "request's own time), not capacity, decides; the requests themselves must get "
                "faster, or the goal looser")
        low, high = high, high * 2
        if high > MAX_REPLICAS:
            raise InputError(f"--replicas-for: not met with {low} replicas; the goal may be "
                             "out of reach (e.g. below a single request's own latency)")
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if meets(mid) else (mid, high)
    point = safe = optimistic = high
    plateau = None
    if intervals.draws:
        allowed = math.floor(intervals.tail * intervals.draws + 1e-9)  # worlds that may miss

        def safe_enough(n: int) -> bool:
            return share(n, intervals.draws - allowed, slowest_first=True)

        needed = max(1, math.ceil(intervals.tail * intervals.draws - 1e-9))

        def may_do(n: int) -> bool:
            """Whether the favourable tail meets it: `needed` of the fastest 2 × `needed`
            worlds (the fastest strata; beyond them a world is slower still)."""
            return n > 0 and share(n, needed, slowest_first=False, within=2 * needed)

        safe, plateau = provisioned(point, safe_enough, drawn, goal, intervals.tail,
                                    tried=lambda n: counts[n])
        optimistic = fewest_below(point, may_do) if may_do(point) else point
    best = sized(safe)
    workload = build(bench.workload, arrivals, bench.requests, bench.duration_s)
    run = predict_point(cal, workload, best, settings(bench, cal, where, best), bench.out,
                        f"{bench.name}-{safe}-replicas", config.records, intervals=intervals,
                        workload_for=reseeded(bench, drawn_requests))
    return Sizing(goal, point, optimistic, safe, counts, intervals.level, best, run, plateau,
                  intervals.draws)

