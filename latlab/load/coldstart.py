"""`run_coldstart`: start a server several times and measure what its first request costs.

    result = run_coldstart(ColdstartConfig(runs=3, serve_args=["--model", "tiny"]))
    result.data["summary"]["excess_ttft"]["median"]

Each run starts the server (the embedded engine, or `command` with its `ready_url`) in a new
process group and times it from just before the start to the first 200 of the readiness URL
(polled every 20 ms). Then, on the same process, one request at a time: the first request,
`warm_requests` more (their median is the warm baseline), and after each idle gap one more
request. Every probe uses the load generator's client on a fresh connection, so connection
reuse favours no request, and is recorded as a timeline in requests.jsonl. The server is
stopped after every run, on errors and on Ctrl-C.
"""

from __future__ import annotations

import asyncio
import secrets
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter_ns
from typing import Any, Sequence

import numpy as np
import orjson
from pydantic import BaseModel, Field, SecretStr, model_validator
from rich.console import Console

from latlab import __version__
from latlab.load.client import Client, list_models
from latlab.load.config import BenchError
from latlab.load.target import EngineError, ServerProcess, answers, start_engine, start_server
from latlab.load.workload import Workload, WorkloadConfig
from latlab.metrics import request_metrics
from latlab.records.folder import RecordWriter, RunFolder
from latlab.records.timeline import RequestTimeline

COLDSTART_JSON = "coldstart.json"
READY_POLL_S = 0.02
MODELS_TIMEOUT_S = 10.0


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
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"--url {self.url!r}: expected http://HOST:PORT")
        if any(g < 0 for g in self.idle_gaps_s):
            raise ValueError(f"--idle-gaps {self.idle_gaps_s}: gaps cannot be negative")
        return self


@dataclass
class ColdstartResult:
    run: RunFolder
    data: dict[str, Any]
    interrupted: bool


def run_coldstart(config: ColdstartConfig, *, console: Console | None = None,
                  command: Sequence[str] | None = None) -> ColdstartResult:
    """Run every start to the end (or Ctrl-C), writing coldstart.json after each. Raises
    `BenchError` when a server cannot be started or used (after writing what was measured)."""
    from latlab.store import RunStore

    console = console or Console(stderr=True)
    workload = Workload(config.workload)
    run = RunFolder.create(config.out, f"coldstart-{config.name}")
    settings = {"kind": "coldstart", "latlab_version": __version__,
                "command": shlex.join(command if command is not None else sys.argv),
                "name": run.path.name, "tags": config.tags,
                "coldstart": config.model_dump(mode="json"),
                "target": {"url": config.url, "model": config.model,
                           "embedded": not config.command},
                "clock": {"perf_counter_ns": perf_counter_ns(), "unix_time": time.time()}}
    run.write_config(settings)
    runs: list[dict[str, Any]] = []
    interrupted = False
    try:
        with run.record_writer() as writer:
            for i in range(config.runs):
                console.print(f"[bold]start {i + 1} of {config.runs}[/]", highlight=False)
                runs.append(_one_start(config, workload, run, writer, i, settings["target"]))
                console.print(_line(runs[-1]), style="dim", highlight=False)
                _write(run, settings, runs, interrupted)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        run.write_config(settings)
        data = _write(run, settings, runs, interrupted)
        with RunStore(config.out) as store:
            records = run.read_records()
            store.register(run.path, "coldstart", settings,
                           {"requests": len(records), "ok": sum(r.ok for r in records)})
    return ColdstartResult(run, data, interrupted)


def _one_start(config: ColdstartConfig, workload: Workload, run: RunFolder, writer: RecordWriter,
               i: int, target: dict[str, Any]) -> dict[str, Any]:
    log = run.path / f"server-{i + 1}.log"
    try:
        if config.command:
            ready_url = config.ready_url or config.url.rstrip("/") + "/v1/models"
            if answers(ready_url):
                raise BenchError(f"{ready_url} already answers before the server was started: "
                                 "stop whatever serves it, or the time to ready means nothing")
            server = start_server(config.command, config.url, ready_url, log_path=log,
                                  ready_timeout_s=config.ready_timeout_s, poll_s=READY_POLL_S,
                                  name=config.command[0])
        else:
            server = start_engine(config.serve_args, log_path=log, poll_s=READY_POLL_S,
                                  ready_timeout_s=config.ready_timeout_s)
    except EngineError as e:
        raise BenchError(str(e)) from None
    try:
        target["url"] = server.url
        records = asyncio.run(_probe(config, workload, server, writer, i, target))
    finally:
        server.stop()
    return _summarize_start(i, server.ready_s, records, config)


async def _probe(config: ColdstartConfig, workload: Workload, server: ServerProcess,
                 writer: RecordWriter, i: int, target: dict[str, Any]) -> list[RequestTimeline]:
    key = config.api_key.get_secret_value() if config.api_key else None
    if target["model"] is None:
        try:
            models = await list_models(server.url, key, MODELS_TIMEOUT_S)
        except Exception as e:  # any failure means the same to the user: give --model
            raise BenchError(f"--model not given and {server.url}/v1/models did not list one "
                             f"({type(e).__name__}: {e}); give --model") from None
        if not models:
            raise BenchError(f"--model not given and {server.url}/v1/models lists none")
        target["model"] = models[0]
    per_start = 1 + config.warm_requests + len(config.idle_gaps_s)
    run_id = secrets.token_hex(3)
    records: list[RequestTimeline] = []

    async def send() -> None:
        spec = workload.request(i * per_start + len(records))
        r = RequestTimeline(id=f"{run_id}-{spec.index}", index=spec.index,
                            api=config.workload.api, prompt_tokens_planned=spec.prompt_tokens,
                            max_tokens=spec.max_tokens, tenant=spec.tenant,
                            priority=spec.priority, scheduled_ns=perf_counter_ns())
        async with Client(server.url, target["model"], config.workload.api, api_key=key,
                          pool_size=1, timeout_s=config.timeout_s, ignore_eos=config.ignore_eos,
                          continuous_usage=config.continuous_usage) as client:
            await client.send(spec, r)
        writer.write(r)
        records.append(r)

    for _ in range(1 + config.warm_requests):
        await send()
    for gap in config.idle_gaps_s:
        await asyncio.sleep(gap)
        await send()
    return records


def _summarize_start(i: int, ready_s: float | None, records: list[RequestTimeline],
                     config: ColdstartConfig) -> dict[str, Any]:
    metrics = [request_metrics(r) for r in records]
    first = metrics[0]
    warm = metrics[1:1 + config.warm_requests]
    baseline = {name: _median([getattr(m, name) for m in warm]) for name in ("ttft", "e2e")}

    def excess(value: float | None, name: str) -> float | None:
        return None if value is None or baseline[name] is None else value - baseline[name]

    idle = [{"gap_s": gap, "id": r.id, "ok": r.ok, "ttft": m.ttft, "e2e": m.e2e,
             "excess_ttft": excess(m.ttft, "ttft"), "excess_e2e": excess(m.e2e, "e2e")}
            for gap, r, m in zip(config.idle_gaps_s, records[1 + config.warm_requests:],
                                 metrics[1 + config.warm_requests:])]
    return {"run": i + 1, "ready_s": ready_s,
            "first": {"id": records[0].id, "ok": records[0].ok, "error": records[0].error,
                      "ttft": first.ttft, "e2e": first.e2e},
            "warm": {**baseline, "n": sum(1 for m in warm if m.e2e is not None),
                     "ids": [r.id for r in records[1:1 + config.warm_requests]]},
            "excess": {"ttft": excess(first.ttft, "ttft"), "e2e": excess(first.e2e, "e2e")},
            "idle": idle, "error": None if records[0].ok else
            f"first request failed: {records[0].outcome}: {records[0].error}"}


def _line(start: dict[str, Any]) -> str:
    if start["error"]:
        return f"  ready in {start['ready_s']:.2f} s; {start['error']}"
    first, warm = start["first"], start["warm"]
    return (f"  ready in {start['ready_s']:.2f} s; first TTFT {_ms(first['ttft'])} vs warm "
            f"{_ms(warm['ttft'])}, E2E {_ms(first['e2e'])} vs {_ms(warm['e2e'])}")


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.0f} ms"


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return float(np.median(present)) if present else None


def spread(values: list[float | None]) -> dict[str, float | int | None]:
    """Median, min and max over the runs that have the value."""
    present = [v for v in values if v is not None]
    if not present:
        return {"n": 0, "median": None, "min": None, "max": None}
    return {"n": len(present), "median": float(np.median(present)), "min": min(present),
            "max": max(present)}


def _summary(runs: list[dict[str, Any]], gaps: list[float]) -> tuple[dict, list[dict]]:
    summary = {"ready_s": spread([r["ready_s"] for r in runs])}
    for key, (part, field) in {"first_ttft": ("first", "ttft"), "warm_ttft": ("warm", "ttft"),
                               "excess_ttft": ("excess", "ttft"), "first_e2e": ("first", "e2e"),
                               "warm_e2e": ("warm", "e2e"),
                               "excess_e2e": ("excess", "e2e")}.items():
        summary[key] = spread([r[part][field] for r in runs])
    idle = [{"gap_s": gap, **{k: spread([r["idle"][j][k] for r in runs if len(r["idle"]) > j])
                              for k in ("ttft", "excess_ttft", "e2e", "excess_e2e")}}
            for j, gap in enumerate(gaps)]
    return summary, idle


def _write(run: RunFolder, settings: dict[str, Any], runs: list[dict[str, Any]],
           interrupted: bool) -> dict[str, Any]:
    summary, idle = _summary(runs, settings["coldstart"]["idle_gaps_s"])
    data = {"kind": "coldstart", "target": settings["target"], "runs": runs, "summary": summary,
            "idle": idle, "interrupted": interrupted,
            "definitions": {"ready_s": "from just before the server process starts to the "
                            "first 200 of its readiness URL (polled every 20 ms)",
                            "warm": "median of the requests that follow the first, one at a "
                            "time, on the same process",
                            "excess": "first request − warm median (TTFT, E2E as in bench)",
                            "idle": "the request after the server sat idle for the gap − the "
                            "same run's warm median"}}
    path = run.path / COLDSTART_JSON
    tmp = path.with_suffix(".json.tmp")
    tmp.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2))
    tmp.replace(path)
    return data
