"""A bench run's settings (`config.json` → `bench`), declared once as groups a config
composes: the target, the client (`records.transport`), when to stop, telemetry, the output.
Each field that is an option says its flag and help group (`records.settings`); its defaults,
the derived ones included (the warm-up from the duration, the run's name from its target),
are here.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, field_serializer, field_validator, model_validator

from latlab.records.arrivals import ArrivalConfig
from latlab.records.settings import OUTPUT, STOP, TARGET, TELEMETRY, derive, setting
from latlab.records.slo import slo_dict
from latlab.records.target import redact, server_root
from latlab.records.transport import TransportConfig
from latlab.records.workload import WorkloadConfig

MAX_LOCAL_WORKERS = 64
DEFAULT_DURATION_S = 20.0


def serve_args(value: Any) -> Any:
    """--serve-args as arguments: a command line is split as a shell would."""
    if not isinstance(value, str):
        return value
    try:
        return shlex.split(value)
    except ValueError as e:
        raise ValueError(f"{e}") from None


class TargetConfig(BaseModel):
    """What to measure: a server's URL, or latlab's engine started with `serve_args`."""

    url: str | None = setting(None, "Target server (http://HOST:PORT). Without it the embedded "
                              "engine (latlab serve) is started.", group=TARGET)
    serve_args: list[str] = setting([], "Arguments for the embedded latlab serve (with "
                                    "--launch: the command's {args}).", group=TARGET,
                                    cli_type=str)
    launch: str | None = setting(None, "Start this server command and measure it instead: any "
                                 "command, with {port} for the free port latlab picks and "
                                 "{args} for --serve-args (ab: --a/--b); latlab waits until it "
                                 "is ready, keeps its log in the run folder and stops it by "
                                 "its PID.", group=TARGET)
    launch_ready: str = setting("/health", "The path that answers 200 once the --launch server "
                                "is ready.", group=TARGET)
    launch_timeout_s: float = setting(300.0, "Seconds the --launch server may take to be ready.",
                                      "--launch-timeout", group=TARGET, gt=0)
    server_url: str | None = setting(None, "The engine behind a gateway at --url "
                                     "(http://HOST:PORT): its /metrics scraped, its settings "
                                     "read for the advice, its process the server on the host "
                                     "line. The requests still go to --url.", group=TARGET)

    _root = field_validator("url")(lambda url: server_root(url))
    _engine = field_validator("server_url")(lambda url: server_root(url, "--server-url"))
    _args = field_validator("serve_args", mode="before")(lambda value: serve_args(value))

    @field_validator("launch")
    @classmethod
    def _template(cls, template: str | None) -> str | None:
        if template is not None and "{port}" not in template:
            raise ValueError("--launch: a command with {port} where the server's port goes "
                             "(e.g. \"llama-server -m M --port {port} {args}\")")
        return template

    def check_target(self) -> None:
        """A URL and a command to launch are two targets (ab and sweep set both: the URL is
        the launched server's)."""
        if self.launch is not None and self.url is not None:
            raise ValueError("--launch starts the server latlab measures: drop --url")

    @field_serializer("serve_args")
    def _redacted(self, args: list[str]) -> list[str]:
        return redact(args)


class StopConfig(BaseModel):
    """How long the load runs, what the statistics exclude, and the processes sending it."""

    duration_s: float | None = setting(None, "Seconds of load (default: 20 unless "
                                       "--requests).", group=STOP, gt=0)
    requests: int | None = setting(None, "Stop after this many requests.", group=STOP, ge=1)
    warmup_s: float | None = setting(None, "Seconds excluded from statistics at the start "
                                     "(default: 10% of --duration, at most 5).", group=STOP,
                                     ge=0)
    cooldown_s: float | None = setting(None, "Seconds excluded at the end (default: 5% of "
                                       "--duration, at most 2).", group=STOP, ge=0)
    drain_s: float = setting(30.0, "After --duration, seconds the requests in flight may "
                             "still take; then they are cancelled and recorded as "
                             "unfinished.", group=STOP, ge=0)
    workers: Annotated[int, Field(ge=1, le=1024)] | Literal["auto"] = setting(
        1, "Client processes sharing the schedule, or `auto`: as many as the offered load "
        "needs, from a short self-check of this machine.", group=STOP, cli_type=str)
    ray: str | None = setting(None, "Run the workers as Ray actors spread over a cluster's "
                              "nodes: its head's HOST:PORT, or `auto` for the cluster on this "
                              "machine (started for the run if none runs).", group=STOP,
                              metavar="ADDRESS")

    @field_validator("workers", mode="before")
    @classmethod
    def _count(cls, value: Any) -> Any:
        if isinstance(value, str) and value != "auto":
            if not value.strip().lstrip("-").isdigit():
                raise ValueError("expected a count or auto")
            return int(value)
        return value

    def window(self) -> None:
        """The warm-up and cool-down not given: 10% of the duration (at most 5 s) and 5% (at
        most 2 s); none for a run without a duration."""
        d = self.duration_s
        if self.warmup_s is None:
            derive(self, warmup_s=min(0.1 * d, 5.0) if d else 0.0)
        if self.cooldown_s is None:
            derive(self, cooldown_s=min(0.05 * d, 2.0) if d else 0.0)
        if d is not None and self.warmup_s + self.cooldown_s >= d:
            raise ValueError(f"--warmup {self.warmup_s:g} s + --cooldown {self.cooldown_s:g} s "
                             f"leave nothing of --duration {d:g} s")


class TelemetryConfig(BaseModel):
    """What latlab collects from the server besides its answers."""

    otlp_port: int | None = setting(None, "Receive the server's OpenTelemetry spans "
                                    "(OTLP/HTTP, protobuf or JSON) on this loopback port (0: a "
                                    "free one) and join them to the requests.", group=TELEMETRY,
                                    ge=0, le=65535)
    app_spans: list[str] = setting([], "A span name that is an application's own work (e.g. "
                                   "retrieval; repeatable): its spans under each trace's root "
                                   "become components of the request's time, and no others.",
                                   "--app-span", group=TELEMETRY)
    span_wait_s: float = setting(10.0, "Seconds to wait after the load for the server's last "
                                 "spans (exporters send in batches).", group=TELEMETRY, ge=0)
    scrape_interval_s: float | None = setting(None, "Poll the target's Prometheus /metrics "
                                              "every this many seconds (e.g. 0.5) and keep "
                                              "the time series.", "--scrape",
                                              group=TELEMETRY, gt=0)


class SloConfig(BaseModel):
    """What the run is judged by."""

    slos: dict[str, float] = setting({}, "SLO like ttft=200ms or tpot=50ms (repeatable); sets "
                                     "goodput.", "--slo", group=OUTPUT, cli_type=list[str])

    _slos = field_validator("slos", mode="before")(lambda value: slo_dict(value))


class OutputConfig(BaseModel):
    """Where the run is written and what it is called."""

    out: Path = setting(Path("runs"), "Folder for run folders.", group=OUTPUT)
    name: str | None = setting(None, "Run name (in the folder name).", group=OUTPUT)
    tags: list[str] = setting([], "Free-form tag recorded in config.json (repeatable).",
                              "--tag", group=OUTPUT)


class BenchConfig(TargetConfig, TransportConfig, StopConfig, TelemetryConfig, SloConfig,
                  OutputConfig):
    """A bench run: the target, the workload, the arrivals and when to stop."""

    workload: WorkloadConfig = WorkloadConfig()
    arrivals: ArrivalConfig = ArrivalConfig()

    @model_validator(mode="before")
    @classmethod
    def _seeds(cls, data: Any) -> Any:
        """The arrivals' seed is the workload's (one --seed), unless given apart."""
        if isinstance(data, dict) and isinstance(data.get("arrivals"), dict) \
                and "seed" not in data["arrivals"]:
            seed = (data.get("workload") or {}).get("seed") \
                if isinstance(data.get("workload"), dict) else None
            if seed is not None:
                data = data | {"arrivals": data["arrivals"] | {"seed": seed}}
        return data

    @model_validator(mode="after")
    def _check(self) -> BenchConfig:
        if self.duration_s is None and self.requests is None and self.arrivals.process != "trace":
            derive(self, duration_s=DEFAULT_DURATION_S)
        if self.arrivals.burst:
            self._check_burst()
        self.window()
        if self.name is None:
            derive(self, name="engine" if self.url is None and self.launch is None else "bench")
        if self.server_url is not None and self.url is None:
            raise ValueError("--server-url names the engine behind a gateway at --url: give "
                             "--url too")
        w = self.workload
        if self.url is None and self.launch is None and w.tokenizer is None:
            derive(w, tokenizer=engine_tokenizer(self.serve_args))
        if w.sessions is not None:
            w.sessions.think_default(self.duration_s)
            turns = w.sessions.turns
            if (turns is not None and turns.kind == "fixed" and self.requests is not None
                    and self.requests < turns.a):
                raise ValueError(f"--requests {self.requests} is fewer than one session's "
                                 f"{int(turns.a)} requests: sessions run whole")
        if self.workers != "auto":
            self._check_workers(self.workers)
        return self

    def _check_burst(self) -> None:
        """A burst is measured whole: its window runs from its start to its last request's
        end (no warm-up, no cool-down: they would leave out requests all scheduled at t0)."""
        if self.requests is None:
            raise ValueError("--rate inf sends every request at once: bound it with --requests N "
                             "(and --max-concurrency to cap how many are in flight)")
        for name in ("warmup_s", "cooldown_s"):
            if getattr(self, name):
                raise ValueError(f"--rate inf schedules every request at its start: "
                                 f"--{name.removesuffix('_s')} would leave out all or none; "
                                 "drop it")
        derive(self, warmup_s=0.0, cooldown_s=0.0)

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


def engine_tokenizer(serve: list[str]) -> str | None:
    """The embedded engine's checkpoint folder, when it serves one: prompts are then counted
    in that model's tokens."""
    for i, arg in enumerate(serve):
        value = serve[i + 1] if arg == "--model" and i + 1 < len(serve) else (
            arg.removeprefix("--model=") if arg.startswith("--model=") else None)
        if value and (Path(value) / "tokenizer.json").is_file():
            return value
    return None
