"""A sweep's settings (`SweepConfig`) and `sweep.json`: its points, its curve, knee and SLO-max,
and why it stopped.

Each point is also a complete run folder inside the sweep folder (`Point.run`); this file
holds what the capacity analysis read from them, rewritten after every point.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, field_validator, model_validator

from latlab.records import SCHEMA_VERSION
from latlab.records.arrivals import ArrivalConfig, ArrivalShape
from latlab.records.bench import BenchConfig
from latlab.records.settings import SWEEP, setting
from latlab.records.summary import Ms, Record

SWEEP_JSON = "sweep.json"
Mode = Literal["synchronous", "throughput", "rate", "concurrency"]
UNITS: dict[str, str] = {"synchronous": "req/s", "rate": "req/s", "throughput": "users",
                         "concurrency": "users"}


class Cost(Record):
    per_million_output_tokens: float | None
    per_thousand_requests: float | None


class Point(Record):
    """One operating point of a sweep: its load, what it achieved and what that cost."""

    label: str
    mode: Mode
    load: float  # what the point offered: an open loop's measured rate, else users
    asked: float | None = None  # the rate or users the plan asked for
    achieved: float
    error_rate: float
    requests: int
    latency: float | None  # E2E from schedule at the sweep's percentile, successful requests
    median_latency: float | None  # E2E from schedule p50
    slo_values: dict[str, Ms]  # each SLO metric at the percentile, failed = inf
    cached_share: float | None = None  # of prompt tokens, from the server's prefix cache
    output_tokens_per_s: float
    goodput: float | None = None
    latencies: dict[str, dict[str, float | None]] = {}
    budget: dict[str, dict[str, float]] = {}
    run: str = ""
    interrupted: bool = False
    warnings: list[str] = []
    cost: Cost | None = None
    offered: float | None = None  # the rate the arrivals actually offered (open loop)
    fell_behind: bool = False  # the server did not keep up with the offered rate
    # [lo, hi] of `slo_values`: a measured point's 95% CIs (0 and inf where its sample cannot
    # bound them), a predicted point's interval of its draws; and a predicted one's `latencies`
    slo_intervals: dict[str, tuple[Ms, Ms]] = {}
    latency_intervals: dict[str, dict[str, tuple[Ms, Ms]]] = {}

    @property
    def unit(self) -> str:
        return UNITS[self.mode]

    @property
    def throughput(self) -> float:
        return min(self.achieved, self.load) if self.mode == "rate" else self.achieved

    def passes(self, slos: dict[str, float]) -> bool:
        """Every SLO met at the sweep's percentile, and the server kept up: a point that fell
        behind its offered rate meets no SLO, whatever its percentiles."""
        return not self.fell_behind and all(self.slo_values.get(m, math.inf) <= limit
                                            for m, limit in slos.items())


class Knee(Record):
    label: str
    load: float
    unit: str
    achieved: float
    latency: float | None
    next: str
    elasticity: Ms


class PointRef(Record):
    """A measured point named as evidence: its load, what it achieved, its SLO values."""

    label: str
    load: float
    achieved: float
    run: str
    values: dict[str, Ms]


class SloMax(Record):
    """The answer to "how much load within the SLOs", with the evidence on both sides and its
    interval `lo`–`hi` at `level`: a measured sweep's from every point's SLO values at the
    ends of their CIs, a predicted sweep's from its draws (`lo` None or 0: not met even at
    the lowest load; `hi` infinite: met past the highest load swept)."""

    slos: dict[str, float]
    percentile: float
    load: float | None
    achieved: float | None
    output_tokens_per_s: float | None
    passing: PointRef | None
    failing: PointRef | None
    interpolated: bool
    limiting: str | None
    statement: str
    notes: list[str] = []
    lo: float | None = None
    hi: Ms | None = None
    level: float | None = None


StopReason = Literal["running", "interrupted", "failed", "all_points", "escalation_limit",
                     "error_rate", "saturated"]


class SweepStop(Record):
    """Why the sweep ended (`running` while it runs), in a word and in a sentence."""

    reason: StopReason
    message: str


class SweepTarget(Record):
    """What a sweep measured: a server at `url`, or latlab's engine started with `serve_args`
    (`embedded`); or, for a predicted sweep (`simulated`), the calibration and fleet it
    simulated."""

    url: str | None = None
    model: str | None = None
    embedded: bool = False
    launch: str | None = None  # the command template latlab started the server with
    serve_args: list[str] = []
    engine_ready_s: float | None = None
    simulated: bool = False
    calibration: str | None = None  # where the calibration came from
    calibration_fit: str | None = None
    fleet: dict[str, Any] | None = None


class SweepRecord(Record):
    """Everything `sweep.json` holds. `config` is the sweep's options as given, with the
    bench configuration its points share under `bench`."""

    schema_version: int = SCHEMA_VERSION
    kind: Literal["sweep"] = "sweep"
    latlab_version: str = ""
    created: float | None = None
    command: list[str] = []
    target: SweepTarget = SweepTarget()
    config: dict[str, Any] = {}
    percentile: float
    slos: dict[str, float] = {}
    definitions: dict[str, str] = {}
    points: list[Point] = []
    curve: list[str] = []
    knee: Knee | None = None
    slo_max: SloMax | None = None
    slo_max_cost: Cost | None = None
    price_per_hour: float | None = None
    stop: SweepStop


def numbers(value: Any) -> Any:
    """`"1,2,4"` → `[1.0, 2.0, 4.0]`; lists pass."""
    if not isinstance(value, str):
        return value
    try:
        return [float(item) for item in value.split(",") if item.strip()]
    except ValueError:
        raise ValueError("expected a comma-separated list of numbers") from None


class SweepPlan(BaseModel):
    """The loads of a sweep and what its points are judged at (`latlab sweep`, `latlab
    predict --sweep`): explicit open-loop `rates`, else an automatic plan of `points` rates,
    with the arrival `shape` of every open-loop point."""

    rates: list[float] | None = setting(None, "Open-loop request rates to run, e.g. 1,2,4 "
                                        "(default: automatic).", group=SWEEP, cli_type=str | None)
    points: int = setting(6, "Automatic plan: rates spread between the synchronous rate and "
                          "the saturation throughput.", group=SWEEP, ge=1, le=50)
    percentile: float = setting(99.0, "The percentile the SLOs and the knee are judged at.",
                                group=SWEEP, gt=0, lt=100)
    shape: ArrivalShape = ArrivalShape()

    _rates = field_validator("rates", mode="before")(lambda value: numbers(value))

    @model_validator(mode="after")
    def _check_rates(self) -> SweepPlan:
        if self.rates is not None and (not self.rates or min(self.rates) <= 0):
            raise ValueError(f"--rates {self.rates}: give positive requests per second")
        self.shape.open_loop_process()
        return self

    def arrivals(self, rate: float, seed: int) -> ArrivalConfig:
        """An open-loop point's arrivals at `rate`."""
        return ArrivalConfig(process=self.shape.open_loop_process(), rate=rate,
                             burstiness=self.shape.burstiness,
                             max_concurrency=self.shape.max_concurrency, seed=seed)


class SweepConfig(SweepPlan):
    """A sweep: the bench run every point shares (`base`), the loads and the stop rule."""

    base: BenchConfig = BenchConfig()
    concurrencies: list[int] | None = setting(None, "Closed-loop user counts to run instead of "
                                              "rates, e.g. 1,4,16.", group=SWEEP,
                                              cli_type=str | None)
    saturation_users: int = setting(64, "Automatic plan: users of the closed-loop probe that "
                                    "finds the saturation throughput.", group=SWEEP, ge=2)
    max_error_rate: float = setting(0.05, "Stop once a point's error rate exceeds this "
                                    "fraction.", group=SWEEP, ge=0, le=1)
    price_per_hour: float | None = setting(None, "What the server costs per hour: adds cost "
                                           "per million output tokens and per thousand "
                                           "requests.", group=SWEEP, gt=0)

    _concurrencies = field_validator("concurrencies", mode="before")(
        lambda value: [int(v) for v in numbers(value)] if isinstance(value, str) else value)

    @model_validator(mode="after")
    def _check(self) -> SweepConfig:
        if self.rates is not None and self.concurrencies is not None:
            raise ValueError("--rates (open loop) and --concurrencies (closed loop) exclude "
                             "each other")
        if self.concurrencies is not None and (not self.concurrencies
                                               or min(self.concurrencies) < 1):
            raise ValueError(f"--concurrencies {self.concurrencies}: give whole numbers ≥ 1")
        if self.base.arrivals.process == "trace" and self.rates is None:
            raise ValueError("--trace is swept at the speeds that give each rate: give "
                             "--rates")
        return self
