"""`config.json`: what a run asked for and what it ran against.

`RunConfig` is the whole of `config.json`: the configuration that reruns the run (a bench's
`BenchConfig`, a cold start's `ColdstartConfig`), the target it ran against, the command line
(secrets redacted) and the clock anchor that maps the client's monotonic stamps to dates and
fixes the measurement window.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from latlab.records import SCHEMA_VERSION
from latlab.records.arrivals import OPEN_LOOP
from latlab.records.bench import BenchConfig
from latlab.records.cluster import RayCluster
from latlab.records.coldstart import ColdstartConfig
from latlab.records.observe import ObserveConfig
from latlab.records.server import ServerSettings
from latlab.records.simulation import Simulation
from latlab.records.slo import slo_dict
from latlab.records.target import ServerKind


class Clock(BaseModel):
    """The clock anchor: `perf_counter_ns` and unix time read together, the schedule's start
    `t0_ns` and, once known, the window's `end_ns` (all on the client's monotonic clock)."""

    perf_counter_ns: int | None = None
    unix_time: float | None = None
    t0_ns: int | None = None
    end_ns: int | None = None


class Gateway(BaseModel):
    """A gateway or proxy in front of the engine: what it is (`LiteLLM 1.108.13`, `nginx`)
    and what gave it away (a header, `--server-url`)."""

    name: str
    evidence: str


class Target(BaseModel):
    """What was measured: its URL and model, and whether latlab started it."""

    model_config = ConfigDict(extra="allow")

    url: str | None = None
    model: str | None = None
    embedded: bool = False  # latlab serve, started by latlab
    launch: str | None = None  # the command template latlab started the server with
    api_key_given: bool = False
    engine_ready_s: float | None = None
    server_kind: ServerKind | None = None
    otlp_endpoint: str | None = None
    rtt_ms: float | None = None  # a null request's round trip before the run
    max_model_len: int | None = None  # the context the server lists for the model
    settings: ServerSettings | None = None  # what the server says of its own settings
    refused_fields: list[str] | None = None  # latlab's nonstandard fields the server refused
    gateway: Gateway | None = None  # a gateway in front of the engine, as detected
    server_url: str | None = None  # the engine behind the gateway (--server-url)


class RunConfig(BaseModel):
    """`config.json`: everything needed to rerun a run and to read its records. A predicted
    run (`kind: "predict"`, written by `latlab predict`) was simulated, not measured: its
    `simulation` says how, and `bench` holds the workload it was asked for. An observed run
    (`kind: "observed"`, `latlab observe`) sent nothing: its records are a service's own
    traffic, `observe` says where its spans came from, and `bench` holds the synthetic
    workload fitted to that traffic (what `latlab bench --config` reruns)."""

    model_config = ConfigDict(extra="allow")

    schema_version: int = SCHEMA_VERSION
    kind: Literal["bench", "coldstart", "predict", "observed"] = "bench"
    latlab_version: str = ""
    command: str = ""
    name: str | None = None
    tags: list[str] = []
    bench: BenchConfig | None = None
    coldstart: ColdstartConfig | None = None
    observe: ObserveConfig | None = None
    target: Target = Target()
    warmup_s: float = 0.0
    cooldown_s: float = 0.0
    duration_s: float | None = None
    slos: dict[str, float] = {}
    concurrency: int | None = None
    clock: Clock = Clock()
    ray: RayCluster | None = None  # the cluster and its nodes' clocks (`--ray`)
    failed: str | None = None  # why the run did not start (no request was sent)
    simulation: Simulation | None = None  # what `latlab predict` simulated (no request sent)

    @property
    def simulated(self) -> bool:
        return self.simulation is not None

    @property
    def users(self) -> int | None:
        """A closed loop's users (None: an open loop, or not a bench run)."""
        a = self.bench.arrivals if self.bench else None
        return a.users if a is not None and not a.open_loop else None

    _slos = field_validator("slos", mode="before")(lambda value: slo_dict(value))

    @model_validator(mode="before")
    @classmethod
    def _burst_as_null(cls, data: Any) -> Any:
        """A `--rate inf` run written before infinity was written as "inf": its open-loop
        rate is null (JSON has no infinity), and it can only have been a burst."""
        bench = data.get("bench") if isinstance(data, dict) else None
        arrivals = bench.get("arrivals") if isinstance(bench, dict) else None
        if isinstance(arrivals, dict) and arrivals.get("process") in OPEN_LOOP \
                and "rate" in arrivals and arrivals["rate"] is None:
            data = {**data, "bench": {**bench, "arrivals": {**arrivals, "rate": float("inf")}}}
        return data
