"""When to send: closed-loop users, or an open-loop schedule of arrival times.

Open-loop arrival times are offsets in seconds from the run's start `t0`, an absolute
schedule: a request keeps its scheduled time however late the client sends it. A linear
ramp warps a unit-rate process through the ramp's cumulative rate (time rescaling), so
Poisson stays Poisson and gamma keeps its burstiness while the rate grows.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from time import perf_counter_ns

import numpy as np

from latlab.load.workload.traces import Trace, window
from latlab.records.arrivals import ArrivalConfig

_BLOCK = 4096


class ArrivalError(ValueError):
    """An arrival option or trace that cannot be used; the message names it."""


def arrival_times(config: ArrivalConfig) -> Iterator[float]:
    """Arrival offsets (s) from the run's start, non-decreasing, the first at 0. Endless,
    except for a trace (its window from --trace-start, at --trace-speed, read lazily)."""
    if config.process == "trace":
        for replayed in window(Trace(config.trace), config.trace_start_s, config.trace_speed):
            yield replayed.offset_s
        return
    rng = np.random.default_rng([config.seed, 2])
    shape = config.burstiness
    start = 0.0
    first = True
    while True:
        if config.process == "constant":
            gaps = np.ones(_BLOCK)
        elif config.process == "poisson":
            gaps = rng.exponential(1.0, _BLOCK)
        else:
            gaps = rng.gamma(shape, 1.0 / shape, _BLOCK)
        if first:
            gaps[0] = 0.0
            first = False
        points = start + np.cumsum(gaps)
        start = float(points[-1])
        yield from _unwarp(points, config.rate, config.ramp_s).tolist()


def _unwarp(unit_points: np.ndarray, rate: float, ramp_s: float) -> np.ndarray:
    """Times t at which the ramp's cumulative rate Λ(t) reaches each unit-rate point."""
    if ramp_s <= 0:
        return unit_points / rate
    ramp_area = rate * ramp_s / 2  # Λ at the end of the ramp
    during = np.sqrt(2 * ramp_s * np.minimum(unit_points, ramp_area) / rate)
    return np.where(unit_points < ramp_area, during, ramp_s + (unit_points - ramp_area) / rate)


def user_start_times(users: int, ramp_s: float) -> list[float]:
    """Closed loop: user u starts at u/users of the ramp (all at 0 without one)."""
    return [ramp_s * u / users for u in range(users)]


async def sleep_until(t_ns: int) -> None:
    """Sleep until `t_ns` (perf_counter_ns); the loop's 1 ms timers may wake early, so check
    and go again. It yields at least once, so a schedule that is all due (a burst) still
    lets the loop run its other work (a Ctrl-C, a stream) between two dispatches."""
    await asyncio.sleep(0)
    while (delay := t_ns - perf_counter_ns()) > 0:
        await asyncio.sleep(delay / 1e9)
