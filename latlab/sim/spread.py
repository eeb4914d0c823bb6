"""How far a calibration's timings strayed from its fit (`Spread`), and the possible worlds a
prediction draws from it (`Draw`).

    spread = estimate(*misfit(cost, x, ms), times, runs)  # the samples the fit was made on
    draw = Draw.make(spread, rng)   # one world: the step costs' level, its drift
    dt *= draw.speed(now)           # a step starting at `now` (s) costs this many times more

A world's step costs sit at a *level* off the fit (the machine faster or slower than when it
was timed, a workload of other steps than the calibration's), drawn from a Student t over the
level's spread between runs and across step sizes (few runs: wide tails), and drift around
it from one window of `window_s` seconds to the next (the machine's speed moving within a
run). Each request's costs outside the engine vary by their own spread.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from latlab.records.calibration import Calibration, RequestSpread, Spread, StepCost
from latlab.sim.stepcost import FEATURES, design

WINDOW_S = 10.0
SHAPE_GROUPS = 10
MIN_WINDOW = 5  # samples a window needs to count


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
    """log(measured / fitted) of timings `ms` against what `cost` charges for their features
    `x`, and what it charges."""
    fitted = fitted_ms(cost, x)
    return np.log(np.asarray(ms, dtype=float) / fitted), fitted


def estimate(r: np.ndarray, fitted: np.ndarray, times: np.ndarray, runs: np.ndarray,
             window_s: float = WINDOW_S, request: RequestSpread | None = None) -> Spread:
    """The spread of the misfits `r` (`misfit`; the fit charged `fitted`) of samples timed at
    `times` (seconds) in the `runs` they belong to."""
    r, fitted = np.asarray(r, dtype=float), np.asarray(fitted, dtype=float)
    times, runs = np.asarray(times, dtype=float), np.asarray(runs)
    step = robust_sd(r)
    noise = step ** 2
    groups = [g for g in np.array_split(r[np.argsort(fitted)], SHAPE_GROUPS)
              if len(g) >= MIN_WINDOW]
    shape = _beyond_noise([float(g.mean()) for g in groups], [noise / len(g) for g in groups])
    per_run = []  # each run's windows: (mean misfit, samples)
    for run in np.unique(runs):
        rr, tt = r[runs == run], times[runs == run]
        slot = np.floor((tt - tt.min()) / window_s)
        windows = [(float(rr[slot == s].mean()), int((slot == s).sum()))
                   for s in np.unique(slot) if (slot == s).sum() >= MIN_WINDOW]
        if windows:
            per_run.append(windows)
    deviations = [m - np.mean([w[0] for w in run]) for run in per_run for m, _ in run]
    sizes = [n for run in per_run for _, n in run]
    dof = len(deviations) - len(per_run)
    drift = (math.sqrt(max(0.0, float(np.sum(np.square(deviations))) / dof
                           - noise / float(np.mean(sizes)))) if dof > 0 else 0.0)
    levels = [float(np.mean([w[0] for w in run])) for run in per_run]
    between = (_beyond_noise(levels, [drift ** 2 / len(run) for run in per_run])
               if len(levels) >= 2 else None)
    return Spread(step=step, shape=shape, drift=drift, between=between,
                  windows=len(deviations), runs=len(per_run), window_s=window_s,
                  request=request if request is not None else RequestSpread())


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


def level_sd(spread: Spread) -> float:
    """The standard deviation of a new run's level: across step sizes and between runs (from
    one run: as far as its windows drifted)."""
    between = spread.between if spread.between is not None else spread.drift
    return math.sqrt(spread.shape ** 2 + between ** 2)


def level_dof(spread: Spread) -> float:
    """The Student t's degrees of freedom for the level: its two variances' (across step
    sizes: `SHAPE_GROUPS` groups; between runs, else between windows), combined as
    Welch–Satterthwaite does; normal when neither was measured more than twice."""
    between, units = ((spread.between, spread.runs) if spread.between is not None
                      else (spread.drift, spread.windows))
    parts = [(spread.shape ** 2, SHAPE_GROUPS - 1), (between ** 2, units - 1)]
    total = sum(v for v, _ in parts)
    if total <= 0:
        return math.inf
    if any(v > 0 and dof < 1 for v, dof in parts):
        return 2.0  # a variance from one sample: wide tails
    return max(2.0, total ** 2 / sum(v ** 2 / dof for v, dof in parts if v > 0))


def level_quantile(spread: Spread, q: float) -> float:
    """The level (log of the step costs' factor) a share `q` of the worlds stay below."""
    from scipy.stats import norm, t

    dof = level_dof(spread)
    z = t.ppf(q, dof) if math.isfinite(dof) else norm.ppf(q)
    return float(z * level_sd(spread))


def drift_limit(spread: Spread, level: float = 0.9) -> float:
    """The factor a run's step costs stay within (either way) in a share `level` of the
    worlds the spread allows: its level and one window's drift."""
    from scipy.stats import norm, t

    dof, q = level_dof(spread), 0.5 + level / 2
    z = t.ppf(q, dof) if math.isfinite(dof) else norm.ppf(q)
    return math.exp(z * math.hypot(level_sd(spread), spread.drift))


@dataclass
class Draw:
    """One possible world for a simulation: step costs × `exp(level + drift of the window)`,
    each request's costs outside the engine off the calibration's by its own draw.

    The windows' drift comes from `rng`, the requests' costs from `requests_rng` (`rng` when
    not given): two simulations of the same world (a setting and its change) see the same
    drift and the same requests' costs whatever order they ask for them in."""

    level: float
    drift: float
    window_s: float
    request_sd: tuple[float, float]  # preprocess (with the network's), postprocess (s)
    rng: np.random.Generator
    requests_rng: np.random.Generator | None = None
    _windows: list[float] = field(default_factory=list)
    _overheads: np.ndarray = field(default_factory=lambda: np.zeros((0, 2)))

    @classmethod
    def make(cls, spread: Spread, seed: int | list[int], quantile: float | None = None) -> Draw:
        """A world from `seed`: its level at the `quantile` of the levels the spread allows
        (drawn at random when None), its drift and requests' costs from the seed's
        streams."""
        windows, requests = (np.random.default_rng(s)
                             for s in np.random.SeedSequence(seed).spawn(2))
        if quantile is None:
            dof = level_dof(spread)
            z = windows.standard_t(dof) if math.isfinite(dof) else windows.standard_normal()
            level = float(z * level_sd(spread))
        else:
            level = level_quantile(spread, quantile)
        r = spread.request
        return cls(level=level, drift=spread.drift, window_s=spread.window_s,
                   request_sd=(math.hypot(r.preprocess, r.network) / 1e3, r.postprocess / 1e3),
                   rng=windows, requests_rng=requests)

    def speed(self, t: float) -> float:
        """How many times the calibrated cost a step starting at `t` (s) takes."""
        w = int(t / self.window_s) if t > 0 else 0
        while len(self._windows) <= w:
            self._windows.append(math.exp(self.level + self.drift * self.rng.standard_normal()))
        return self._windows[w]

    def overheads(self, n: int) -> np.ndarray:
        """`[n, 2]` seconds added to the preprocess (the network's spread with it, on the
        way in) and postprocess of the first `n` requests; the simulator keeps each cost at
        zero or more."""
        if len(self._overheads) < n:
            rng = self.requests_rng if self.requests_rng is not None else self.rng
            more = rng.standard_normal((n - len(self._overheads), 2)) * np.asarray(
                self.request_sd)
            self._overheads = np.vstack([self._overheads, more])
        return self._overheads[:n]
