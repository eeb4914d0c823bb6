"""What a predicted (simulated) run was: config.json's `simulation`, next to `kind: "predict"`.

The fleet the simulator ran (replicas, router, autoscaler, admission), the calibration it
charged the steps with, and what came out that no request record holds (replica-seconds,
steps, how long the simulation took, how many records were written).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from latlab.records.summary import Record

Router = Literal["round_robin", "least_outstanding", "prefix_affinity"]
ROUTERS: tuple[str, ...] = Router.__args__


class Autoscale(Record):
    """Scale on `metric` per ready replica (mean in-flight requests, or waiting requests)
    toward `target`, as Kubernetes' HPA does: desired = ceil(ready × metric / target).
    A new replica serves `lag_s` (the decision and provisioning) + `cold_start_s` (the
    server's start, e.g. from `latlab coldstart`) after the decision; one is drained after
    the desired count stayed below the ready count for `scale_down_after_s`."""

    metric: Literal["concurrency", "queue"] = "concurrency"
    target: float = Field(default=8.0, gt=0)
    min_replicas: int = Field(default=1, ge=1)
    max_replicas: int = Field(default=16, ge=1)
    interval_s: float = Field(default=5.0, gt=0)
    lag_s: float = Field(default=0.0, ge=0)
    cold_start_s: float = Field(default=0.0, ge=0)
    scale_down_after_s: float = Field(default=60.0, ge=0)

    @model_validator(mode="after")
    def _check(self) -> Autoscale:
        if self.max_replicas < self.min_replicas:
            raise ValueError(f"--max-replicas {self.max_replicas} is below --min-replicas "
                             f"{self.min_replicas}")
        return self


class Fleet(Record):
    """N replicas behind a router; with `autoscale`, `replicas` is the start."""

    replicas: int = Field(default=1, ge=1)
    router: Router = "least_outstanding"
    autoscale: Autoscale | None = None
    max_waiting: int | None = Field(default=None, ge=1)  # per replica; default: calibration's


class FleetOutcome(Record):
    """The fleet over the run: replica-seconds paid, the most ready at once, scale events."""

    replica_seconds: float
    mean_replicas: float
    peak_replicas: int
    scale_ups: int = 0
    scale_downs: int = 0
    timeline: list[tuple[float, int]] = []  # (seconds from the start, ready replicas)


class Simulation(Record):
    """config.json's `simulation` of a predicted run."""

    simulated: Literal[True] = True
    calibration: str  # the calibration file, or how it was made
    calibration_created: float | None = None
    calibration_fit: str = ""  # its headline: what, when, fit error
    server: str = ""
    fleet: Fleet = Fleet()
    replay: str | None = None  # the run folder whose requests were replayed
    outcome: FleetOutcome | None = None
    steps: int = 0
    decode_run_steps: int = 0
    preemptions: int = 0
    wall_s: float | None = None
    records_total: int = 0
    records_written: int = 0
    records_note: str | None = None
