"""How far to trust a prediction: the simulation run again in worlds drawn from the
calibration's spread (`latlab.sim.spread`: the step costs' level and drift, each request's
costs outside the engine), each with its own workload seed, and every percentile given the
interval those draws span.

    intervals = Intervals(draws=20)
    draws = run_draws(cal, reseeded(bench, intervals.requests), fleet, config, intervals)
    attach(summary, draws, intervals, cal)   # lo/hi on every percentile

Two things make a measured percentile differ from the point estimate, and the draws keep
them apart: what the calibration does not know (the level of the step costs: world d's sits
at the middle of the d-th of `draws` equal strata of the levels its spread allows, so the
worlds cover that distribution evenly and none lies beyond its last stratum), and how much
the percentile of a run of that length varies from one run to the next (a short run is
simulated again in each world, `runs_for`, until its runs hold `Intervals.world_requests`
requests together).

So an interval is where the percentile of one run of the asked length will fall, that run's
own luck included; how much of it is that luck, its floor, `predict_floor` says.

Near saturation a draw's server may fall behind its offered rate: its queue grows for as long
as the run lasts, and a latency that includes the queue has no bound. When more draws than
the interval's upper tail do (or the point estimate does), those percentiles' `hi` is
infinite: the honest answer is "the queue may grow".
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from latlab.analysis.capacity import RunColumns
from latlab.metrics.request import metric_columns
from latlab.metrics.summary import summarize
from latlab.metrics.throughput import inside
from latlab.records.bench import BenchConfig
from latlab.records.calibration import Calibration
from latlab.records.config import RunConfig
from latlab.records.simulation import Fleet
from latlab.records.summary import Prediction, RunSummary
from latlab.records.window import run_window
from latlab.services.predict_floor import percentile_value, run_floors, too_short, widest
from latlab.sim.fleet import simulate
from latlab.sim.folder import on_clock
from latlab.sim.spread import level_sd, spread_of
from latlab.sim.table import request_table
from latlab.sim.workload import SimWorkload, build
from latlab.sim.world import Draw

QUEUED = ("ttft", "ttft_sched", "e2e", "e2e_sched", "lateness")  # include the queue's wait
DRAW_SEED = 25

# What a caller reads off each draw beside its summary (a sweep's point, a goal's value):
# from the summary, the table, its metric columns and the requests inside the window.
Judge = Callable[[RunColumns], Any]  # what a draw's columns are read for


MAX_RUNS = 8  # runs of a short prediction simulated in each world, at most


@dataclass(frozen=True)
class Intervals:
    """`draws` worlds (0: the point estimate alone), simulations of at most `requests` each,
    a short run simulated again in each world until its runs hold `world_requests` requests
    together, and the central share of them an interval spans (`level`)."""

    draws: int = 20
    level: float = 0.9
    requests: int = 20_000
    world_requests: int = 1_000

    @property
    def tail(self) -> float:
        return (1 - self.level) / 2

    def stratum(self, d: int) -> float:
        """Where world `d` (from 1) sits among the levels the spread allows (the share of
        them below it): the middle of its stratum."""
        return (d - 0.5) / self.draws


@dataclass
class DrawOutcome:
    summary: RunSummary
    judged: Any  # what the judge read off it, when there is one
    fell_behind: bool
    world: int = 0  # the draw (from 1) whose world it ran in


def reseeded(bench: BenchConfig, cap: int) -> Callable[[int], SimWorkload]:
    """The bench's workload with seed + `d` (draw d's), at most `cap` requests; a trace's
    whole window (its rows are the same in every draw, its speed set for all of them)."""
    requests = min(bench.requests, cap) if bench.requests is not None else cap
    if bench.arrivals.process == "trace":
        requests = bench.requests

    def workload(d: int) -> SimWorkload:
        w = bench.workload.model_copy(update={"seed": bench.workload.seed + d})
        a = bench.arrivals.model_copy(update={"seed": bench.arrivals.seed + d})
        return build(w, a, requests, bench.duration_s)

    return workload


def runs_for(workload: SimWorkload, intervals: Intervals) -> int:
    """Runs of `workload`'s length to simulate in each world: enough to hold
    `world_requests` requests together (a short run's percentile varies from run to run),
    at most `MAX_RUNS`; one for a closed loop's run of no set length."""
    size = workload.requests if workload.arrival is None else len(workload.arrival)
    if not size:
        return 1
    return max(1, min(MAX_RUNS, math.ceil(intervals.world_requests / size)))


def run_draws(cal: Calibration, workload_for: Callable[[int], SimWorkload], fleet: Fleet,
              config: RunConfig, intervals: Intervals, judge: Judge | None = None,
              runs: int = 1, worlds: Sequence[int] | None = None) -> list[DrawOutcome]:
    """Each draw's summary (over the window of `config`), and what `judge` reads off it: in
    each world `runs` runs (each its own workload seed), world after world. The same draw
    index gives the same world whatever the load, the fleet or the setting — a sweep's
    points, the replica counts tried, the two sides of a change share their worlds, their
    drift and their requests' costs included. `worlds`: only those draws (from 1)."""
    spread, _ = spread_of(cal)
    out = []
    for d in worlds if worlds is not None else range(1, intervals.draws + 1):
        for k in range(runs):
            draw = Draw.make(spread, [DRAW_SEED, d, k], intervals.stratum(d))
            out.append(_outcome(cal, workload_for(d + k * intervals.draws), fleet, config,
                                judge, draw, d))
    return out


def point_outcome(cal: Calibration, workload: SimWorkload, fleet: Fleet, config: RunConfig,
                  judge: Judge | None = None) -> DrawOutcome:
    """The point estimate's summary and what `judge` reads off it: `workload` simulated
    once, as the calibration fitted it (no drawn world; `world` 0)."""
    return _outcome(cal, workload, fleet, config, judge, None, 0)


def _outcome(cal: Calibration, workload: SimWorkload, fleet: Fleet, config: RunConfig,
             judge: Judge | None, draw: Draw | None, world: int) -> DrawOutcome:
    result = simulate(workload, cal, fleet, draw)
    table = request_table(result, workload.ensure(len(result)), workload.config.api)
    window = run_window(on_clock(config.model_copy(deep=True), workload), table)
    metrics = metric_columns(table)
    summary = summarize(table, window, config.slos or None, metrics=metrics)
    chosen = np.ones(len(table), bool) if window is None else inside(table.origin_ns, window)
    t = summary.throughput
    judged = judge(RunColumns(summary, table, metrics, chosen)) if judge else None
    return DrawOutcome(summary, judged, bool(t and t.fell_behind), world)


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0–1, linear between order statistics); infinite where an infinite
    value takes part."""
    v = np.sort(np.asarray(values, dtype=float))
    at = q * (len(v) - 1)
    lo, hi = int(math.floor(at)), int(math.ceil(at))
    if math.isinf(v[hi]) or math.isinf(v[lo]):
        return math.inf if math.isinf(v[hi]) else float(v[lo])
    return float(v[lo] + (v[hi] - v[lo]) * (at - lo))


def paired_interval(cal: Calibration, diffs: Sequence[float], intervals: Intervals
                    ) -> tuple[float, float] | None:
    """The interval of a change's paired differences `diffs` (one a drawn world), or None
    where it would not be one: fewer than two worlds, worlds the calibration's spread does not
    set apart (no level, no drift: they differ by their workload's seed alone), or one
    nonzero difference in every world (a zero-width span says nothing about how far to trust
    it; none in every world is the change doing nothing, whatever the world)."""
    d = np.asarray(diffs, dtype=float)
    d = d[np.isfinite(d)]
    spread, _ = spread_of(cal)
    if len(d) < 2 or (level_sd(spread) <= 0 and spread.drift <= 0) or (
            np.ptp(d) <= 0 and d[0] != 0):
        return None
    return quantile(d, intervals.tail), quantile(d, 1 - intervals.tail)


def span(values: Sequence[float], value: float, intervals: Intervals, grows: bool = False
         ) -> tuple[float, float]:
    """The interval of `values` (the draws') around `value` (the point estimate's), widened
    to hold it; `grows`: its upper end is a growing queue (infinite)."""
    lo = quantile(values, intervals.tail)
    hi = math.inf if grows else quantile(values, 1 - intervals.tail)
    return min(lo, value), max(hi, value)


def worlds_behind(outcomes: Sequence[DrawOutcome]) -> tuple[int, int]:
    """(worlds whose server fell behind the offered rate, worlds): one falls behind when
    more than half its runs do — a short run may end with a backlog that is only the
    arrivals' chance bunching, which another run of the same world does not have."""
    runs: dict[int, list[bool]] = {}
    for o in outcomes:
        runs.setdefault(o.world, []).append(o.fell_behind)
    return sum(2 * sum(v) > len(v) for v in runs.values()), len(runs)


def queue_grows(outcomes: Sequence[DrawOutcome], intervals: Intervals) -> bool:
    """Whether the interval's upper end is a growing queue: more worlds fell behind than
    its upper tail holds. (The point estimate is the median world, one run of it: it
    decides nothing the worlds do not.)"""
    behind, worlds = worlds_behind(outcomes)
    return behind > intervals.tail * worlds


def attach(summary: RunSummary, outcomes: Sequence[DrawOutcome], intervals: Intervals,
           cal: Calibration, wall_s: float | None = None, rate: float | None = None
           ) -> RunSummary:
    """`summary` (the point estimate's) with `lo`/`hi` on every percentile the draws give and
    the `prediction` that says how they were made (and, for a run too short for `WIDE`, the
    length at the offered `rate` that would give it)."""
    if not outcomes:
        return summary
    t = summary.throughput
    point_behind = bool(t and t.fell_behind)
    grows = queue_grows(outcomes, intervals)
    for group in ("latency", "failure_adjusted"):
        for name, dist in getattr(summary, group).items():
            for pname, p in dist.percentiles.items():
                values = [v for o in outcomes
                          if (v := percentile_value(o.summary, group, name, pname)) is not None]
                if p.value is None or not values:
                    continue
                p.lo, p.hi = span(values, p.value, intervals,
                                  grows and (group == "failure_adjusted" or name in QUEUED))
    spread, note = spread_of(cal)
    notes = [note] if note else []
    requests = summary.in_window
    floors = run_floors(outcomes, intervals, requests)
    widest_floor = widest(floors)
    short = too_short(summary, floors, requests, rate)
    if short:
        notes.append(short)
    if grows:
        behind, worlds = worlds_behind(outcomes)
        notes.append(f"the server fell behind the offered rate in {behind} of {worlds} "
                     "drawn worlds: its queue may grow for as long as the load lasts, so the "
                     "latencies that include the queue have no upper bound (hi = ∞)")
    summary.prediction = Prediction(
        level=intervals.level, draws=intervals.draws,
        runs=max(1, len(outcomes) // max(intervals.draws, 1)),
        requests=max(o.summary.requests for o in outcomes),
        fell_behind=sum(o.fell_behind for o in outcomes), point_fell_behind=point_behind,
        spread=spread.describe(), wall_s=wall_s, notes=notes, run_requests=requests,
        floor=widest_floor.run if widest_floor else None,
        floor_at=widest_floor.named if widest_floor else None,
        requests_for_width=(max(f.requests_needed for f in floors)
                            if floors and all(f.requests_needed is not None for f in floors)
                            else None))
    return summary


def predicted_intervals(cal: Calibration, summary: RunSummary,
                        workload_for: Callable[[int], SimWorkload], fleet: Fleet,
                        config: RunConfig, intervals: Intervals) -> RunSummary:
    """`summary` with the intervals of `intervals.draws` worlds (timed)."""
    if intervals.draws < 1:
        return summary
    started = time.perf_counter()
    runs = runs_for(workload_for(0), intervals)
    outcomes = run_draws(cal, workload_for, fleet, config, intervals, runs=runs)
    arrivals = config.bench.arrivals if config.bench is not None else None
    rate = (arrivals.rate if arrivals is not None and arrivals.rate  # an open loop's
            and math.isfinite(arrivals.rate) else None)
    return attach(summary, outcomes, intervals, cal, time.perf_counter() - started, rate)
