"""A cold-start run's settings (`ColdstartConfig`) and `coldstart.json`: each start of the
server, its time to ready, the first request against the warm ones after it, the requests
after idle gaps, and the spread over the starts."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, Literal

from pydantic import field_serializer, field_validator, model_validator

from latlab.records import SCHEMA_VERSION
from latlab.records.bench import OutputConfig, TargetConfig, engine_tokenizer
from latlab.records.settings import COLDSTART, TARGET, derive, setting
from latlab.records.summary import Record
from latlab.records.target import redact
from latlab.records.transport import RequestConfig
from latlab.records.workload import WorkloadConfig

COLDSTART_JSON = "coldstart.json"
DEFINITIONS = {
    "ready_s": "from just before the server process starts to the first 200 of its readiness "
               "URL (polled every 20 ms)",
    "warm": "median of the requests that follow the first, one at a time, on the same process",
    "excess": "first request − warm median (TTFT, E2E as in bench)",
    "idle": "the request after the server sat idle for the gap − the same run's warm median",
}


class Spread(Record):
    """Median, min and max over the starts that have the value."""

    n: int
    median: float | None
    min: float | None
    max: float | None


class FirstRequest(Record):
    id: str
    ok: bool
    error: str | None
    ttft: float | None
    e2e: float | None


class WarmBaseline(Record):
    ttft: float | None
    e2e: float | None
    n: int
    ids: list[str]


class Excess(Record):
    ttft: float | None
    e2e: float | None


class IdleProbe(Record):
    gap_s: float
    id: str
    ok: bool
    ttft: float | None
    e2e: float | None
    excess_ttft: float | None
    excess_e2e: float | None


class Start(Record):
    """One start of the server and its probes."""

    run: int
    ready_s: float | None
    first: FirstRequest
    warm: WarmBaseline
    excess: Excess
    idle: list[IdleProbe] = []
    error: str | None = None


class IdleSpread(Record):
    gap_s: float
    ttft: Spread
    excess_ttft: Spread
    e2e: Spread
    excess_e2e: Spread


class ColdstartRecord(Record):
    """Everything `coldstart.json` holds."""

    schema_version: int = SCHEMA_VERSION
    kind: Literal["coldstart"] = "coldstart"
    target: dict[str, Any] = {}
    runs: list[Start] = []
    summary: dict[str, Spread] = {}
    idle: list[IdleSpread] = []
    interrupted: bool = False
    definitions: dict[str, str] = DEFINITIONS


def seconds(value: Any) -> Any:
    """`"500ms,5s,1m"` → `[0.5, 5.0, 60.0]` (a bare number is seconds); lists pass."""
    if not isinstance(value, str):
        return value
    units = {"ms": 1e-3, "s": 1.0, "m": 60.0, "": 1.0}
    gaps = []
    for item in (i.strip() for i in value.split(",") if i.strip()):
        number = item.rstrip("ms")
        try:
            gaps.append(float(number) * units[item[len(number):]])
        except (ValueError, KeyError):
            raise ValueError(f"{item!r}: expected a duration like 500ms, 5s or 1m") from None
    return gaps


class ColdstartConfig(TargetConfig, RequestConfig, OutputConfig):
    """The server to start (`command` + `url` + `ready_url`, or the embedded engine with
    `serve_args`), how often, and the probe requests."""

    runs: int = setting(3, "How many times to start the server.", group=COLDSTART, ge=1,
                        le=100)
    command: list[str] = setting([], "The server command to start (default: the embedded "
                                 "engine, with --serve-args).", group=TARGET, cli_type=str)
    url: str | None = setting(None, "Where --command's server answers requests "
                              "(http://HOST:PORT).", group=TARGET)
    ready_url: str | None = setting(None, "Polled until it answers 200 (default: --url + "
                                    "/v1/models).", group=TARGET)
    warm_requests: int = setting(5, "Requests after the first; their median is the warm "
                                 "baseline.", group=COLDSTART, ge=1, le=1000)
    idle_gaps_s: list[float] = setting([1.0, 5.0], "Idle gaps to probe, e.g. 1s,5s,30s "
                                       "(empty: none).", group=COLDSTART, cli_type=str)
    ready_timeout_s: float = setting(300.0, "Seconds to wait for the server to be ready.",
                                     group=COLDSTART, gt=0)
    workload: WorkloadConfig = WorkloadConfig(prompt_tokens="128", output_tokens="32")

    _command = field_validator("command", mode="before")(
        lambda value: shlex.split(value) if isinstance(value, str) else value)
    _gaps = field_validator("idle_gaps_s", mode="before")(lambda value: seconds(value))

    @field_serializer("serve_args", "command")
    def _redacted(self, argv: list[str]) -> list[str]:
        return redact(argv)

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
        if self.name is None:
            derive(self, name=Path(self.command[0]).name if self.command else "engine")
        if not self.command and self.workload.tokenizer is None:
            derive(self.workload, tokenizer=engine_tokenizer(self.serve_args))
        return self
