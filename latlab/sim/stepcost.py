"""The step-cost model: an engine step's time from what the scheduler put into it.

Features (`latlab.records.calibration.STEP_FEATURES`): the step itself, its tokens, decodes,
prefill chunks, rows sampled, the context the decodes attend and the prefill chunks' attention
area; plus hinges `max(0, tokens − knot)` that make the cost piecewise linear in the tokens (a
CPU or GPU gets more efficient, or saturates, as the batch grows). Fitted by least squares on
relative error (`fit`), non-negative except the hinges, with numpy and scipy. Where the
calibration found the linear model off by the size of step (`StepCost.by_size`, learnt from
its misfits: `latlab.sim.spread.size_factors`), each step's time is scaled by the factor at
its size.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence

import numpy as np

from latlab.records.calibration import STEP_FEATURES, FitError, StepCost

FEATURES = tuple(STEP_FEATURES)
HOLDOUT_EVERY = 5
TRIM = 4.0
MIN_TRIM = 0.10
MIN_HOLDOUT_SAMPLES = 20


class StepCostModel:
    """Evaluates a `StepCost` fast: plain floats, no numpy, for the simulator's inner loop."""

    def __init__(self, cost: StepCost) -> None:
        c = {name: float(cost.coefficients.get(name, 0.0)) for name in FEATURES}
        unknown = set(cost.coefficients) - set(FEATURES)
        if unknown:
            raise ValueError(f"unknown step-cost features: {', '.join(sorted(unknown))}")
        if len(cost.knots) != len(cost.hinges):
            raise ValueError("the step cost needs one hinge per knot")
        self.c_step = c["step"] / 1e3  # seconds
        self.c_tokens = c["tokens"] / 1e3
        self.c_decodes = c["decodes"] / 1e3
        self.c_prefills = c["prefills"] / 1e3
        self.c_sampled = c["sampled"] / 1e3
        self.c_groups = c["decode_groups"] / 1e3
        self.c_ctx = c["decode_context"] / 1e6  # per context token
        self.c_attn = c["prefill_attention"] / 1e9  # per token × context
        self.hinges = [(float(k), float(h) / 1e3) for k, h in zip(cost.knots, cost.hinges) if h]
        sizes = sorted(cost.by_size, key=lambda f: f.ms)
        self._log_s = [math.log(f.ms / 1e3) for f in sizes]
        self._log_factor = [math.log(f.factor) for f in sizes]

    def seconds(self, tokens: int, decodes: int, prefills: int, sampled: int, groups: int,
                decode_context: int, prefill_attention: int) -> float:
        """One step's time in seconds (context and attention in tokens, not thousands)."""
        t = self.linear(tokens, decodes, prefills, sampled, groups, decode_context,
                        prefill_attention)
        return t * self.factor(t) if self._log_s else t

    def linear(self, tokens: int, decodes: int, prefills: int, sampled: int, groups: int,
               decode_context: int, prefill_attention: int) -> float:
        """What the linear model alone charges for the step (s)."""
        t = (self.c_step + self.c_tokens * tokens + self.c_decodes * decodes
             + self.c_prefills * prefills + self.c_sampled * sampled + self.c_groups * groups
             + self.c_ctx * decode_context + self.c_attn * prefill_attention)
        for knot, hinge in self.hinges:
            if tokens > knot:
                t += hinge * (tokens - knot)
        return max(t, 1e-7)

    def factor(self, linear_s: float) -> float:
        """The factor by size at a step the linear model charges `linear_s` seconds."""
        points, logs = self._log_s, self._log_factor
        if not points:
            return 1.0
        x = math.log(linear_s)
        i = bisect_right(points, x)
        if i == 0:
            return math.exp(logs[0])
        if i == len(points):
            return math.exp(logs[-1])
        w = (x - points[i - 1]) / (points[i] - points[i - 1])
        return math.exp(logs[i - 1] + w * (logs[i] - logs[i - 1]))

    def decode_run(self, batch: int, context: int, groups: int) -> tuple[float, float]:
        """Steps of `batch` decodes only, attending `context` tokens in the first: step j
        (from 0) takes `a + b·j` seconds, since every decode's context grows by one a step
        (the factor by size held at the first step's)."""
        a = self.linear(batch, batch, 0, batch, groups, context, 0)
        f = self.factor(a)
        return a * f, self.c_ctx * batch * f


def features(rows: Sequence[Sequence[float]], steps: Sequence[float] | None = None
             ) -> np.ndarray:
    """`[n, len(FEATURES)]` from rows of `step_features` (in tokens), scaled to the
    calibration's units; a row that sums several steps says how many in `steps`."""
    x = np.asarray(rows, dtype=float).reshape(-1, 7)
    ones = np.ones(len(x)) if steps is None else np.asarray(steps, dtype=float)
    return np.column_stack([ones, x[:, :5], x[:, 5] / 1e3, x[:, 6] / 1e6])


def design(x: np.ndarray, knots: Sequence[float]) -> np.ndarray:
    tokens = x[:, 1:2]
    hinges = [np.maximum(0.0, tokens - k) for k in knots]
    return np.hstack([x, *hinges]) if hinges else x


def told_apart(x: np.ndarray, ms: np.ndarray, use: Sequence[str] = FEATURES) -> int:
    """How many of the costs in `use` the samples tell apart: the rank of their columns, as
    `fit` weighs them (each sample relative to its time). Fewer than `len(use)`: the samples
    never varied what would separate the rest (a run of one prompt length, say), and many
    fits explain them equally well."""
    mask = [name in use for name in FEATURES]
    return int(np.linalg.matrix_rank(x[:, mask] / np.asarray(ms, dtype=float)[:, None]))


def fit(x: np.ndarray, ms: np.ndarray, knots: Sequence[float] = (),
        use: Sequence[str] = FEATURES, what: str = "engine step time",
        trim: float | None = TRIM) -> tuple[StepCost, FitError]:
    """Least squares on relative error of `ms` (step times) against the features `x`
    (`features(...)`) restricted to `use`; with `trim`, refitted without the samples whose
    error exceeds `trim` × the median error (outliers: another process took the CPU). The
    fit error is over the samples kept, and over every fifth held out of a second fit."""
    from scipy.optimize import lsq_linear

    ms = np.asarray(ms, dtype=float)
    mask = np.array([name in use for name in FEATURES] + [True] * len(knots))

    def solve(rows: np.ndarray) -> np.ndarray:
        a = design(x[rows], knots)[:, mask] / ms[rows, None]
        lower = np.r_[np.zeros(int(mask[: len(FEATURES)].sum())), np.full(len(knots), -np.inf)]
        coef = np.zeros(mask.size)
        # BVLS, exact for a handful of columns: TRF, iterating, wanders along a design the
        # samples do not pin down (lengths that never varied) and steps to infinite bounds
        # (scipy's "invalid value encountered in multiply")
        coef[mask] = lsq_linear(a, np.ones(len(a)), bounds=(lower, np.inf), method="bvls").x
        return coef

    everything = np.arange(len(ms))
    coef = solve(everything)
    outliers = 0
    if trim:  # samples a noisy neighbour slowed down: refit without them
        errors = np.abs(design(x, knots) @ coef - ms) / ms
        keep = errors <= max(trim * np.median(errors), MIN_TRIM)
        outliers = int((~keep).sum())
        if outliers and keep.sum() >= len(coef):
            x, ms, everything = x[keep], ms[keep], np.arange(int(keep.sum()))
            coef = solve(everything)
    errors = np.abs(design(x, knots) @ coef - ms) / ms
    holdout = None
    if len(ms) >= MIN_HOLDOUT_SAMPLES:
        test = everything % HOLDOUT_EVERY == 0
        partial = solve(everything[~test])
        holdout = float(np.mean(np.abs(design(x[test], knots) @ partial - ms[test]) / ms[test]))
    cost = StepCost(coefficients={n: float(v) for n, v in zip(FEATURES, coef) if n in use},
                    knots=[float(k) for k in knots],
                    hinges=[float(v) for v in coef[len(FEATURES):]])
    return cost, FitError(samples=len(ms), outliers=outliers, mape=float(errors.mean()),
                          p90=float(np.percentile(errors, 90)), max=float(errors.max()),
                          holdout_mape=holdout, what=what)
