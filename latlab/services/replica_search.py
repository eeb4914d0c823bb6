"""The replica counts `predict --replicas-for` tries: a count's goal values (`Count`), the
search that finds the fewest meeting a rule (steps of 1, 2, 4, … then bisection), and the
plateau where more replicas stop helping (`Plateau`: a latency floor, not capacity,
decides)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from latlab.records.predict import Goal
from latlab.services.predict_intervals import quantile

MAX_REPLICAS = 4096
PLATEAU_CHANGE = 0.02  # of the draws' median: more replicas moved it less


@dataclass
class Count:
    """One replica count tried: the goal's value at the point estimate and in each drawn
    world tried so far (`by_world`: world → value; a search stops drawing a count's worlds
    once its answer is decided)."""

    value: float
    by_world: dict[int, float] = field(default_factory=dict)

    @property
    def draws(self) -> list[float]:
        return [self.by_world[d] for d in sorted(self.by_world)]

    def met(self, limit: float) -> float:
        """The share of the worlds tried that meet the goal."""
        v = self.draws
        return sum(x <= limit for x in v) / len(v) if v else math.nan


def decided(values: Iterator[float], limit: float, worlds: int, needed: int) -> bool:
    """Whether at least `needed` of `worlds` values meet `limit`, reading no more of
    `values` than it takes to know."""
    meets = misses = 0
    for v in values:
        if v <= limit:
            meets += 1
        else:
            misses += 1
        if meets >= needed:
            return True
        if misses > worlds - needed:
            return False
    return meets >= needed


def fewest(fails: int, meets: int, ok: Callable[[int], bool]) -> int:
    """The fewest count in (`fails`, `meets`] for which `ok` holds, by bisection (`ok` is
    false at `fails`, true at `meets`, and stays true as the count grows)."""
    while meets - fails > 1:
        mid = (fails + meets) // 2
        fails, meets = (fails, mid) if ok(mid) else (mid, meets)
    return meets


def fewest_below(meets: int, ok: Callable[[int], bool]) -> int:
    """The fewest count up to `meets` (where `ok` holds) for which `ok` holds: steps of 1, 2,
    4, … down until it fails, then bisected (the answer is usually near)."""
    step = 1
    while meets - step >= 1 and ok(meets - step):
        meets, step = meets - step, 2 * step
    return fewest(max(meets - step, 0), meets, ok)


def provisioned(point: int, enough: Callable[[int], bool], drawn: Callable[[int], Count],
                 goal: Goal, tail: float, tried: Callable[[int], Count] | None = None
                 ) -> tuple[int, Plateau | None]:
    """The fewest replicas that meet the goal in all but the draws' unfavourable tail: steps
    of 1, 2, 4, … up from `point` until it does, then bisected; or, when a step of two or
    more changes neither the latencies of the worlds both were tried in (`tried`: a count
    as far as `enough` drew it; `drawn` when not given) nor how many of them meet the goal,
    the plateau where more replicas stop helping (its count drawn in every world)."""
    tried = tried or drawn
    if enough(point):
        return point, None
    fails, step = point, 1
    while fails < MAX_REPLICAS:
        more = min(fails + step, MAX_REPLICAS)
        if enough(more):
            return fewest(fails, more, enough), None
        if more - fails >= 2 and _flat(tried(fails), tried(more), goal.limit_ms):
            return fails, Plateau.of(fails, drawn(fails), goal, tail)
        fails, step = more, 2 * step
    return fails, Plateau.of(fails, drawn(fails), goal, tail)


def _flat(fewer: Count, more: Count, limit: float) -> bool:
    """More replicas, the same latency in the worlds both counts were tried in (the slowest,
    which decide what to provision): the number of them that meet the goal moved by at most
    one, and their median by under `PLATEAU_CHANGE`."""
    common = sorted(set(fewer.by_world) & set(more.by_world))
    if not common:
        return False
    a = [fewer.by_world[d] for d in common]
    b = [more.by_world[d] for d in common]
    same_share = abs(sum(v <= limit for v in a) - sum(v <= limit for v in b)) <= 1
    return same_share and same_latency(float(np.median(a)), float(np.median(b)))


def same_latency(fewer: float, more: float) -> bool:
    """Whether a latency with more replicas is the one with fewer (within `PLATEAU_CHANGE`;
    an infinite one, a queue that grows, is no floor)."""
    return math.isfinite(fewer) and abs(more - fewer) <= PLATEAU_CHANGE * fewer


@dataclass(frozen=True)
class Plateau:
    """From `replicas` on, more replicas leave the goal's percentile where it is: a latency
    floor (a request's own time, not capacity) decides. `met` is the share of the drawn
    worlds that meet the goal there, `floor` the draws' median, and `limit_needed` the
    limit that all but the unfavourable tail of them would meet."""

    replicas: int
    met: float
    floor: float
    limit_needed: float

    @classmethod
    def of(cls, replicas: int, count: Count, goal: Goal, tail: float) -> Plateau:
        return cls(replicas, count.met(goal.limit_ms), float(np.median(count.draws)),
                   quantile(count.draws, 1 - tail))
