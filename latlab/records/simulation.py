"""What a predicted (simulated) run was: config.json's `simulation`, next to `kind: "predict"`.

The fleet the simulator ran (replicas, router, autoscaler, admission), the calibration it
charged the steps with, and what came out that no request record holds (replica-seconds,
steps, how long the simulation took, how many records were written).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import field_validator, model_validator

from latlab.records.coldstart import COLDSTART_JSON, ColdstartRecord
from latlab.records.files import RunFolderError, read_json
from latlab.records.lengths import LengthDistribution
from latlab.records.scrape import METRICS, Scrape
from latlab.records.settings import AUTOSCALE, FLEET, TECHNIQUES, flag_of, setting
from latlab.records.summary import Record

Router = Literal["round_robin", "least_outstanding", "prefix_affinity", "random"]
ROUTERS: tuple[str, ...] = Router.__args__


def cold_start(value: Any) -> Any:
    """--cold-start: seconds, or a `latlab coldstart` folder (or its coldstart.json): the
    median time to ready."""
    if not isinstance(value, str):
        return value
    try:
        return float(value.rstrip("s"))
    except ValueError:
        pass
    path = Path(value)
    try:
        record = read_json(path / COLDSTART_JSON if path.is_dir() else path, ColdstartRecord)
    except RunFolderError as e:
        raise ValueError(f"{value!r}: seconds or a coldstart folder ({e})") from None
    ready = record.summary.get("ready_s")
    if ready is None or ready.median is None:
        raise ValueError(f"{value!r}: the coldstart run has no time to ready")
    return float(ready.median)


class Autoscale(Record):
    """Scale on `metric` per ready replica (mean in-flight requests, or waiting requests)
    toward `target`, as Kubernetes' HPA does: desired = ceil(ready × metric / target).
    A new replica serves `lag_s` (the decision and provisioning) + `cold_start_s` (the
    server's start, e.g. from `latlab coldstart`) after the decision; one is drained after
    the desired count stayed below the ready count for `scale_down_after_s`."""

    metric: Literal["concurrency", "queue"] = setting(
        ..., "Autoscale on concurrency (in flight per replica) or queue (waiting per "
        "replica).", "--autoscale", group=AUTOSCALE, cli_type=str | None)
    target: float = setting(8.0, "The metric's target per replica.", "--scale-target",
                            group=AUTOSCALE, gt=0)
    min_replicas: int = setting(1, "At least this many.", group=AUTOSCALE, ge=1)
    max_replicas: int = setting(16, "At most this many.", group=AUTOSCALE, ge=1)
    interval_s: float = setting(5.0, "Seconds between decisions.", "--scale-interval",
                                group=AUTOSCALE, gt=0)
    lag_s: float = setting(0.0, "Seconds from a decision to scale up until the new replica "
                           "starts (provisioning).", "--scale-lag", group=AUTOSCALE, ge=0)
    cold_start_s: float = setting(0.0, "A new replica's start: seconds, or a `latlab "
                                  "coldstart` folder (its median time to ready).",
                                  "--cold-start", group=AUTOSCALE, cli_type=str | None, ge=0)
    scale_down_after_s: float = setting(60.0, "Seconds below target before draining one.",
                                        "--scale-down-after", group=AUTOSCALE, ge=0)

    _cold_start = field_validator("cold_start_s", mode="before")(lambda v: cold_start(v))

    @model_validator(mode="before")
    @classmethod
    def _needs_metric(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("metric") is None:
            given = flag_of(cls, next(iter(data), "target"))
            raise ValueError(f"{given} goes with --autoscale concurrency|queue")
        return data

    @model_validator(mode="after")
    def _check(self) -> Autoscale:
        if self.max_replicas < self.min_replicas:
            raise ValueError(f"--max-replicas {self.max_replicas} is below --min-replicas "
                             f"{self.min_replicas}")
        return self


def reload_time(value: Any) -> Any:
    """--reload-time: seconds, or a `latlab coldstart` folder (or its coldstart.json) of a
    server started with --idle-unload: the median excess TTFT after its longest idle gap."""
    if not isinstance(value, str):
        return value
    try:
        return float(value.rstrip("s"))
    except ValueError:
        pass
    path = Path(value)
    try:
        record = read_json(path / COLDSTART_JSON if path.is_dir() else path, ColdstartRecord)
    except RunFolderError as e:
        raise ValueError(f"{value!r}: seconds or a coldstart folder ({e})") from None
    longest = max(record.idle, key=lambda gap: gap.gap_s, default=None)
    if longest is None or longest.excess_ttft.median is None:
        raise ValueError(f"{value!r}: the coldstart run probed no idle gap (--idle-gaps)")
    return max(0.0, float(longest.excess_ttft.median) / 1e3)


def measured_acceptance(value: Any) -> Any:
    """--acceptance: a distribution, or a run folder benched with --scrape against a server
    that speculates: the share of its drafts accepted over the run (one value for every
    request)."""
    path = Path(value) if isinstance(value, str) else None
    if path is None or not path.is_dir():
        return value
    try:
        lines = (path / METRICS).read_bytes().splitlines()
    except OSError as e:
        raise ValueError(f"{value!r}: a distribution or a run folder with {METRICS} "
                         f"({e.strerror or e})") from None
    counts = [Scrape.model_validate_json(line).values for line in lines if line.strip()]
    seen = [c for c in counts if "spec_draft_tokens" in c and "spec_accepted_tokens" in c]
    drafts = seen[-1]["spec_draft_tokens"] - seen[0]["spec_draft_tokens"] if seen else 0
    if drafts <= 0:
        raise ValueError(f"{value!r}: its scrapes count no speculative drafts (bench --scrape "
                         "against a server that speculates)")
    share = (seen[-1]["spec_accepted_tokens"] - seen[0]["spec_accepted_tokens"]) / drafts
    return LengthDistribution(kind="fixed", a=max(share, 1e-9))


class Fleet(Record):
    """N replicas behind a router; with `autoscale`, `replicas` is the start. What each
    replica does beside its engine's scheduling (latlab serve's techniques that change when
    requests run): a queue deadline, idle unload, speculative decoding."""

    replicas: int = setting(1, "Replicas behind the router (with --autoscale: at the start).",
                            group=FLEET, ge=1)
    router: Router = setting("least_outstanding", "round_robin, least_outstanding, "
                             "prefix_affinity or random.", group=FLEET, cli_type=str)
    autoscale: Autoscale | None = None
    max_waiting: int | None = setting(None, "Per replica: requests waiting beyond this get 429 "
                                      "(default: the calibration's).", group=FLEET, ge=1)
    max_queue_delay: float | None = setting(
        None, "Per replica: a request not scheduled within this many seconds gets a 503 "
        "(latlab serve --max-queue-delay).", group=TECHNIQUES, gt=0)
    idle_unload: float | None = setting(
        None, "Per replica: unload the model after this many idle seconds; the next request "
        "waits --reload-time for it to load again.", group=TECHNIQUES, gt=0)
    reload_s: float | None = setting(
        None, "With --idle-unload: the seconds a model takes to load again, or a latlab "
        "coldstart folder (its excess TTFT after the longest idle gap).", "--reload-time",
        group=TECHNIQUES, cli_type=str | None, ge=0)
    speculative_tokens: int | None = setting(
        None, "Speculative decoding: drafts proposed a decode step, verified in it.",
        group=TECHNIQUES, ge=1, le=16)
    acceptance: LengthDistribution | None = setting(
        None, "With --speculative-tokens: each request's chance of accepting a draft, a "
        "distribution (fixed:P, uniform:LO,HI, normal:MEAN,STD; at most 1), or a run folder "
        "benched with --scrape against the speculating server (its share accepted).",
        group=TECHNIQUES, cli_type=str | None)
    draft_ms: float = setting(0.0, "With --speculative-tokens: ms a step spends proposing "
                              "the drafts (a draft model's own steps).", group=TECHNIQUES, ge=0)

    _reload = field_validator("reload_s", mode="before")(lambda v: reload_time(v))
    _acceptance = field_validator("acceptance", mode="before")(lambda v: measured_acceptance(v))

    @model_validator(mode="after")
    def _techniques(self) -> Fleet:
        if self.idle_unload is not None and self.reload_s is None:
            raise ValueError("--idle-unload needs --reload-time: the seconds the model takes "
                             "to load again (or a latlab coldstart folder)")
        if self.reload_s is not None and self.idle_unload is None:
            raise ValueError("--reload-time goes with --idle-unload")
        if self.speculative_tokens is not None and self.acceptance is None:
            raise ValueError("--speculative-tokens needs --acceptance: each request's chance "
                             "of accepting a draft (e.g. uniform:0.5,0.9)")
        return self

    def unused_techniques(self) -> str | None:
        """A flag given for speculative decoding that nothing speculates for (it may be set
        before `--serve-args` turns speculation on)."""
        if self.speculative_tokens is None:
            for flag, given in (("--acceptance", self.acceptance is not None),
                                ("--draft-ms", bool(self.draft_ms))):
                if given:
                    return (f"{flag} goes with --speculative-tokens (or --serve-args "
                            "--speculative-method)")
        return None


class FleetOutcome(Record):
    """The fleet over the run: replica-seconds paid, the most ready at once, scale events."""

    replica_seconds: float
    mean_replicas: float
    peak_replicas: int
    scale_ups: int = 0
    scale_downs: int = 0
    timeline: list[tuple[float, int]] = []  # (seconds from the start, ready replicas)
    reloads: int = 0  # models loaded again after an idle unload


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
