"""Slow stretches: a step's cost misfit carries over to the steps after it.

On a shared host the machine is slow for stretches of steps (another process holds the
CPU for a second or two), and a request whose decode falls in one is slow throughout: that,
not the spread of single steps, makes the tails of TPOT and E2E. The log of a step's cost
factor (its misfit against the step cost, `spread.misfit`, after the factors by size) is
modelled as

    x(t) + e     x: Ornstein–Uhlenbeck processes (`parts`), standard deviation `sd`,
                    correlation exp(−Δt / `tau_s`) between steps Δt seconds apart;
                 e: each step's own, standard deviation `jitter`, independent,

fitted (`fit`) to how the variance of the misfits' mean over a window falls with the
window's width, within each run (its own level taken out): white noise falls as 1 / steps,
a part only once windows outgrow its `tau_s`. A busy machine's steps are slow far more than
they are fast, so each is drawn normal and mapped through the misfits' own shape
(`Stretches.shape`: their quantiles at normal scores). A world's draw (`StretchDraw`) holds
x on slices of the shortest `tau_s / SLICES_PER_TAU` seconds (the exact AR(1) of each part
from slice to slice), drawn in slice order from its own stream whatever asks for them when,
so both sides of a change see the same stretches at the same times; each factor is
centred so the step costs' mean stays the calibration's.

    stretches = fit(r, times, runs)          # None: too few steps to tell
    draw = StretchDraw(stretches, slow_rng, step_rng)
    draw.factor(t); draw.until(t); draw.step()
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from latlab.records.calibration import SHAPE_SCORES, Stretch, Stretches

SLICES_PER_TAU = 4
STEP_BLOCK = 1024  # steps' own factors drawn at a time
MIN_SLICE_S = 0.05  # the stretches are held at least this long (the simulator's decode runs)
TAUS = np.geomspace(0.05, 60.0, 49)  # correlation times tried (s)
FIRST_WIDTH_S = 0.1
MIN_STEPS = 50  # steps in a run to count it
MIN_WINDOW = 2  # steps a window needs
PARTS = 2  # time scales fitted
SCORES = np.array(SHAPE_SCORES)


def mean_share(u: np.ndarray | float) -> np.ndarray | float:
    """The variance of an Ornstein–Uhlenbeck process's mean over a window `u` correlation
    times long, as a share of its own: 2/u · (1 − (1 − e^−u) / u); 1 at u = 0."""
    u = np.asarray(u, dtype=float)
    safe = np.where(u > 1e-6, u, 1.0)
    share = 2 / safe * (1 - (1 - np.exp(-safe)) / safe)
    return np.where(u > 1e-6, share, 1.0 - u / 3)


def _window_rows(d: np.ndarray, t: np.ndarray, widths: list[float]
                 ) -> tuple[list[float], list[float], list[float], list[int]]:
    """Per width (0: single steps): Σ of the squared window means of the deviations `d`
    (taken at `t`), Σ 1/steps over the windows, the width, and the windows counted."""
    sums, inverse, used, counts = [], [], [], []
    for w in widths:
        if w == 0:
            means, sizes = d, np.ones(len(d))
        else:
            slot = np.floor((t - t[0]) / w).astype(int)
            sizes = np.bincount(slot)
            means = np.bincount(slot, weights=d)[sizes >= MIN_WINDOW] / sizes[
                sizes >= MIN_WINDOW]
            sizes = sizes[sizes >= MIN_WINDOW]
        if len(means) < 2:
            continue
        sums.append(float(np.sum(means ** 2)))
        inverse.append(float(np.sum(1 / sizes)))
        used.append(w)
        counts.append(len(means))
    return sums, inverse, used, counts


def fit(r: np.ndarray, times: np.ndarray, runs: np.ndarray, parts: int = PARTS
        ) -> Stretches | None:
    """The stretches of misfits `r` of steps started at `times` (s) in `runs`: within each
    run (its mean taken out), the squared means over windows of 0 (single steps), 0.1, 0.2,
    0.4 … s up to a third of the run, summed over the runs width by width, against what the
    `parts` time scales and the steps' own jitter make of them (the run's mean taken out of
    both: a window's mean minus the run's). Each part's correlation time is one of `TAUS`
    up to a third of the longest run (a slower process is not in the runs: it is their
    drift and level), the variances non-negative least squares on relative error (weighted
    by the windows), the times the best such fit; and the misfits' shape (`shape_of`). None
    when no run has `MIN_STEPS` steps."""
    from scipy.optimize import nnls

    r, times, runs = (np.asarray(a) for a in (r, times, runs))
    rows = []  # (observed Σ m², Σ 1/n, width, windows, run's steps, run's span)
    deviations = []
    for run in np.unique(runs):
        mine = runs == run
        if mine.sum() < MIN_STEPS:
            continue
        order = np.argsort(times[mine])
        t, d = times[mine][order], r[mine][order].astype(float)
        d = d - d.mean()
        deviations.append(d)
        span = float(t[-1] - t[0])
        widths = [0.0] + [FIRST_WIDTH_S * 2 ** k for k in range(20)
                          if FIRST_WIDTH_S * 2 ** k <= span / 3]
        for sums, inverse, w, n in zip(*_window_rows(d, t, widths)):
            rows.append((sums, inverse, w, n, len(d), span))
    if not rows:
        return None
    widths, group = np.unique([row[2] for row in rows], return_inverse=True)

    def pooled(column: list[float]) -> np.ndarray:  # summed over the runs, width by width
        return np.bincount(group, weights=column, minlength=len(widths))

    observed = pooled([row[0] for row in rows])
    # relative error, weighted by the windows behind each width (a mean square of k windows
    # is off by about √(2/k) of itself)
    scale = np.maximum(observed, 1e-12) / np.sqrt(pooled([row[3] for row in rows]))
    white = pooled([inverse - n / steps for _, inverse, _, n, steps, _ in rows])
    taus = TAUS[TAUS <= max(TAUS[0], max(row[5] for row in rows) / 3)]
    slow = {tau: pooled([n * (float(mean_share(w / tau)) - float(mean_share(span / tau)))
                         for _, _, w, n, _, span in rows]) for tau in taus}
    best = None
    for chosen in itertools.combinations(taus, min(parts, len(taus))):
        a = np.column_stack([slow[tau] for tau in chosen] + [white])
        coef, _ = nnls(a / scale[:, None], observed / scale)
        error = float(np.sum((a @ coef - observed) ** 2 / scale ** 2))
        if best is None or error < best[0] - 1e-12:
            best = (error, chosen, coef)
    _, chosen, coef = best
    return Stretches(parts=[Stretch(sd=math.sqrt(v), tau_s=float(tau))
                            for tau, v in zip(chosen, coef[:-1])],
                     jitter=math.sqrt(coef[-1]), shape=shape_of(np.concatenate(deviations)))


def shape_of(d: np.ndarray) -> list[float]:
    """The quantiles of `d` (each run's mean taken out), in its standard deviations, at the
    normal scores `SCORES`."""
    from scipy.special import ndtr  # the normal's CDF, without scipy.stats' import

    sd = float(np.std(d))
    if sd <= 0:
        return []
    return [float(v) for v in np.quantile((d - np.mean(d)) / sd, ndtr(np.asarray(SCORES)))]


class Shape:
    """A normal score mapped to the misfits' shape (`Stretches.shape`: linear between its
    points, and beyond them along its last segments; none: the score itself), and the
    constant that keeps exp(sd × it) at a mean of 1."""

    def __init__(self, quantiles: list[float]) -> None:
        self.points = list(quantiles)
        from numpy.polynomial.hermite_e import hermegauss

        self._z, weights = hermegauss(40)
        self._w = weights / weights.sum()

    def __call__(self, z: float) -> float:
        return float(self.many(np.array([z]))[0])

    def many(self, z: np.ndarray) -> np.ndarray:
        """`self(z)` of each score of `z`."""
        q = self.points
        if not q:
            return z
        out = np.interp(z, SCORES, q)
        low, high = z <= SCORES[0], z >= SCORES[-1]
        out[low] = q[0] + (z[low] - SCORES[0]) * (q[1] - q[0]) / 0.5
        out[high] = q[-1] + (z[high] - SCORES[-1]) * (q[-1] - q[-2]) / 0.5
        return out

    def centre(self, sd: float) -> float:
        """−log E[exp(sd × shape(Z))], Z standard normal."""
        if not self.points:
            return -sd * sd / 2
        return -math.log(float(np.sum(self._w * np.exp(sd * self.many(self._z)))))


def window_variance(stretches: Stretches | None, width_s: float, span_s: float) -> float:
    """What the stretches add to the variance of a `width_s` window's mean misfit, the
    mean of its run (`span_s` long) taken out."""
    if stretches is None:
        return 0.0
    return sum(max(0.0, p.sd ** 2 * float(mean_share(width_s / p.tau_s)
                                          - mean_share(span_s / p.tau_s)))
               for p in stretches.parts)


def run_variance(stretches: Stretches | None, span_s: float) -> float:
    """What the stretches add to the variance of a `span_s` run's mean misfit (its level)."""
    if stretches is None:
        return 0.0
    return sum(p.sd ** 2 * float(mean_share(span_s / p.tau_s)) for p in stretches.parts)


class StretchDraw:
    """One world's stretches: the factor of the slow parts on a step starting at `t` (held
    on slices of the shortest part's `tau_s / SLICES_PER_TAU`), when it next changes, and a
    step's own factor (`step`: one draw a step, from `step_rng`, in the order the steps
    ask, drawn `STEP_BLOCK` at a time: the same numbers as one by one); each normal, mapped
    through the misfits' shape, centred to a mean of 1."""

    def __init__(self, stretches: Stretches, slow_rng: np.random.Generator,
                 step_rng: np.random.Generator) -> None:
        parts = [p for p in stretches.parts if p.sd > 0]
        self.slice_s = max(MIN_SLICE_S, min((p.tau_s for p in parts), default=1.0)
                           / SLICES_PER_TAU)
        self._sd = np.array([p.sd for p in parts])
        self._rho = np.exp(-self.slice_s / np.array([p.tau_s for p in parts]))
        self._innovation = self._sd * np.sqrt(1 - self._rho ** 2)
        self._shape = Shape(stretches.shape)
        self._slow_sd = float(np.sqrt(np.sum(self._sd ** 2)))
        self._slow_centre = self._shape.centre(self._slow_sd)
        self._jitter = stretches.jitter
        self._jitter_centre = self._shape.centre(self._jitter)
        self._slow_rng, self._step_rng = slow_rng, step_rng
        self._factors: list[float] = []
        self._x = np.zeros(len(parts))
        self._step_logs: list[float] = []  # the next steps' log factors, drawn ahead
        self._next_step = 0

    def factor(self, t: float) -> float:
        if not len(self._sd):
            return 1.0
        k = int(t / self.slice_s) if t > 0 else 0
        while len(self._factors) <= k:
            z = self._slow_rng.standard_normal(len(self._sd))
            self._x = (self._sd * z if not self._factors
                       else self._rho * self._x + self._innovation * z)
            score = float(self._x.sum()) / self._slow_sd
            self._factors.append(math.exp(self._slow_sd * self._shape(score)
                                          + self._slow_centre))
        return self._factors[k]

    def until(self, t: float) -> float:
        """When the factor of `t` next changes (s): never without a part that varies."""
        if not len(self._sd):
            return math.inf
        return (math.floor(max(t, 0.0) / self.slice_s) + 1) * self.slice_s

    def step(self) -> float:
        """One step's own factor (mean 1)."""
        if self._jitter <= 0:
            return 1.0
        if self._next_step == len(self._step_logs):
            z = self._step_rng.standard_normal(STEP_BLOCK)
            self._step_logs = (self._jitter * self._shape.many(z)
                               + self._jitter_centre).tolist()
            self._next_step = 0
        self._next_step += 1
        # math.exp, not numpy's over the block: numpy's differs in the last bit for a few
        # values, and a seed's predictions stay what they were
        return math.exp(self._step_logs[self._next_step - 1])
