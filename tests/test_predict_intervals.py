"""Intervals narrow enough to decide with (seeded, on the test calibration with the spread of
a calm host): the worlds cover the level's distribution evenly, a short run is simulated
again in each world, a queue counts as growing only where worlds (not single short runs)
fall behind, and a change's effect is a paired difference narrower than either side."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from scipy.stats import t as student_t
from sim_helpers import calibration

from latlab.analysis.findings import Change
from latlab.metrics.summary import summarize
from latlab.records.arrivals import ArrivalConfig
from latlab.records.bench import BenchConfig
from latlab.records.calibration import RequestSpread, Spread, Stretch, Stretches
from latlab.records.simulation import Fleet
from latlab.records.summary import Distribution, Percentile, RunSummary
from latlab.records.window import run_window
from latlab.records.workload import WorkloadConfig
from latlab.services.advice_effects import changed
from latlab.services.predict import settings
from latlab.services.predict_floor import WIDE, run_floors, too_short
from latlab.services.predict_intervals import (
    DrawOutcome,
    Intervals,
    attach,
    reseeded,
    run_draws,
    runs_for,
)
from latlab.services.replica_search import decided
from latlab.sim import calibration as calibrations
from latlab.sim.fleet import simulate
from latlab.sim.folder import on_clock
from latlab.sim.spread import level_dof, level_quantile, score
from latlab.sim.table import request_table
from latlab.sim.world import Draw

# A calibration on a quiet host: steps ±5% across step sizes, 4 probes whose
# levels agree, the level drifting ±2% between 10 s windows.
CALM = Spread(step=0.1, shape=0.05, drift=0.02, between=0.0, windows=20, runs=4,
              request=RequestSpread(preprocess=0.5, network=0.2, postprocess=0.3))
METRICS = ("ttft", "tpot", "e2e")
PERCENTILES = ("p50", "p90", "p99")


@pytest.fixture(scope="module")
def calm():
    cal = calibration().model_copy(update={"spread": CALM})
    return cal, calibrations.capacity(cal, cal.engine.max_num_seqs)


def predicted(cal, rate: float, duration_s: float | None, requests: int | None,
              intervals: Intervals):
    """A predicted run's summary with its intervals, as `latlab predict` makes it."""
    bench = BenchConfig(workload=WorkloadConfig(), duration_s=duration_s, requests=requests,
                        arrivals=ArrivalConfig(process="poisson", rate=round(rate, 2)),
                        warmup_s=5.0 if duration_s else 0.0,
                        cooldown_s=2.0 if duration_s else 0.0)
    workload_for = reseeded(bench, intervals.requests)
    workload = workload_for(0)
    config = on_clock(settings(bench, cal, "test", Fleet()), workload)
    result = simulate(workload, cal)
    table = request_table(result, workload.ensure(len(result)), workload.config.api)
    summary = summarize(table, run_window(config, table))
    outcomes = run_draws(cal, workload_for, Fleet(), config, intervals,
                         runs=runs_for(workload, intervals))
    return attach(summary, outcomes, intervals, cal)


def widths(summary) -> dict[str, float]:
    return {f"{m} {q}": p.hi / p.lo for m in METRICS
            for q, p in summary.latency[m].percentiles.items() if q in PERCENTILES}


def test_the_worlds_cover_the_levels_evenly_with_the_dof_of_both_variances():
    # the level's variance is the shapes' (9 dof) alone: the probes agreed; not t with 3
    assert level_dof(CALM) == pytest.approx(9.0)
    one_sided = CALM.model_copy(update={"between": 0.08})
    assert 3.0 < level_dof(one_sided) < 9.0  # Welch–Satterthwaite: between the two
    assert math.isinf(level_dof(CALM.model_copy(update={"shape": 0.0})))  # nothing varies
    intervals = Intervals(draws=10)
    levels = [Draw.make(CALM, [1, d], intervals.stratum(d)).level for d in range(1, 11)]
    assert levels == sorted(levels) and levels[0] == pytest.approx(-levels[-1])
    assert levels[-1] == pytest.approx(student_t.ppf(0.95, 9) * 0.05)
    assert levels[-1] == pytest.approx(level_quantile(CALM, 0.95))


def test_the_levels_quantiles_are_scipy_stats_own_without_importing_it():
    for q, dof in [(0.95, 9.0), (0.975, 3.7), (0.6, 250.5)]:
        assert score(q, dof) == pytest.approx(student_t.ppf(q, dof), rel=1e-9)
    assert score(0.975, math.inf) == pytest.approx(1.959964, abs=1e-6)
    # scipy.stats costs half a CPU second to import: the spread's quantiles, the machine
    # check's limit and the slow stretches' shape leave it out
    code = ("import sys, numpy as np\n"
            "from latlab.records.calibration import Spread\n"
            "from latlab.sim.spread import drift_limit, level_quantile\n"
            "from latlab.sim.stretches import shape_of\n"
            "s = Spread(step=0.1, shape=0.05, drift=0.02, windows=20, runs=4)\n"
            "drift_limit(s), level_quantile(s, 0.9), shape_of(np.arange(50.0))\n"
            "assert 'scipy.stats' not in sys.modules, 'scipy.stats imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_a_world_gives_both_sides_of_a_change_the_same_drift_and_requests_costs():
    a, b = Draw.make(CALM, [25, 3]), Draw.make(CALM, [25, 3])
    b.overheads(5000)  # asked in another order: the other side's simulation ran differently
    assert [a.speed(t) for t in (0.0, 15.0, 35.0)] == [b.speed(t) for t in (35.0, 15.0, 0.0)][
        ::-1]
    assert np.array_equal(a.overheads(100), b.overheads(100))


def test_a_short_run_is_simulated_again_in_each_world():
    intervals = Intervals(draws=20, world_requests=1000)
    short = reseeded(BenchConfig(arrivals=ArrivalConfig(process="poisson", rate=3.0),
                                 duration_s=45.0), intervals.requests)(0)
    assert runs_for(short, intervals) == math.ceil(1000 / len(short.arrival))
    long = reseeded(BenchConfig(arrivals=ArrivalConfig(process="poisson", rate=3.0),
                                requests=10_000, duration_s=None), intervals.requests)(0)
    assert runs_for(long, intervals) == 1


def test_where_the_worlds_keep_up_the_interval_is_finite(calm):
    """45 s at 70% of capacity: a short run now and then ends with a backlog (the arrivals
    bunched), which made hi = ∞ when any two of them did; the worlds keep up."""
    cal, capacity = calm
    summary = predicted(cal, 0.7 * capacity, 45.0, None, Intervals(draws=20))
    assert summary.prediction.runs > 1
    for m in METRICS:
        for q in PERCENTILES:
            assert math.isfinite(summary.latency[m].percentiles[q].hi), (m, q)
    past = predicted(cal, 1.3 * capacity, 45.0, None, Intervals(draws=8))
    assert math.isinf(past.latency["ttft"].percentiles["p99"].hi)  # every world falls behind


def test_on_a_calm_host_the_intervals_below_capacity_are_narrow(calm):
    cal, capacity = calm
    summary = predicted(cal, 0.25 * capacity, None, 3000, Intervals(draws=20))
    for name, width in widths(summary).items():
        assert width <= 1.5, (name, width)
    for m in METRICS:
        p = summary.latency[m].percentiles["p50"]
        assert p.lo <= p.value <= p.hi


STRETCHED = Stretches(parts=[Stretch(sd=0.2, tau_s=0.1), Stretch(sd=0.15, tau_s=2.0)],
                      jitter=0.1)


@pytest.mark.parametrize("stretches", [None, STRETCHED], ids=["calm", "slow stretches"])
def test_a_changes_effect_is_a_paired_difference_narrower_than_either_side(calm, stretches):
    """Both sides in the same worlds: the same level, drift, requests' costs and slow
    stretches at the same times (and the steps' own jitter, step by step)."""
    cal, capacity = calm
    cal = cal.model_copy(update={"spread": cal.spread.model_copy(
        update={"stretches": stretches})})
    bench = BenchConfig(workload=WorkloadConfig(), requests=800, duration_s=None,
                        arrivals=ArrivalConfig(process="poisson",
                                               rate=round(0.5 * capacity, 2)))
    intervals = Intervals(draws=10, requests=800)
    config = settings(bench, cal, "test", Fleet())
    fewer = changed(cal, Change("max_num_seqs", 8, "latlab", "--max-num-seqs 8"))

    def ttft(c) -> np.ndarray:
        outcomes = run_draws(c, reseeded(bench, intervals.requests), Fleet(), config,
                             intervals, lambda run: run.summary.percentile("ttft", "p50"))
        return np.array([o.judged for o in outcomes])

    a, b = ttft(cal), ttft(fewer)

    def width(v: np.ndarray) -> float:
        return float(np.quantile(v, 0.95) - np.quantile(v, 0.05))

    assert width(b - a) < min(width(a), width(b))
    # fewer sequences at once: the first token waits longer, in every world — where each
    # step's own jitter comes step by step, one side's steps are not the other's: most
    assert np.mean(b > a) >= (1.0 if stretches is None else 0.8)



def e2e_p50(ms: float, lo: float | None = None, hi: float | None = None) -> RunSummary:
    p = Percentile(value=ms, ci_low=None, ci_high=None, reliable=True, lo=lo, hi=hi)
    return RunSummary(requests=100, in_window=100, ok=100,
                      latency={"e2e": Distribution(n=100, percentiles={"p50": p})})


def test_a_runs_floor_is_its_spread_within_a_world_and_sets_the_length_for_narrow():
    """Known spreads: E2E p50 off by ±0.20 (sd, log) from run to run of a world of 100
    requests, the worlds ±0.05 apart; a normal's 90% is ±1.645 sd."""
    rng = np.random.default_rng(5)
    within, between, requests, z2 = 0.20, 0.05, 100, 2 * 1.6449
    outcomes = [DrawOutcome(e2e_p50(float(np.exp(6 + level + within * rng.standard_normal()))),
                            None, False, d)
                for d, level in enumerate(between * rng.standard_normal(200), 1)
                for _ in range(8)]
    (floor,) = run_floors(outcomes, Intervals(draws=200), requests)
    assert (floor.metric, floor.percentile) == ("e2e", "p50")
    assert floor.run == pytest.approx(math.exp(z2 * within), rel=0.05)
    assert floor.level == pytest.approx(math.exp(z2 * between), rel=0.05)
    goal = (math.log(WIDE) / z2) ** 2  # the variance a WIDE interval holds
    expected = requests * within ** 2 / (goal - between ** 2)
    assert floor.requests_needed == pytest.approx(expected, rel=0.2)
    # the run's own interval is as wide as both parts together: too short, by the floor
    line = too_short(e2e_p50(400.0, 300.0, 600.0), [floor], requests, rate=2.0)
    assert line is not None and f"{floor.run:.2f}×" in line and "E2E p50" in line
    assert f"{-(-floor.requests_needed // 10) * 10:,} requests" in line  # rounded up
    assert too_short(e2e_p50(400.0, 350.0, 450.0), [floor], requests) is None  # narrow
    # worlds alone wider than WIDE: no length narrows it, and the line says so
    apart = [DrawOutcome(o.summary, None, False, o.world) for o in outcomes]
    for o in apart:
        o.summary.latency["e2e"].percentiles["p50"].value *= math.exp(0.3 * (o.world % 2))
    (stuck,) = run_floors(apart, Intervals(draws=200), requests)
    assert stuck.requests_needed is None
    assert "no run length" in too_short(e2e_p50(400.0, 300.0, 600.0), [stuck], requests)


def test_a_run_too_short_for_narrow_intervals_is_told_the_length_that_is_not(calm):
    """45 s at 30% of capacity: its p90/p99 move more than 1.5× from run to run; the length
    the line names gives a floor that fits in 1.5×, and 3,000 requests need no line."""
    cal, capacity = calm
    short = predicted(cal, 0.3 * capacity, 45.0, None, Intervals(draws=20))
    p = short.prediction
    assert p.run_requests == short.in_window and p.floor > WIDE
    metric, _ = p.floor_at.split()  # the intervals' line names the percentile of its floor
    assert metric in ("TTFT", "TPOT", "E2E")
    assert p.requests_for_width > short.in_window
    assert any(n.startswith(f"a run of {short.in_window:,} requests is too short")
               for n in p.notes), p.notes
    enough = predicted(cal, 0.3 * capacity, None, p.requests_for_width, Intervals(draws=20))
    assert enough.prediction.floor < p.floor and enough.prediction.floor <= WIDE
    long = predicted(cal, 0.25 * capacity, None, 3000, Intervals(draws=20))
    assert not any("too short" in n for n in long.prediction.notes)


def test_a_replica_count_is_decided_from_as_few_worlds_as_it_takes():
    read: list[float] = []

    def values(*v: float):
        for x in v:
            read.append(x)
            yield x

    assert not decided(values(5, 5, 1, 1, 1), limit=2, worlds=5, needed=4)
    assert read == [5, 5]  # two of five miss: four cannot meet it
    read.clear()
    assert decided(values(1, 5, 1, 5, 5), limit=2, worlds=5, needed=1) and read == [1]


def test_runs_of_worlds_the_spread_allows_fall_inside_the_intervals(calm):
    """Held-out "measured" runs: 45 s each at half the capacity, each in a world drawn at
    random from the calibration's spread with a workload seed the prediction never used."""
    cal, capacity = calm
    rate = round(0.5 * capacity, 2)
    summary = predicted(cal, rate, 45.0, None, Intervals(draws=20))
    inside = []
    for k in range(20):
        bench = BenchConfig(workload=WorkloadConfig(seed=1000 + k), duration_s=45.0,
                            arrivals=ArrivalConfig(process="poisson", rate=rate, seed=1000 + k),
                            warmup_s=5.0, cooldown_s=2.0)
        workload = reseeded(bench, 20_000)(0)
        config = on_clock(settings(bench, cal, "test", Fleet()), workload)
        result = simulate(workload, cal, Fleet(), Draw.make(CALM, [77, k]))
        table = request_table(result, workload.ensure(len(result)), workload.config.api)
        measured = summarize(table, run_window(config, table))
        for m in METRICS:
            for q in PERCENTILES:
                p = summary.latency[m].percentiles[q]
                inside.append(p.lo <= measured.latency[m].percentiles[q].value <= p.hi)
    assert np.mean(inside) >= 0.85, np.mean(inside)
