"""The machine's slow stretches (seeded): fitted from steps in time order, the process's
known parameters come back; drawn, the simulated steps carry the correlation and the tail
the fit saw; with none, a drawn world simulates exactly as it did without them; and both
sides of a change see the same stretches."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sim_helpers import calibration, open_loop

from latlab.records.calibration import RequestSpread, Spread, Stretch, Stretches
from latlab.sim import stretches as stretch
from latlab.sim.fleet import simulate
from latlab.sim.spread import estimate
from latlab.sim.world import Draw

STEP_S = 0.025  # a step every 25 ms, as the calibration's probes serve them


def steps_of(stretches: Stretches, seconds: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Log misfits of steps every `STEP_S` over `seconds`, drawn from `stretches` exactly (the
    process at each step's own time, not held on slices), and their start times."""
    rng = np.random.default_rng(seed)
    t = np.arange(0.0, seconds, STEP_S)
    x = np.zeros(len(t))
    for part in stretches.parts:
        rho = math.exp(-STEP_S / part.tau_s)
        z = rng.standard_normal(len(t))
        y = np.empty(len(t))
        y[0] = part.sd * z[0]
        for i in range(1, len(t)):
            y[i] = rho * y[i - 1] + part.sd * math.sqrt(1 - rho ** 2) * z[i]
        x += y
    return x + stretches.jitter * rng.standard_normal(len(t)), t


def lag1(x: np.ndarray) -> float:
    x = x - x.mean()
    return float(np.sum(x[1:] * x[:-1]) / np.sum(x * x))


KNOWN = Stretches(parts=[Stretch(sd=0.25, tau_s=0.1), Stretch(sd=0.2, tau_s=2.0)], jitter=0.15)


def test_the_fit_recovers_known_stretches_from_steps_in_time_order():
    runs = [steps_of(KNOWN, 60.0, seed) for seed in range(4)]
    r = np.concatenate([x for x, _ in runs])
    t = np.concatenate([t + 100 * i for i, (_, t) in enumerate(runs)])
    fitted = stretch.fit(r, t, np.repeat(np.arange(4), [len(x) for x, _ in runs]))
    fast, slow = fitted.parts
    assert fast.tau_s == pytest.approx(0.1, rel=0.5)
    assert slow.tau_s == pytest.approx(2.0, rel=0.5)
    assert slow.sd == pytest.approx(0.2, rel=0.2)
    # a part of 0.1 s is nearly a step's own at a step every 25 ms: together they come back
    assert math.hypot(fast.sd, fitted.jitter) == pytest.approx(math.hypot(0.25, 0.15),
                                                                rel=0.1)
    # independent steps: no stretches worth the name
    white = np.random.default_rng(9).standard_normal(len(r)) * 0.3
    none = stretch.fit(white, t, np.repeat(np.arange(4), [len(x) for x, _ in runs]))
    assert all(p.sd < 0.06 for p in none.parts)
    assert none.jitter == pytest.approx(0.3, rel=0.1)


def test_a_run_too_short_to_tell_fits_none():
    x, t = steps_of(KNOWN, 1.0, 1)
    assert stretch.fit(x, t, np.zeros(len(x))) is None


def test_drawn_stretches_carry_the_correlation_and_the_tail_of_the_steps_fitted():
    """The fitted process, drawn as the simulator draws it (held on slices, each step's own
    jitter), against the steps it was fitted on: the lag-1 autocorrelation of the steps
    and the share beyond 2× the median (the slow tail)."""
    x, t = steps_of(KNOWN, 120.0, 3)
    fitted = stretch.fit(x, t, np.zeros(len(x)))
    world = stretch.StretchDraw(fitted, np.random.default_rng(1), np.random.default_rng(2))
    drawn = np.log([world.factor(s) * world.step() for s in t])
    assert lag1(drawn) == pytest.approx(lag1(x), abs=0.12)
    assert np.percentile(drawn, 99) - np.median(drawn) == pytest.approx(
        np.percentile(x, 99) - np.median(x), abs=0.15)
    # without the stretches (white steps of the same spread) the correlation is gone
    assert abs(lag1(np.random.default_rng(4).standard_normal(len(x)))) < 0.05 < lag1(x) - 0.3


def test_a_served_calibrations_drift_and_level_leave_out_what_the_stretches_explain():
    """Probes whose steps drift only by their stretches: the window drift and the level
    between probes come out small once the stretches are fitted, large without."""
    runs = [steps_of(KNOWN, 25.0, seed) for seed in range(3)]
    r = np.concatenate([x for x, _ in runs])
    t = np.concatenate([t for _, t in runs])
    which = np.repeat(np.arange(3), [len(x) for x, _ in runs])
    fitted = np.full(len(r), 25.0)
    with_, _ = estimate(r, fitted, t, which, with_stretches=True)
    without, _ = estimate(r, fitted, t, which)
    assert with_.stretches is not None and without.stretches is None
    assert with_.drift < without.drift


SPREAD = Spread(step=0.1, shape=0.03, drift=0.05, between=0.0, windows=20, runs=4,
                request=RequestSpread(preprocess=0.5, network=0.2, postprocess=0.3))


def test_without_stretches_a_world_simulates_as_it_always_did():
    """`stretches` None: no stream is read for them, no decode run is cut — the same
    columns as a draw made before they existed (its speed the window's alone)."""
    cal = calibration().model_copy(update={"spread": SPREAD})
    workload = open_loop(8.0, 400)
    draw = Draw.make(SPREAD, [25, 1], 0.3)
    assert draw.stretches is None and draw.steady_until(3.0) == math.inf
    assert draw.step_speed(12.0) == draw.speed(12.0)
    a = simulate(workload, cal, draw=draw).columns
    b = simulate(workload, cal, draw=Draw.make(SPREAD, [25, 1], 0.3)).columns
    assert np.array_equal(a.done, b.done)
    # stretches of zero (their level aside: with stretches the drift is a run's level too)
    zero = Draw.make(SPREAD.model_copy(update={"stretches": Stretches(
        parts=[Stretch(sd=0.0, tau_s=1.0)], jitter=0.0)}), [25, 1], 0.3)
    zero.level = draw.level
    assert np.array_equal(a.done, simulate(workload, cal, draw=zero).columns.done)


def test_both_sides_of_a_change_see_the_same_stretches_and_tails_widen():
    slow = SPREAD.model_copy(update={"stretches": KNOWN})
    a, b = Draw.make(slow, [25, 3]), Draw.make(slow, [25, 3])
    times = [0.0, 0.3, 4.0, 17.5]
    assert [a.speed(t) for t in times] == [b.speed(t) for t in times[::-1]][::-1]
    assert a.steady_until(0.3) == pytest.approx(0.3 + a.stretches.slice_s, abs=a.stretches.slice_s)
    assert [a.step_speed(1.0) for _ in range(3)] == [b.step_speed(1.0) for _ in range(3)]
    cal = calibration().model_copy(update={"spread": slow})
    workload = open_loop(8.0, 600)
    calm = simulate(workload, calibration().model_copy(update={"spread": SPREAD}),
                    draw=Draw.make(SPREAD, [25, 3], 0.5)).columns
    rough = simulate(workload, cal, draw=Draw.make(slow, [25, 3], 0.5)).columns

    def tpot(c):
        n = c.output - 1
        ok = n > 2
        return (c.done - c.first_scheduled)[ok] / n[ok]

    spread_calm = np.percentile(tpot(calm), 99) / np.median(tpot(calm))
    spread_rough = np.percentile(tpot(rough), 99) / np.median(tpot(rough))
    assert spread_rough > spread_calm * 1.1


def test_a_machine_slow_more_often_than_fast_keeps_its_skew_when_drawn():
    """Misfits skewed right (slow steps reach further than fast ones): the fitted shape
    holds it, and the drawn steps' upper and lower tails are the measured ones, not a
    normal's mirror image."""
    x, t = steps_of(KNOWN, 120.0, 5)
    skewed = np.where(x > 0, 1.8 * x, 0.6 * x)
    fitted = stretch.fit(skewed, t, np.zeros(len(x)))
    assert fitted.shape[-1] > 2.5 > -fitted.shape[0]  # beyond a normal's on the slow side
    world = stretch.StretchDraw(fitted, np.random.default_rng(1), np.random.default_rng(2))
    drawn = np.log([world.factor(s) * world.step() for s in t])
    for q in (1, 99):
        assert np.percentile(drawn, q) - np.median(drawn) == pytest.approx(
            np.percentile(skewed, q) - np.median(skewed), abs=0.15), q
    assert np.mean(np.exp(drawn)) == pytest.approx(1.0, abs=0.05)  # centred: the mean cost


def test_a_shape_not_at_every_score_or_not_rising_is_refused_with_its_reason():
    fitted = stretch.shape_of(np.random.default_rng(3).gamma(2.0, size=2000))
    assert len(fitted) == len(stretch.SCORES)  # what the fit writes is read back
    assert Stretches(parts=[], shape=fitted).shape == fitted
    for shape in ([0.1, 0.2], fitted[::-1]):
        with pytest.raises(ValueError, match="11 quantiles in rising order"):
            Stretches(parts=[], shape=shape)


def test_the_steps_own_factors_drawn_in_blocks_are_the_ones_drawn_one_by_one():
    """`StretchDraw.step` draws its normals a block at a time: the same numbers, in the same
    order, as a normal a step from the same seed (so a seed's predictions stay the same),
    across blocks, each through the misfits' (skewed) shape, tails beyond its points too."""
    shape = stretch.shape_of(np.random.default_rng(0).lognormal(0.0, 0.6, 5000))
    found = Stretches(parts=[Stretch(sd=0.1, tau_s=1.0)], jitter=0.3, shape=shape)
    draw = stretch.StretchDraw(found, np.random.default_rng(1), np.random.default_rng(2))
    steps = 2 * stretch.STEP_BLOCK + 7
    blocked = [draw.step() for _ in range(steps)]
    rng, mapped = np.random.default_rng(2), stretch.Shape(shape)
    z = [rng.standard_normal() for _ in range(steps)]
    centre = mapped.centre(found.jitter)
    assert blocked == [math.exp(found.jitter * mapped(v) + centre) for v in z]
    assert min(z) < stretch.SCORES[0] and max(z) > stretch.SCORES[-1]  # the tails were met
