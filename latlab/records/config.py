"""What a run asked for: the workload, the arrivals, the bench settings, and `config.json`.

`RunConfig` is the whole of `config.json`: the configuration that reruns the run, the target
it ran against, the command line (secrets redacted) and the clock anchor that maps the
client's monotonic stamps to dates and fixes the measurement window.
"""

from __future__ import annotations

import re
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (BaseModel, ConfigDict, Field, SecretStr, field_serializer, field_validator,
                      model_validator)

from latlab.records import SCHEMA_VERSION
from latlab.records.cluster import RayCluster
from latlab.records.simulation import Simulation
from latlab.records.workload import ArrivalConfig, WorkloadConfig

MAX_LOCAL_WORKERS = 64
SLO_METRICS = ("ttft", "ttft_sched", "tpot", "itl", "e2e", "e2e_sched")


class ServerKind(StrEnum):
    """Whose server timings to read (`latlab.load.request.server_timing`); `auto` tells them apart."""

    AUTO = "auto"
    LATLAB = "latlab"
    LLAMACPP = "llamacpp"
    VLLM = "vllm"
    SGLANG = "sglang"
    TGI = "tgi"
    OLLAMA = "ollama"
    OPENAI = "openai"  # any other OpenAI-compatible server: the client's view only


_SLO = re.compile(r"^\s*(?P<name>[a-z][a-z0-9_]*)\s*(?:=|<=?)\s*(?P<value>[0-9.]+)\s*(?P<unit>ms|s|us)?\s*$")
_UNIT_MS = {"ms": 1.0, "s": 1000.0, "us": 0.001, None: 1.0}


SECRETS = ("--api-key",)
_INLINE_SECRET = re.compile(r"(--api-key(?:=|\s+))(\"[^\"]*\"|'[^']*'|\S+)")
HIDDEN = "***"


def redact(argv: list[str] | tuple[str, ...]) -> list[str]:
    """A command line with every secret replaced: `--api-key KEY`, `--api-key=KEY`, and the
    same inside one argument (`--serve-args "--api-key KEY"`). Nothing stored or printed
    holds a secret."""
    out: list[str] = []
    hide = False
    for arg in argv:
        if hide:
            out.append(HIDDEN)
            hide = False
        elif arg in SECRETS:
            out.append(arg)
            hide = True
        else:
            out.append(_INLINE_SECRET.sub(rf"\g<1>{HIDDEN}", arg))
    return out


def server_root(url: str | None) -> str | None:
    """A server's root URL: `http://HOST:PORT`, also from its OpenAI base URL (`…/v1`)."""
    if url is None:
        return None
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"--url {url!r}: expected http://HOST:PORT or https://...")
    root = url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


def parse_slo(text: str) -> tuple[str, float]:
    """`"ttft=200ms"` → `("ttft", 200.0)`. `itl` bounds every token gap of a request."""
    match = _SLO.match(text)
    if not match:
        raise ValueError(f"bad SLO {text!r}: expected NAME=VALUE[ms|s|us], e.g. ttft=200ms")
    name = match["name"]
    if name not in SLO_METRICS:
        raise ValueError(f"bad SLO {text!r}: unknown metric {name!r} (one of {', '.join(SLO_METRICS)})")
    value = float(match["value"]) * _UNIT_MS[match["unit"]]
    if value <= 0:
        raise ValueError(f"bad SLO {text!r}: the limit must be positive")
    return name, value


class BenchConfig(BaseModel):
    """A bench run: the target, the workload, the arrivals and when to stop."""

    url: str | None = None
    model: str | None = None
    api_key: SecretStr | None = Field(default=None, exclude=True)
    serve_args: list[str] = []
    workload: WorkloadConfig = WorkloadConfig()
    arrivals: ArrivalConfig = ArrivalConfig()
    duration_s: float | None = Field(default=20.0, gt=0)
    requests: int | None = Field(default=None, ge=1)
    warmup_s: float = Field(default=0.0, ge=0)
    cooldown_s: float = Field(default=0.0, ge=0)
    timeout_s: float = Field(default=300.0, gt=0)
    drain_s: float = Field(default=30.0, ge=0)
    workers: Annotated[int, Field(ge=1, le=1024)] | Literal["auto"] = 1
    ray: str | None = None  # a Ray cluster's address ("auto": a local one) to run workers on
    ignore_eos: bool = True
    continuous_usage: bool = True
    stream: bool = True
    keepalive: bool = True
    server_kind: ServerKind = ServerKind.AUTO
    otlp_port: int | None = Field(default=None, ge=0, le=65535)
    span_wait_s: float = Field(default=10.0, ge=0)
    scrape_interval_s: float | None = Field(default=None, gt=0)
    slos: dict[str, float] = {}
    out: Path = Path("runs")
    name: str = "bench"
    tags: list[str] = []

    @field_serializer("serve_args")
    def _redacted(self, serve_args: list[str]) -> list[str]:
        return redact(serve_args)

    _root = field_validator("url")(lambda url: server_root(url))

    @model_validator(mode="after")
    def _check(self) -> BenchConfig:
        if self.duration_s is None and self.requests is None and self.arrivals.process != "trace":
            raise ValueError("give --duration or --requests")
        if self.arrivals.rate == float("inf") and self.requests is None:
            raise ValueError("--rate inf sends every request at once: bound it with --requests N "
                             "(and --max-concurrency to cap how many are in flight)")
        if self.duration_s is not None and self.warmup_s + self.cooldown_s >= self.duration_s:
            raise ValueError(f"--warmup {self.warmup_s:g} s + --cooldown {self.cooldown_s:g} s "
                             f"leave nothing of --duration {self.duration_s:g} s")
        if self.workers != "auto":
            self._check_workers(self.workers)
        for name, limit in self.slos.items():
            if name not in SLO_METRICS or limit <= 0:
                raise ValueError(f"--slo {name}={limit}: unknown metric or non-positive limit")
        return self

    def _check_workers(self, workers: int) -> None:
        if self.ray is None and workers > MAX_LOCAL_WORKERS:
            raise ValueError(f"--workers {workers}: at most {MAX_LOCAL_WORKERS} processes on "
                             "one machine; spread more over a Ray cluster with --ray")
        a = self.arrivals
        if a.process == "closed" and a.users < workers:
            raise ValueError(f"--users {a.users} cannot be shared by --workers {workers}")
        if a.max_concurrency is not None and a.max_concurrency < workers:
            raise ValueError(f"--max-concurrency {a.max_concurrency} cannot be shared by "
                             f"--workers {workers}")

    def share(self, total: int, worker: int) -> int:
        """Worker `worker`'s share of `total` users or concurrency slots."""
        return total // self.workers + (1 if worker < total % self.workers else 0)


class ColdstartConfig(BaseModel):
    """The server to start (`command` + `url` + `ready_url`, or the embedded engine with
    `serve_args`), how often, and the probe requests."""

    runs: int = Field(default=3, ge=1, le=100)
    command: list[str] = []
    url: str | None = None
    ready_url: str | None = None
    serve_args: list[str] = []
    model: str | None = None
    api_key: SecretStr | None = Field(default=None, exclude=True)
    workload: WorkloadConfig = WorkloadConfig()
    warm_requests: int = Field(default=5, ge=1, le=1000)
    idle_gaps_s: list[float] = []
    ready_timeout_s: float = Field(default=300.0, gt=0)
    timeout_s: float = Field(default=300.0, gt=0)
    ignore_eos: bool = True
    continuous_usage: bool = True
    out: Path = Path("runs")
    name: str = "engine"
    tags: list[str] = []

    @field_serializer("serve_args", "command")
    def _redacted(self, argv: list[str]) -> list[str]:
        return redact(argv)

    _root = field_validator("url")(lambda url: server_root(url))

    @model_validator(mode="after")
    def _check(self) -> ColdstartConfig:
        if self.command and self.url is None:
            raise ValueError("--command needs --url, where its server answers requests")
        if not self.command and (self.url is not None or self.ready_url is not None):
            raise ValueError("--url and --ready-url go with --command: coldstart starts the "
                             "server itself (without --command, the embedded engine)")
        if self.command and self.serve_args:
            raise ValueError("--serve-args is for the embedded engine; put the options into "
                             "--command")
        if any(g < 0 for g in self.idle_gaps_s):
            raise ValueError(f"--idle-gaps {self.idle_gaps_s}: gaps cannot be negative")
        return self


class Clock(BaseModel):
    """The clock anchor: `perf_counter_ns` and unix time read together, the schedule's start
    `t0_ns` and, once known, the window's `end_ns` (all on the client's monotonic clock)."""

    perf_counter_ns: int | None = None
    unix_time: float | None = None
    t0_ns: int | None = None
    end_ns: int | None = None


class Target(BaseModel):
    """What was measured: its URL and model, and whether latlab started it."""

    model_config = ConfigDict(extra="allow")

    url: str | None = None
    model: str | None = None
    embedded: bool = False
    api_key_given: bool = False
    engine_ready_s: float | None = None
    server_kind: ServerKind | None = None
    otlp_endpoint: str | None = None
    rtt_ms: float | None = None  # a null request's round trip before the run
    max_model_len: int | None = None  # the context the server lists for the model


class RunConfig(BaseModel):
    """`config.json`: everything needed to rerun a run and to read its records. A predicted
    run (`kind: "predict"`, written by `latlab predict`) was simulated, not measured: its
    `simulation` says how, and `bench` holds the workload it was asked for."""

    model_config = ConfigDict(extra="allow")

    schema_version: int = SCHEMA_VERSION
    kind: Literal["bench", "coldstart", "predict"] = "bench"
    latlab_version: str = ""
    command: str = ""
    name: str | None = None
    tags: list[str] = []
    bench: BenchConfig | None = None
    coldstart: ColdstartConfig | None = None
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

    @field_validator("slos", mode="before")
    @classmethod
    def _slo_list(cls, value: Any) -> Any:
        """Also `["ttft=200ms", ...]`, as a hand-written config may say it."""
        if isinstance(value, list):
            return dict(parse_slo(str(item)) for item in value)
        return value
