"""Cold-start probes: start a server and send its first requests, one at a time.

    ready_s, records = start_and_probe(config, workload, run, writer, i, target)

Each start runs the server (the embedded engine, or `command` with its `ready_url`) in a new
process group and times it from just before the start to the first 200 of the readiness URL
(polled every 20 ms). Then, on the same process, one request at a time: the first request,
`warm_requests` more (their median is the warm baseline), and after each idle gap one more
request. Every probe uses the load generator's client on a fresh connection, so connection
reuse favours no request, and is recorded as a timeline in requests.jsonl. The server is
stopped after every start, on errors and on Ctrl-C.
"""

from __future__ import annotations

import asyncio
import secrets
from time import perf_counter_ns

from latlab.load import BenchError
from latlab.load.request.client import Client
from latlab.load.request.config import ClientConfig
from latlab.load.target.discovery import discover
from latlab.load.target.launch import ServerLaunch, ServerProcess, launched, responds_ok
from latlab.load.workload.requests import Workload
from latlab.records.coldstart import ColdstartConfig
from latlab.records.config import Target
from latlab.records.folder import RecordWriter, RunFolder
from latlab.records.target import ServerKind
from latlab.records.timeline import RequestTimeline

READY_POLL_S = 0.02
MODELS_TIMEOUT_S = 10.0


def start_and_probe(config: ColdstartConfig, workload: Workload, run: RunFolder,
                    writer: RecordWriter, i: int,
                    target: Target) -> tuple[float | None, list[RequestTimeline]]:
    """Start the server (start `i`), probe it and stop it: its time to ready and the probes.
    Raises `BenchError` when it cannot be started or used."""
    with launched(_launch(config), log_path=run.path / f"server-{i + 1}.log",
                  ready_timeout_s=config.ready_timeout_s, poll_s=READY_POLL_S) as server:
        target.url = server.url
        records = asyncio.run(_probe(config, workload, server, writer, i, target))
    return server.ready_s, records


def _launch(config: ColdstartConfig) -> ServerLaunch:
    """The server command given, or the embedded engine; the command's ready URL must not
    answer before it starts."""
    if not config.command:
        return ServerLaunch.embedded(config.serve_args)
    ready_url = config.ready_url or config.url.rstrip("/") + "/v1/models"
    if responds_ok(ready_url):
        raise BenchError(f"{ready_url} already answers before the server was started: "
                         "stop whatever serves it, or the time to ready means nothing")
    return ServerLaunch(tuple(config.command), config.url, ready_url, config.command[0])


async def _probe(config: ColdstartConfig, workload: Workload, server: ServerProcess,
                 writer: RecordWriter, i: int, target: Target) -> list[RequestTimeline]:
    key = config.api_key.get_secret_value() if config.api_key else None
    if target.model is None:
        target.model, target.server_kind, target.max_model_len = await discover(
            server.url, key, MODELS_TIMEOUT_S)
    client = ClientConfig.of(config, api_key=key, kind=target.server_kind or ServerKind.AUTO,
                             pool_size=1)
    per_start = 1 + config.warm_requests + len(config.idle_gaps_s)
    run_id = secrets.token_hex(3)
    records: list[RequestTimeline] = []

    async def send() -> None:
        spec = workload.request(i * per_start + len(records))
        r = RequestTimeline(id=f"{run_id}-{spec.index}", index=spec.index,
                            api=config.workload.api, prompt_tokens_planned=spec.prompt_tokens,
                            max_tokens=spec.max_tokens, tenant=spec.tenant,
                            priority=spec.priority, scheduled_ns=perf_counter_ns())
        async with Client(server.url, target.model, client) as c:
            await c.send(spec, r)
        writer.write(r)
        records.append(r)

    for _ in range(1 + config.warm_requests):
        await send()
    for gap in config.idle_gaps_s:
        await asyncio.sleep(gap)
        await send()
    return records
