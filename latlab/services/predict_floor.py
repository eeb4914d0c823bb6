"""How much of a predicted interval is the run's own luck: its *floor*.

A predicted interval is where the percentile of one run of the asked length will fall
(`predict_intervals`), that run's own luck included. The percentile's spread between runs of
one world is that luck, which no calibration can take away; the runs of each world say how
large it is (`run_floors`), and a run too short for an interval `WIDE` wide gets one line
saying so, with the length that would give one (`too_short`).

    floors = run_floors(outcomes, intervals, requests)   # the draws' runs, world by world
    line = too_short(summary, floors, requests, rate)    # None: narrow enough, or no use
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from latlab.records.summary import RunSummary

WIDE = 1.5  # hi/lo: an interval narrow enough to decide with
DECIDING = tuple((m, q) for m in ("ttft", "tpot", "e2e") for q in ("p50", "p90", "p99"))


class WorldRun(Protocol):
    """A simulated run and the drawn world it ran in (`predict_intervals.DrawOutcome`)."""

    @property
    def summary(self) -> RunSummary: ...

    @property
    def world(self) -> int: ...


class Level(Protocol):
    """The intervals' level, as its tails (`predict_intervals.Intervals`)."""

    @property
    def tail(self) -> float: ...


@dataclass(frozen=True)
class Floor:
    """One percentile's width (hi/lo, at the intervals' level) split in two: how far it
    moves between runs of one world (`run`: the run's own luck, its floor) and how far the
    worlds differ (`level`), and the requests a run would need for the two together to be at
    most `WIDE` (None: no length does — the worlds alone are wider)."""

    metric: str
    percentile: str
    run: float
    level: float
    requests_needed: int | None

    @property
    def named(self) -> str:
        return f"{self.metric.upper()} {self.percentile}"


def run_floors(outcomes: Sequence[WorldRun], intervals: Level, requests: int
               ) -> list[Floor]:
    """The `DECIDING` percentiles' floors, from worlds of several runs (of `requests` each):
    the variance of log(percentile) within a world (pooled) and between the worlds beyond it,
    each read as a normal's central `intervals.level`; a percentile's variance from run to
    run falls as 1/requests, so the length for `WIDE` is where the two add up to it."""
    from scipy.special import ndtri  # the normal's quantile, without scipy.stats' import

    z2 = 2 * float(ndtri(1 - intervals.tail))  # a normal's central interval: ±z sd
    goal = math.log(WIDE) / z2  # the sd that makes an interval WIDE wide
    floors = []
    for metric, pname in DECIDING:
        worlds: dict[int, list[float]] = {}
        for o in outcomes:
            v = percentile_value(o.summary, "latency", metric, pname)
            if v is not None and v > 0 and math.isfinite(v):
                worlds.setdefault(o.world, []).append(math.log(v))
        runs = [np.asarray(v) for v in worlds.values() if len(v) >= 2]
        if len(runs) < 2:
            continue
        within = float(sum(((v - v.mean()) ** 2).sum() for v in runs)
                       / sum(len(v) - 1 for v in runs))
        means = [float(v.mean()) for v in runs]
        between = max(0.0, float(np.var(means, ddof=1))
                      - within * float(np.mean([1 / len(v) for v in runs])))
        needed = (math.ceil(requests * within / (goal ** 2 - between))
                  if between < goal ** 2 else None)
        floors.append(Floor(metric, pname, math.exp(z2 * math.sqrt(within)),
                            math.exp(z2 * math.sqrt(between)), needed))
    return floors


def too_short(summary: RunSummary, floors: Sequence[Floor], requests: int,
              rate: float | None = None) -> str | None:
    """One line where a `DECIDING` percentile's interval (finite) is wider than `WIDE` and a
    longer run would narrow it: the run's floor and the length for `WIDE` (its time at the
    offered `rate`, req/s); or where no length would (the worlds alone are wider): what the
    width comes from then."""
    wide = []
    for f in floors:
        p = summary.latency[f.metric].percentiles.get(f.percentile)
        if p is not None and p.lo and p.hi is not None and math.isfinite(p.hi) and (
                p.hi / p.lo > WIDE):
            wide.append(f)
    if not wide:
        return None
    stuck = [f for f in wide if f.requests_needed is None]
    if stuck:
        worst = max(stuck, key=lambda f: f.level)
        return (f"no run length gives intervals {WIDE:g}× wide: the drawn worlds alone (the "
                f"calibration's level: how far the machine's speed moved while it was "
                f"calibrated) span {worst.level:.2f}× at {worst.named}; calibrate again with "
                f"the machine as it will be")
    worst = max(wide, key=lambda f: f.requests_needed or 0)
    if worst.requests_needed is None or worst.requests_needed <= requests:
        return None
    seconds = (f" ({_duration(worst.requests_needed / rate)} at {rate:.2f} req/s)"
               if rate else "")
    return (f"a run of {requests:,} requests is too short for intervals {WIDE:g}× wide: the "
            f"slowest to narrow, {worst.named}, alone moves {worst.run:.2f}× from one run to "
            f"the next (its floor); from about {_rounded(worst.requests_needed):,} "
            f"requests{seconds} every TTFT, TPOT and E2E p50–p99 interval would be")


def widest(floors: Sequence[Floor]) -> Floor | None:
    """The percentile that moves most from run to run (the intervals' line names it)."""
    return max(floors, key=lambda f: f.run, default=None)


def _rounded(n: int) -> int:
    """`n` rounded up to two significant digits."""
    step = 10 ** max(0, len(str(n)) - 2)
    return -(-n // step) * step


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"


def percentile_value(s: RunSummary, group: str, name: str, pname: str) -> float | None:
    """`s`'s percentile `pname` of `group`'s metric `name`; None when it has none."""
    dist = getattr(s, group).get(name)
    p = dist.percentiles.get(pname) if dist is not None else None
    return p.value if p is not None else None
