"""Capacity: the throughput–latency curve of a sweep, its knee, the highest load that meets
the SLOs, when to stop escalating, and what a request or a token costs.

Definitions (quoted in the sweep's output):

* Load is what the sweep controls: the offered rate (req/s, open loop) or the number of
  users (closed loop). The curve is the open-loop rates, or the concurrencies: the
  synchronous point (one user, no contention) and the saturation probe are shown beside it,
  not analysed with it — a closed loop never queues the way the same mean rate of Poisson
  arrivals does.
* Throughput is the achieved rate (completions in the window / its length); for an
  open-loop point at most its offered rate, since a surplus is the window's noise.
* Knee: the last point before the first segment of the curve along which the latency
  (E2E from schedule at the sweep's percentile) grows faster than the throughput in relative
  terms — elasticity Δln(latency) / Δln(throughput) above 1, or latency rising while
  throughput does not. Scale-free: it does not depend on the units or on the range swept.
* SLO-max: the highest load whose percentile of every SLO metric meets its limit, with
  failed requests counted as infinitely slow. Between the last passing point and the first
  failing one it is interpolated linearly in the limiting metric; never above the last load
  measured.
* Saturated: a point whose load rose by ≥ 10% over the previous one while its achieved
  rate rose by less than a quarter of that (log terms), stayed below 90% of the offered rate
  (open loop), and the median E2E from schedule rose by ≥ 10%.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from latlab.metrics.request import MetricColumns
from latlab.metrics.slo import slo_value
from latlab.metrics.stats import percentile, percentile_ci
from latlab.records.summary import RunSummary
from latlab.records.sweep import Cost, Knee, Mode, Point
from latlab.records.table import OUTCOMES, RequestTable
from latlab.records.timeline import Outcome

if TYPE_CHECKING:
    from latlab.analysis.run_analysis import RunAnalysis

KNEE_ELASTICITY = 1.0
SATURATION_LOAD_GROWTH = 0.10
SATURATION_ACHIEVED_SHARE = 0.25
SATURATION_BEHIND = 0.90
SATURATION_LATENCY_GROWTH = 0.10
BEHIND = SATURATION_BEHIND  # a point that achieved less of what it offered fell behind
LABEL_TOLERANCE = 0.05  # an offered rate this far from the asked one is named in the label
STOP_RULE = ("stop escalating when a point is clearly saturated (load +≥10% over the previous "
             "point, achieved rate up by less than a quarter of that and below 90% of offered, "
             "median E2E from schedule +≥10%) or its error rate exceeds --max-error-rate")


@dataclass(frozen=True)
class RunColumns:
    """What a point is read from: a run's summary, its records' table and metric columns, and
    the requests `inside` its window (a predicted run's draws have no `RunAnalysis`)."""

    summary: RunSummary
    table: RequestTable
    metrics: MetricColumns
    inside: np.ndarray


@dataclass(frozen=True)
class PointLoad:
    """A point as the plan names it: its label, its mode and the load it asks for (None: the
    achieved rate, for the synchronous point)."""

    label: str
    mode: Mode
    load: float | None


@dataclass(frozen=True)
class Judging:
    """How points are judged: the SLO limits (ms), at which percentile, and whether with the
    SLO values' 95% CIs (a measured sample's; a prediction's come from its draws)."""

    slos: dict[str, float]
    percentile: float
    ci: bool = True


def measure(analysis: RunAnalysis, planned: PointLoad, judging: Judging) -> Point:
    """The point of one bench run."""
    budget = {name: b.buckets() for name, b in (("mean", analysis.mean), ("tail", analysis.tail))
              if b is not None}
    columns = RunColumns(analysis.summary, analysis.table, analysis.requests.metrics,
                         analysis.inside)
    return point(columns, planned, judging, run=str(analysis.run.path), budget=budget)


def point(columns: RunColumns, planned: PointLoad, judging: Judging, *, run: str = "",
          budget: dict[str, dict[str, float]] | None = None) -> Point:
    """The point of a run's columns (`run`: its folder)."""
    s, table, metrics, inside = columns.summary, columns.table, columns.metrics, columns.inside
    label, mode, load = planned.label, planned.mode, planned.load
    slos, q, ci = judging.slos, judging.percentile, judging.ci
    t = table
    judged = inside & (t.outcome != OUTCOMES.index(Outcome.CANCELLED))
    judged_values = {m: _slo_values(table, metrics, judged, m) for m in slos}
    failed = int((judged & ~t.ok).sum())
    ok_e2e = np.sort(metrics.e2e_sched[judged & t.ok & ~np.isnan(metrics.e2e_sched)])
    t = s.throughput
    achieved = t.achieved_rate if t else 0.0
    offered = t.offered_rate if t else None
    asked = load
    if mode == "rate" and offered:  # the load a point offered, not the rate it was asked for
        if load and abs(offered - load) > LABEL_TOLERANCE * load:
            label = f"{label}, offered {offered:.3g}"
        load = offered
    behind = bool(t and (t.fell_behind or short_of(offered, achieved, t.window_s)))
    return Point(
        label=label, mode=mode, load=achieved if load is None else load, asked=asked,
        achieved=achieved,
        error_rate=failed / int(judged.sum()) if judged.any() else 0.0,
        requests=int(judged.sum()),
        latency=percentile(ok_e2e, q) if len(ok_e2e) else None,
        median_latency=percentile(ok_e2e, 50) if len(ok_e2e) else None,
        slo_values={m: _percentile(v, q) for m, v in judged_values.items()},
        slo_intervals={m: _ci(v, q) for m, v in judged_values.items()} if ci else {},
        cached_share=s.cache.share if s.cache else None,
        output_tokens_per_s=t.output_tokens_per_s if t else 0.0,
        goodput=s.goodput.requests_per_s if s.goodput else None,
        latencies={m: {p: s.percentile(m, p) for p in ("p50", "p99")}
                   for m in ("ttft", "tpot", "e2e", "ttft_sched", "e2e_sched")},
        budget=budget or {}, run=run, interrupted=s.stop_reason == "interrupted",
        warnings=list(s.warnings), offered=offered, fell_behind=behind)


def short_of(offered: float | None, achieved: float, window_s: float) -> bool:
    """Whether a point achieved less than `BEHIND` of what it offered, by more requests than
    the arrivals' own counting noise (two Poisson standard deviations) explains."""
    if not offered or window_s <= 0 or achieved >= BEHIND * offered:
        return False
    return (offered - achieved) * window_s > 2 * math.sqrt(offered * window_s)


def _slo_values(table: RequestTable, metrics: MetricColumns, judged: np.ndarray,
                metric: str) -> np.ndarray:
    """`metric` as the SLO judges it (ITL: a request's largest gap) over the `judged`
    requests, sorted; a failed request is infinitely slow, a request without the metric is
    left out."""
    values = np.asarray(slo_value(metrics, metric), dtype=float)
    values = np.where(table.ok, values, np.inf)[judged]
    return np.sort(values[~np.isnan(values)])


def _percentile(values: np.ndarray, q: float) -> float:
    return percentile(values, q) if len(values) else math.inf


def _ci(values: np.ndarray, q: float) -> tuple[float, float]:
    """The q-th percentile's 95% CI, 0 and inf on a side the sample cannot bound."""
    lo, hi = percentile_ci(values, q) if len(values) else (None, None)
    return (0.0 if lo is None else lo, math.inf if hi is None else hi)


def curve(points: Sequence[Point]) -> list[Point]:
    """The points the curve analysis uses, by load: the open-loop rates or the
    concurrencies, not an interrupted one."""
    chosen = [p for p in points if p.mode in ("rate", "concurrency") and not p.interrupted]
    return sorted(chosen, key=lambda p: p.load)


def elasticity(a: Point, b: Point) -> float | None:
    """Δln(latency) / Δln(throughput) from `a` to `b`; inf when latency rose at flat
    throughput."""
    if not (a.latency and b.latency and a.throughput > 0 and b.throughput > 0):
        return None
    rise = math.log(b.latency / a.latency)
    gain = math.log(b.throughput / a.throughput)
    if gain <= 0:
        return math.inf if rise > 0 else 0.0
    return rise / gain


def knee(points: Sequence[Point]) -> Knee | None:
    """The knee of the curve (see the module's definition); None when latency never grows
    faster than throughput within the points measured."""
    ordered = curve(points)
    for a, b in zip(ordered, ordered[1:]):
        e = elasticity(a, b)
        if e is not None and e > KNEE_ELASTICITY:
            return Knee(label=a.label, load=a.load, unit=a.unit, achieved=a.achieved,
                        latency=a.latency, next=b.label, elasticity=e)
    return None


def saturation(prev: Point, cur: Point) -> str | None:
    """Why `cur` is clearly saturated compared with `prev`, or None."""
    if min(prev.load, cur.load, prev.achieved) <= 0 or not (prev.median_latency
                                                             and cur.median_latency):
        return None
    load_growth = math.log(cur.load / prev.load)
    achieved_growth = math.log(max(cur.achieved, 1e-12) / prev.achieved)
    latency_growth = cur.median_latency / prev.median_latency - 1
    behind = cur.mode != "rate" or cur.achieved < SATURATION_BEHIND * cur.load
    if (load_growth >= math.log1p(SATURATION_LOAD_GROWTH)
            and achieved_growth < SATURATION_ACHIEVED_SHARE * load_growth and behind
            and latency_growth >= SATURATION_LATENCY_GROWTH):
        return (f"load {prev.load:.3g} → {cur.load:.3g} {cur.unit} "
                f"(+{100 * math.expm1(load_growth):.0f}%), achieved {prev.achieved:.3g} → "
                f"{cur.achieved:.3g} req/s ({100 * math.expm1(achieved_growth):+.0f}%), "
                f"median E2E from schedule {prev.median_latency:.0f} → "
                f"{cur.median_latency:.0f} ms (+{100 * latency_growth:.0f}%)")
    return None


def too_many_errors(point: Point, limit: float) -> str | None:
    if point.error_rate > limit:
        return (f"error rate {100 * point.error_rate:.1f}% at {point.label} exceeds "
                f"--max-error-rate {100 * limit:g}%")
    return None


def cost(price_per_hour: float, requests_per_s: float | None,
         output_tokens_per_s: float | None) -> Cost:
    """What a million output tokens and a thousand requests cost when the server, paid
    `price_per_hour`, serves at these rates all hour."""
    def per(unit: float, rate: float | None) -> float | None:
        return price_per_hour / (rate * 3600) * unit if rate else None

    return Cost(per_million_output_tokens=per(1e6, output_tokens_per_s),
                per_thousand_requests=per(1e3, requests_per_s))
