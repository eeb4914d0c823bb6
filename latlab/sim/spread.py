"""How far a calibration's timings strayed from its fit (`Spread`), and the distribution of
levels a prediction's worlds draw from it (`level_quantile`; a world itself: `world.Draw`).

    spread, by_size = estimate(*misfit(cost, x, ms), times, runs)  # the fit's samples
    level_quantile(spread, 0.95)   # the level (log factor) 95% of the worlds stay below

Where the linear model is off by the size of step the same way in every run, that is no
uncertainty: the step cost charges it (`by_size`, `size_factors`). What is left varies: a
world's step costs sit at a *level* off the fit (the machine faster or slower than when it
was timed; a workload of other steps, as far as the factors by size are themselves
uncertain), drawn from a Student t over the level's spread between runs and the factors'
error (few runs: wide tails), and drift around it from one window of `window_s` seconds to
the next (the machine's speed moving within a run); within a window, the machine's slow
stretches (`stretches`: served steps only). Each request's costs outside the engine vary by
their own spread.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from latlab.records.calibration import (
    Calibration,
    RequestSpread,
    SizeFactor,
    Spread,
    StepCost,
)
from latlab.sim import stretches as stretch
from latlab.sim.stepcost import FEATURES, design

WINDOW_S = 10.0
SHAPE_GROUPS = 10
MIN_WINDOW = 5  # samples a window needs to count
ONE_RUN = 0.9  # a group by size whose samples are more than this share one run's: no factor
NOISE_FLOOR = 1e-6  # the least sd of a misfit: timings that tie (quantized) are not exact


def fitted_ms(cost: StepCost, x: np.ndarray) -> np.ndarray:
    """What `cost` charges (ms) for each row of features `x` (`stepcost.features`)."""
    coef = np.array([cost.coefficients.get(name, 0.0) for name in FEATURES] + list(cost.hinges))
    return np.maximum(design(x, cost.knots) @ coef, 1e-4)


def robust_sd(values: np.ndarray) -> float:
    """The standard deviation, from the median absolute deviation (outliers barely count)."""
    if len(values) < 2:
        return 0.0
    return float(1.4826 * np.median(np.abs(values - np.median(values))))


def _beyond_noise(means: list[float], noise: list[float]) -> float:
    """The spread of group means beyond what their own sampling noise (variances) explains."""
    if len(means) < 2:
        return 0.0
    return math.sqrt(max(0.0, float(np.var(means, ddof=1)) - float(np.mean(noise))))


def misfit(cost: StepCost, x: np.ndarray, ms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """log(measured / fitted) of timings `ms` against what `cost`'s linear model charges for
    their features `x`, and what it charges a step (a sample may sum several)."""
    fitted = fitted_ms(cost, x)
    return np.log(np.asarray(ms, dtype=float) / fitted), fitted / np.maximum(x[:, 0], 1.0)


@dataclass(frozen=True)
class BySize:
    """The linear model's misfit by the size of step (`size_factors`): the `factors` to
    charge, what is left of the misfits after them (`left`, one a sample), and how far a
    workload of other steps may still sit off (`sd`, with `dof` degrees of freedom)."""

    factors: list[SizeFactor]
    left: np.ndarray
    sd: float
    dof: float


def size_factors(r: np.ndarray, fitted: np.ndarray, runs: np.ndarray) -> BySize:
    """The misfits `r` (of samples the linear model charged `fitted` ms, timed in `runs`)
    in `SHAPE_GROUPS` groups by fitted time: each group's factor, fitted together with each
    run's own level, as the mean time over the fitted (the log of it), shrunk towards the
    others' by its own noise (a group that differs by no more than chance gets no factor of
    its own: empirical Bayes), at the group's median fitted time. A systematic misfit across
    step sizes is charged this way, not drawn as a whole run's level; what stays uncertain
    is each factor's own error. A group of one run's samples alone (a probe of lone
    decodes, say) gets no factor: whether its steps were slow for their size or for the
    moment they were timed is not in the data, and that is left to the level between
    runs."""
    runs = np.asarray(runs)
    several = len(np.unique(runs)) > 1
    order = np.argsort(fitted)
    groups = [g for g in np.array_split(order, SHAPE_GROUPS) if len(g) >= MIN_WINDOW]
    groups = [g for g in groups if not several or max(
        np.unique(runs[g], return_counts=True)[1]) <= ONE_RUN * len(g)]
    rows = np.concatenate(groups) if groups else np.zeros(0, dtype=int)
    _, run = np.unique(runs[rows], return_inverse=True)
    dof = len(rows) - len(groups) - (run.max() if len(run) else 0)
    if len(groups) < 2 or dof < 1:  # too few samples for the groups and the runs' levels
        return BySize([], r, 0.0, math.inf)
    noise = max(NOISE_FLOOR, robust_sd(np.concatenate([r[g] - np.median(r[g])
                                                       for g in groups]))) ** 2
    cut = 3 * math.sqrt(noise)  # a step another process slowed: counted, not decisive
    group = np.repeat(np.arange(len(groups)), [len(g) for g in groups])
    kept = np.concatenate([np.clip(r[g], np.median(r[g]) - cut, np.median(r[g]) + cut)
                           for g in groups])
    columns = np.zeros((len(rows), len(groups) + run.max()))
    columns[np.arange(len(rows)), group] = 1.0
    others = np.flatnonzero(run > 0)  # the first run's level is the reference
    columns[others, len(groups) + run[others] - 1] = 1.0
    coef = np.linalg.lstsq(columns, kept, rcond=None)[0]
    shift = float(np.r_[0.0, coef[len(groups):]][run].mean())  # the average sample's run
    residual = kept - columns @ coef
    means, errors = [], []
    for j, g in enumerate(groups):
        # the mean time, not the median: what queues see
        means.append(float(coef[j] + shift + np.log(np.mean(np.exp(residual[group == j])))))
        errors.append(noise / len(g))
    centre = float(np.average(means, weights=[1 / e for e in errors]))
    apart = max(0.0, float(np.var(means, ddof=1)) - float(np.mean(errors)))  # beyond noise
    shrunk = [centre + (m - centre) * apart / (apart + e) for m, e in zip(means, errors)]
    left_var = [apart * e / (apart + e) if apart > 0 else e / len(groups) for e in errors]
    at = [float(np.median(fitted[g])) for g in groups]
    factors = [SizeFactor(ms=ms, factor=math.exp(m)) for ms, m in zip(at, shrunk)]
    left = r - np.interp(np.log(fitted), np.log(at), shrunk)
    return BySize(factors, left, math.sqrt(float(np.mean(left_var))), float(dof))


def estimate(r: np.ndarray, fitted: np.ndarray, times: np.ndarray, runs: np.ndarray,
             window_s: float = WINDOW_S, request: RequestSpread | None = None,
             with_stretches: bool = False) -> tuple[Spread, list[SizeFactor]]:
    """The spread of the misfits `r` (`misfit`; the linear model charged `fitted`) of
    samples timed at `times` (seconds) in the `runs` they belong to, and the factors by size
    that take the systematic part of it (`size_factors`: the step cost's `by_size`); the
    drift and the level between runs are those of what the factors leave. `with_stretches`
    (samples that are single steps in time order, as served): how each step's misfit
    carries over to the next (`stretches.fit`), and the drift and the level between runs
    beyond what those stretches make of a window's and a run's mean."""
    r, fitted = np.asarray(r, dtype=float), np.asarray(fitted, dtype=float)
    times, runs = np.asarray(times, dtype=float), np.asarray(runs)
    step = robust_sd(r)
    by_size = size_factors(r, fitted, runs)
    r = by_size.left
    noise = robust_sd(r) ** 2
    stretches = stretch.fit(r, times, runs) if with_stretches else None
    if stretches is not None:  # the steps' own noise: what the stretches leave
        noise = stretches.jitter ** 2
    per_run = []  # each run's windows: (mean misfit, samples), and its span (s)
    for run in np.unique(runs):
        rr, tt = r[runs == run], times[runs == run]
        slot = np.floor((tt - tt.min()) / window_s)
        windows = [(float(rr[slot == s].mean()), int((slot == s).sum()))
                   for s in np.unique(slot) if (slot == s).sum() >= MIN_WINDOW]
        if windows:
            per_run.append((windows, float(tt.max() - tt.min())))
    deviations = [m - np.mean([w[0] for w in run]) for run, _ in per_run for m, _ in run]
    sizes = [n for run, _ in per_run for _, n in run]
    dof = len(deviations) - len(per_run)
    slow = (float(np.mean([stretch.window_variance(stretches, window_s, span)
                           for _, span in per_run])) if per_run else 0.0)
    drift = (math.sqrt(max(0.0, float(np.sum(np.square(deviations))) / dof
                           - noise / float(np.mean(sizes)) - slow)) if dof > 0 else 0.0)
    levels = [float(np.mean([w[0] for w in run])) for run, _ in per_run]
    between = (_beyond_noise(levels, [drift ** 2 / len(run)
                                      + stretch.run_variance(stretches, span)
                                      for run, span in per_run])
               if len(levels) >= 2 else None)
    spread = Spread(step=step, shape=by_size.sd, shape_dof=by_size.dof, drift=drift,
                    between=between, windows=len(deviations), runs=len(per_run),
                    window_s=window_s, stretches=stretches,
                    request=request if request is not None else RequestSpread())
    return spread, by_size.factors


def spread_of(cal: Calibration) -> tuple[Spread, str | None]:
    """The calibration's spread; one made before latlab kept it gets one from its fit error
    (the mean error of a normal sample is σ·√(2/π)), and a note saying so."""
    if cal.spread is not None:
        return cal.spread, None
    sigma = cal.fit.mape * math.sqrt(math.pi / 2)
    return (Spread(step=sigma, shape=sigma, drift=0.0, between=None, windows=0, runs=1),
            f"the calibration of {cal.date} has no spread (an older latlab made it): the "
            f"intervals assume its step costs may be off by its fit error, "
            f"{100 * cal.fit.mape:.0f}% (mean), and nothing else")


def level_parts(spread: Spread) -> list[tuple[float, float]]:
    """The variances a new run's level adds up from, each with its degrees of freedom: the
    factors by size's error (across step sizes: the factors' own, else `SHAPE_GROUPS`
    groups) and between runs (from one run: as far as its windows drifted). Where the
    calibration fitted the machine's slow stretches (served steps), they explain the probes'
    short-term disagreement, and what the machine does beyond them — its level moving from
    one 10 s window to the next — is a later run's level too: a run minutes after the
    calibration sits as far off as the windows went (the drift, with its windows' dof)."""
    shape_dof = spread.shape_dof if spread.shape_dof is not None else SHAPE_GROUPS - 1
    parts = [(spread.shape ** 2, shape_dof)]
    if spread.between is not None:
        parts.append((spread.between ** 2, spread.runs - 1))
    if spread.between is None or spread.stretches is not None:
        parts.append((spread.drift ** 2, spread.windows - 1))
    return parts


def level_sd(spread: Spread) -> float:
    """The standard deviation of a new run's level (`level_parts`)."""
    return math.sqrt(sum(v for v, _ in level_parts(spread)))


def level_dof(spread: Spread) -> float:
    """The Student t's degrees of freedom for the level: its variances' (`level_parts`),
    combined as Welch–Satterthwaite does; normal when none was measured more than twice."""
    parts = level_parts(spread)
    total = sum(v for v, _ in parts)
    if total <= 0:
        return math.inf
    if any(v > 0 and dof < 1 for v, dof in parts):
        return 2.0  # a variance from one sample: wide tails
    return max(2.0, total ** 2 / sum(v ** 2 / dof for v, dof in parts if v > 0))


def level_quantile(spread: Spread, q: float) -> float:
    """The level (log of the step costs' factor) a share `q` of the worlds stay below."""
    return float(score(q, level_dof(spread)) * level_sd(spread))


def drift_limit(spread: Spread, level: float = 0.9) -> float:
    """The factor a run's step costs stay within (either way) in a share `level` of the
    worlds the spread allows: its level and one window's drift."""
    z = score(0.5 + level / 2, level_dof(spread))
    return math.exp(z * math.hypot(level_sd(spread), spread.drift))


def score(q: float, dof: float) -> float:
    """The `q` quantile of Student's t with `dof` degrees of freedom (a normal's where they
    are infinite), from scipy.special: scipy.stats would add half a CPU second to the
    start of every command that draws worlds or checks the machine."""
    from scipy.special import ndtri, stdtrit

    return float(stdtrit(dof, q) if math.isfinite(dof) else ndtri(q))
