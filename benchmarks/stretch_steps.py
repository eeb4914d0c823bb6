"""How fast a drawn world gives each step its own factor (`sim.stretches.StretchDraw.step`):
before, one normal a step from the generator, mapped through the misfits' shape one by one;
now, `STEP_BLOCK` normals at a time, mapped together. Side by side in one run, each the best
of `--rounds` interleaved rounds, and the same factors asserted from the same seed.

    python benchmarks/stretch_steps.py                          # 200 000 steps, 5 rounds
    python benchmarks/stretch_steps.py --calibration C --draws 4 --draw-requests 5000

The stretches are a calibration's (`--calibration`) with a skewed shape put in when it has
none (so the shape's mapping is timed), else made up alike. With `--calibration`, also what
it changes in `latlab predict`: the intervals' draws (world after world, each simulated and
summarised) with the step of before and of now, their summaries asserted the same.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from latlab.records.arrivals import ArrivalConfig
from latlab.records.bench import BenchConfig
from latlab.records.calibration import Stretch, Stretches
from latlab.records.simulation import Fleet
from latlab.records.workload import WorkloadConfig
from latlab.sim import calibration as calibrations
from latlab.sim.stretches import SCORES, STEP_BLOCK, StretchDraw, shape_of


def one_by_one(self: StretchDraw) -> float:
    """`StretchDraw.step` as it was: a scalar normal, the shape's scalar mapping."""
    if self._jitter <= 0:
        return 1.0
    z = self._step_rng.standard_normal()
    q = self._shape.points
    if not q:
        shaped = z
    elif z <= SCORES[0]:
        shaped = q[0] + (z - SCORES[0]) * (q[1] - q[0]) / 0.5
    elif z >= SCORES[-1]:
        shaped = q[-1] + (z - SCORES[-1]) * (q[-1] - q[-2]) / 0.5
    else:
        shaped = float(np.interp(z, SCORES, q))
    return math.exp(self._jitter * shaped + self._jitter_centre)


BLOCKED = StretchDraw.step
WAYS = {"one by one (before)": one_by_one, f"blocks of {STEP_BLOCK} (now)": BLOCKED}


def skewed_shape() -> list[float]:
    """A busy host's misfits: slow far more often than fast (a shifted lognormal)."""
    return shape_of(np.random.default_rng(0).lognormal(0.0, 0.6, 20_000))


def stretches_of(path: Path | None) -> Stretches:
    if path is not None:
        spread = calibrations.load(path).spread
        if spread is not None and spread.stretches is not None:
            found = spread.stretches
            return found if found.shape else found.model_copy(update={"shape": skewed_shape()})
        print(f"{path} has no stretches: made-up ones instead")
    return Stretches(parts=[Stretch(sd=0.15, tau_s=1.5), Stretch(sd=0.05, tau_s=0.2)],
                     jitter=0.1, shape=skewed_shape())


def all_equal(results: Iterable[object]) -> bool:
    """Whether every way gave what the first did."""
    first, *others = results
    return all(other == first for other in others)


def time_steps(stretches: Stretches, steps: int, rounds: int) -> None:
    best = dict.fromkeys(WAYS, math.inf)
    factors: dict[str, list[float]] = {}
    for _ in range(rounds):
        for name, step in WAYS.items():
            draw = StretchDraw(stretches, np.random.default_rng(1), np.random.default_rng(2))
            started = time.perf_counter()
            got = [step(draw) for _ in range(steps)]
            best[name] = min(best[name], time.perf_counter() - started)
            factors.setdefault(name, got)
    same = all_equal(factors.values())
    print(f"{steps:,} steps' own factors (jitter {stretches.jitter:.3f}, "
          f"{len(stretches.shape)} shape points), best of {rounds} rounds:")
    for name, seconds in best.items():
        print(f"  {name:<24} {seconds / steps * 1e9:>7.0f} ns/step  {seconds:>6.3f} s")
    before, now = best.values()
    print(f"  {before / now:.1f}× as fast; the same factors from the same seed: {same}")
    assert same, "the blocked draw changed the factors"


def time_draws(path: Path, stretches: Stretches, draws: int, requests: int,
               rounds: int) -> None:
    from latlab.services.predict import settings
    from latlab.services.predict_intervals import Intervals, reseeded, run_draws

    cal = calibrations.load(path)
    cal = cal.model_copy(update={"spread": cal.spread.model_copy(
        update={"stretches": stretches})})
    bench = BenchConfig(workload=WorkloadConfig(),
                        arrivals=ArrivalConfig(process="poisson", rate=2.0),
                        requests=requests, duration_s=None)
    intervals = Intervals(draws=draws, requests=requests)
    config = settings(bench, cal, str(path), Fleet())
    summaries: dict[str, list[str]] = {}
    cpu = dict.fromkeys(WAYS, math.inf)
    for _ in range(rounds):
        for name, step in WAYS.items():
            StretchDraw.step = step
            try:
                started = time.process_time()
                outcomes = run_draws(cal, reseeded(bench, requests), Fleet(), config,
                                     intervals)
                cpu[name] = min(cpu[name], time.process_time() - started)
            finally:
                StretchDraw.step = BLOCKED
            summaries.setdefault(name, [o.summary.model_dump_json() for o in outcomes])
    same = all_equal(summaries.values())
    print(f"predict's intervals: {draws} draws of {requests:,} requests at 2 req/s, CPU "
          f"seconds (the process's own), best of {rounds} interleaved rounds:")
    for name, seconds in cpu.items():
        print(f"  {name:<24} {seconds:>6.2f} s")
    print(f"  the same summaries: {same}")
    assert same, "the blocked draw changed a prediction"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calibration", type=Path, help="a calibration file")
    parser.add_argument("--draws", type=int, default=4, help="with --calibration")
    parser.add_argument("--draw-requests", type=int, default=5000)
    parser.add_argument("--draw-rounds", type=int, default=3)
    args = parser.parse_args()
    if args.calibration is not None and not args.calibration.is_file():
        raise SystemExit(f"--calibration {args.calibration}: no such file")
    print(f"load average {'/'.join(f'{x:.2f}' for x in os.getloadavg())} at the start")
    stretches = stretches_of(args.calibration)
    time_steps(stretches, args.steps, args.rounds)
    if args.calibration is not None:
        time_draws(args.calibration, stretches, args.draws, args.draw_requests,
                   args.draw_rounds)
    print(f"load average {'/'.join(f'{x:.2f}' for x in os.getloadavg())} at the end")


if __name__ == "__main__":
    main()
