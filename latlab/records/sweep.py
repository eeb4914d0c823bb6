"""`sweep.json`: a sweep's points, its curve, knee and SLO-max, and why it stopped.

Each point is also a complete run folder inside the sweep folder (`Point.run`); this file
holds what the capacity analysis read from them, rewritten after every point.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from latlab.records import SCHEMA_VERSION
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
    load: float
    achieved: float
    error_rate: float
    requests: int
    latency: float | None  # E2E from schedule at the sweep's percentile, successful requests
    median_latency: float | None  # E2E from schedule p50
    slo_values: dict[str, Ms]  # each SLO metric at the percentile, failed = inf
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
    """The answer to "how much load within the SLOs", with the evidence on both sides."""

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


class SweepStop(Record):
    reason: str
    message: str


class SweepRecord(Record):
    """Everything `sweep.json` holds. `config` is the sweep's options as given, with the
    bench configuration its points share under `bench`."""

    schema_version: int = SCHEMA_VERSION
    kind: Literal["sweep"] = "sweep"
    latlab_version: str = ""
    created: float | None = None
    command: list[str] = []
    target: dict[str, Any] = {}
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
