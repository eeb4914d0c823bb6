"""`calibration.json`: what `latlab predict` knows about one server, fitted by `latlab calibrate`.

A simulated replica schedules with the engine's own scheduler (`EngineShape`: the knobs that
decide what runs in a step) and charges each step the time of the step-cost model
(`StepCost`): a linear model in the step's features — its prefill and decode tokens, the
context they attend, the chunks and rows sampled — with hinges that make it piecewise linear
in the step's tokens. Each request also pays fixed costs outside the engine
(`RequestCosts`). `FitError` states how well the model reproduces the timings it was fitted
on; `Spread` how far those timings strayed from it (what predictions draw their intervals
from); `Reference` the machine's speed then; `created` dates the calibration.
"""

from __future__ import annotations

import time
from typing import Literal

from pydantic import Field, field_validator

from latlab.records import SCHEMA_VERSION
from latlab.records.engine import EngineShape
from latlab.records.summary import Record

CALIBRATION_JSON = "calibration.json"

# The features of one engine step, each a number the scheduler's output determines.
STEP_FEATURES: dict[str, str] = {
    "step": "1 per step (the step's fixed overhead)",
    "tokens": "tokens computed in the step (prefill chunk tokens + decodes)",
    "decodes": "sequences decoding one token",
    "prefills": "prefill chunks",
    "sampled": "sequences that get a token this step (decodes and finished prefills)",
    "decode_groups": "attention calls the decodes make per layer (latlab's engine groups "
                     "decodes of similar context)",
    "decode_context": "context tokens the decodes attend, summed, in thousands",
    "prefill_attention": "Σ chunk tokens × chunk context over the prefill chunks, in millions",
}


class SizeFactor(Record):
    """Steps the linear model charges about `ms` took `factor` times that when they were
    timed: the model's misfit at that size of step (`latlab.sim.spread.size_factors`)."""

    ms: float = Field(gt=0)
    factor: float = Field(gt=0)


class StepCost(Record):
    """Step time (ms) = Σ coefficient × feature, plus hinge × max(0, tokens − knot); times
    the factor `by_size` gives at that time (between its points: linear in log ms; beyond
    them: the nearest), where the calibration measured one."""

    coefficients: dict[str, float]
    knots: list[float] = []
    hinges: list[float] = []
    by_size: list[SizeFactor] = []  # by ms, ascending

    def describe(self) -> str:
        parts = [f"{v:.4g}×{k}" for k, v in self.coefficients.items() if v]
        parts += [f"{h:+.4g}×(tokens−{k:g})₊" for k, h in zip(self.knots, self.hinges) if h]
        line = " + ".join(parts) + " ms"
        if self.by_size:
            line += ", × " + ", ".join(f"{f.factor:.2f} at {f.ms:.3g} ms" for f in self.by_size)
        return line


class RequestCosts(Record):
    """Per-request time outside the engine's steps (ms)."""

    preprocess: float = Field(default=0.0, ge=0)  # received → handed to the engine
    preprocess_per_token: float = Field(default=0.0, ge=0)  # more per prompt token
    postprocess: float = Field(default=0.0, ge=0)  # last token → response complete
    network: float = Field(default=0.0, ge=0)  # client ↔ server round trip, split in two
    reject: float = Field(default=0.0, ge=0)  # a 429's round trip


class RequestSpread(Record):
    """How much the per-request costs vary from request to request: each one's standard
    deviation (ms)."""

    preprocess: float = Field(default=0.0, ge=0)
    postprocess: float = Field(default=0.0, ge=0)
    network: float = Field(default=0.0, ge=0)


class Stretch(Record):
    """One time scale of the machine's slow stretches: an Ornstein–Uhlenbeck process in the
    log of the step costs' factor, of standard deviation `sd`, whose correlation falls by e
    every `tau_s` seconds."""

    sd: float = Field(ge=0)
    tau_s: float = Field(gt=0)


# The normal scores `Stretches.shape` holds the misfits' quantiles at.
SHAPE_SCORES = tuple(-2.5 + 0.5 * k for k in range(11))


class Stretches(Record):
    """How a step's misfit carries over to the steps after it (`latlab.sim.stretches`): the
    log of a step's cost factor is the sum of `parts` (stretches at their time scales, the
    shortest first) plus each step's own, of standard deviation `jitter`; where the misfits
    were not normal (a busy machine's steps are slow far more than they are fast), `shape`
    holds their quantiles, in standard deviations, at the normal scores −2.5, −2 … 2.5."""

    parts: list[Stretch]
    jitter: float = Field(default=0.0, ge=0)
    shape: list[float] = []

    @field_validator("shape")
    @classmethod
    def _quantiles(cls, shape: list[float]) -> list[float]:
        if shape and (len(shape) != len(SHAPE_SCORES)
                      or any(b < a for a, b in zip(shape, shape[1:]))):
            raise ValueError(f"expected none or {len(SHAPE_SCORES)} quantiles in rising order "
                             f"(at the normal scores -2.5, -2 … 2.5), got {len(shape)}")
        return shape

    def describe(self) -> str:
        parts = " and ".join(f"±{100 * p.sd:.0f}% over ~{p.tau_s:.2g} s" for p in self.parts
                             if p.sd > 0)
        return f"slow stretches {parts or 'none'}, ±{100 * self.jitter:.0f}% a step beside them"


class Spread(Record):
    """How far the step costs strayed from the fit while they were timed: what `latlab
    predict` draws its intervals from (`latlab.sim.spread`). All but `request` are standard
    deviations of log(measured / fitted).

    `step`: of one sample (a step, or one request's mean step). `shape`: how far a workload
    of other steps than the calibration's may sit off the step cost: the uncertainty of its
    factors by size (`StepCost.by_size`), with `shape_dof` degrees of freedom; a calibration
    without those factors (None: made before latlab kept them) has the spread of the mean
    misfit across the sizes of step itself. `drift`: of the level (a window's mean misfit)
    between windows of `window_s` seconds, the noise of single steps taken out: how much the
    machine's speed moves within a run. `between`: of the level between the `runs` timed
    apart (probes, run folders), beyond the windows' drift; unknown (None) from one run.
    `stretches`: how the misfit of one step carries over to the next (None: not fitted, each
    window's steps cost alike). The drift and `between` are of the misfits left after the
    factors by size and beyond what the stretches explain."""

    step: float = Field(ge=0)
    shape: float = Field(default=0.0, ge=0)
    shape_dof: float | None = Field(default=None, gt=0)
    drift: float = Field(default=0.0, ge=0)
    between: float | None = Field(default=None, ge=0)
    windows: int = Field(default=0, ge=0)
    runs: int = Field(default=1, ge=0)
    window_s: float = Field(default=10.0, gt=0)
    request: RequestSpread = RequestSpread()
    stretches: Stretches | None = None

    def describe(self) -> str:
        between = (f", {100 * self.between:.1f}% between its {self.runs} runs"
                   if self.between is not None else "")
        sizes = " (the error of its factors by size)" if self.shape_dof is not None else ""
        return (f"step costs ±{100 * self.step:.1f}% a sample, ±{100 * self.shape:.1f}% across "
                f"step sizes{sizes}, the level ±{100 * self.drift:.1f}% from one "
                f"{self.window_s:g} s "
                f"window to the next ({self.windows} windows){between}"
                + (f"; {self.stretches.describe()}" if self.stretches else ""))


class Reference(Record):
    """A fixed set of engine steps timed in process when the calibration was made
    (`latlab.sim.calibrate_engine.REFERENCE`): timed again before the calibration is used,
    they show whether the machine has become slower or faster since."""

    ms: list[float]
    load_average: float | None = None  # the machine's 1-minute load average then
    cpus: int | None = None


class FitError(Record):
    """How far the fitted step times are from the timings they were fitted on.

    `mape` is the mean of |predicted − measured| / measured over the `samples`; `p90` and
    `max` are percentiles of the same ratio; `holdout_mape` the mean over samples left out of
    the fit (every fifth), when there were enough. `outliers` were dropped before the fit."""

    samples: int
    outliers: int = 0  # samples left out of the fit: far off, slowed by something else
    mape: float
    p90: float
    max: float
    holdout_mape: float | None = None
    what: str = "engine step time"


class Calibration(Record):
    """Everything calibration.json holds."""

    schema_version: int = SCHEMA_VERSION
    kind: Literal["calibration"] = "calibration"
    latlab_version: str = ""
    created: float = Field(default_factory=time.time)
    source: Literal["engine", "run"] = "engine"
    server: str = ""  # what was calibrated, in words
    target: dict[str, object] = {}
    engine: EngineShape = EngineShape()
    step: StepCost
    request: RequestCosts = RequestCosts()
    fit: FitError
    runs: list[str] = []  # the run folders a run calibration was fitted from
    notes: list[str] = []
    spread: Spread | None = None  # None: made by a latlab that did not keep it
    reference: Reference | None = None  # latlab's engine: the machine's speed then

    @property
    def date(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(self.created))

    def headline(self) -> str:
        """One line: what, when, how well."""
        f = self.fit
        holdout = f", held out {100 * f.holdout_mape:.1f}%" if f.holdout_mape is not None else ""
        dropped = f", {f.outliers} outliers left out" if f.outliers else ""
        return (f"calibration of {self.server or self.source} from {self.date}: {f.what} fit "
                f"error {100 * f.mape:.1f}% mean{holdout}, {100 * f.p90:.1f}% p90 "
                f"({f.samples} samples{dropped})")
