"""Run the load: the target, the run folder, the worker processes, their records.

    load = run_load(BenchConfig(url="http://127.0.0.1:8000", requests=200))
    load.run.read_records(), load.workers[0].health

With `url=None` the embedded engine is started for the run and stopped after it. With
`workers > 1` the workers are spawned processes that share one absolute schedule and append
to the same requests.jsonl; this process only shows progress. The summary, the analysis and
the reports are made from the run folder afterwards (`latlab.commands.bench`).
"""

from __future__ import annotations

import asyncio
import secrets
import shlex
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from ssl import SSLContext

from rich.console import Console

from latlab import __version__
from latlab.load.preflight import fit_context, survey_trace
from latlab.load.request.tls import ssl_context
from latlab.load.result import LoadResult, finish_load
from latlab.load.target import gateway
from latlab.load.target.discovery import identify, models_headers, probe
from latlab.load.target.launch import ServerProcess, target_server
from latlab.load.target.settings import server_settings
from latlab.load.telemetry.host import HostSampler
from latlab.load.telemetry.otlp import SpanReceiver, await_spans
from latlab.load.telemetry.scrape import Scraper
from latlab.load.workers.auto import auto_workers
from latlab.load.workers.processes import run_workers
from latlab.load.workers.progress import ProgressDisplay
from latlab.load.workers.snapshot import WorkerSnapshot
from latlab.load.workers.worker import Worker, WorkerPlan, WorkerResult
from latlab.load.workload.prompts import with_salt
from latlab.load.workload.requests import Workload
from latlab.records.bench import BenchConfig
from latlab.records.config import Clock, RunConfig, Target
from latlab.records.folder import REQUESTS, RunFolder
from latlab.records.scrape import METRICS
from latlab.records.spans import SPANS
from latlab.records.target import redact

START_LEAD_S = 0.05
MODELS_TIMEOUT_S = 10.0
ENGINE_EXIT_WAIT_S = 2.0  # after a run stopped early: did the embedded engine die?


def run_load(config: BenchConfig, *, console: Console | None = None, progress: bool = False,
             command: Sequence[str] | None = None) -> LoadResult:
    """Run `config` to the end (or Ctrl-C) and write config.json and requests.jsonl into a
    new folder under `config.out`. Raises `BenchError`, or the workload's/arrivals'
    `ValueError`s for bad input, before any load is sent."""
    prepared = _prepare(config, console)
    config, workload, notes = prepared.config, prepared.workload, prepared.notes
    run = RunFolder.create(config.out, config.name)
    settings = run_config(config, command)
    run.write_config(settings)
    with ExitStack() as context, _not_started(run, settings):
        receiver = (context.enter_context(SpanReceiver(run.path / SPANS, port=config.otlp_port))
                    if config.otlp_port is not None else None)
        engine = (context.enter_context(_embedded_engine(config, run, receiver, console))
                  if config.url is None else None)
        url = engine.url if engine is not None else config.url
        settings.target = settings.target.model_copy(update={
            "url": url, "engine_ready_s": engine.ready_s if engine is not None else None,
            "otlp_endpoint": receiver.endpoint if receiver else None})
        key = config.key()
        tls = ssl_context(str(config.ca_cert) if config.ca_cert else None, config.insecure)
        notes += _identify(config, url, key, tls, workload, settings)
        run.write_config(settings)
        own = config.server_url is None  # a gateway's key stays with the gateway
        engine_url = config.server_url or url
        scraper = context.enter_context(Scraper(
            engine_url.rstrip("/") + "/metrics", run.path / METRICS, config.scrape_interval_s,
            {"Authorization": f"Bearer {key}"} if key and own else None, tls))
        host = context.enter_context(HostSampler(
            engine.process.pid if engine is not None else None, engine_url))
        plan = WorkerPlan(worker=0, url=url, model=settings.target.model,
                          run_path=str(run.path), run_id=secrets.token_hex(3), t0_ns=0,
                          api_key=key, server_kind=settings.target.server_kind)
        results = _send(config, plan, workload, run, settings, console, progress)
        if receiver is not None:
            notes += await_spans(receiver, run, config.span_wait_s)
        notes += _after_the_load(config, scraper, engine, results)
    return finish_load(config, run, settings, results, notes, host.result)


@dataclass(frozen=True)
class Prepared:
    """A run's config with what it leaves open settled (its prompts' salt, `--workers auto`),
    its workload, and what was noted on the way."""

    config: BenchConfig
    workload: Workload
    notes: list[str]


def _prepare(config: BenchConfig, console: Console | None) -> Prepared:
    """Everything checked and settled before a run folder exists or a server starts."""
    notes: list[str] = []
    config = config.model_copy(update={"workload": with_salt(config.workload)})
    if config.arrivals.process == "trace":
        notes += survey_trace(config, console)
    workload = Workload(config.workload, config.arrivals, config.duration_s)
    if config.ray is not None:
        from latlab.load.workers.ray_driver import require_ray

        require_ray()  # before an engine is started for nothing
    if config.workers == "auto":
        config = _resolve_workers(config, workload, console)
    return Prepared(config, workload, notes)


def _embedded_engine(config: BenchConfig, run: RunFolder, receiver: SpanReceiver | None,
                     console: Console | None) -> AbstractContextManager[ServerProcess]:
    """The server latlab starts for the run (its log in the run folder): the `--launch`
    command, or the embedded engine exporting its spans to the run's `receiver`."""
    if console is not None:
        console.print("starting the server: " + (
            config.launch or "the embedded engine (latlab serve)") + "…", style="dim",
            markup=False, highlight=False)
    otlp = ["--otlp-endpoint", receiver.endpoint] if receiver is not None else []
    return target_server(config, run.path / ("server.log" if config.launch else "engine.log"),
                         engine_args=otlp)


def _identify(config: BenchConfig, url: str, key: str | None, tls: SSLContext | None,
              workload: Workload, settings: RunConfig) -> list[str]:
    """What the target at `url` is (model, kind, context, the round trip, a gateway in
    front), and the engine's own settings (behind a gateway: `--server-url`'s, asked without
    the gateway's key), into `settings.target`; the workload fitted to its context. Returns
    what was noted."""
    model, kind, context, notes = identify(url, config.model, config.server_kind, key,
                                           MODELS_TIMEOUT_S, tls)
    engine = config.server_url or url
    told = asyncio.run(server_settings(engine, None if config.server_url else key, tls))
    null = asyncio.run(probe(url, key, tls=tls))
    found = gateway.detect(asyncio.run(models_headers(url, key, tls=tls)) | null.headers)
    settings.target = settings.target.model_copy(update={
        "model": model, "server_kind": kind, "max_model_len": context,
        "settings": told if told.known() else None, "rtt_ms": null.rtt_ms,
        "server_url": config.server_url,
        "gateway": found or (gateway.named(config.server_url) if config.server_url else None)})
    fit_context(workload, config, context)
    return notes


def _send(config: BenchConfig, plan: WorkerPlan, workload: Workload, run: RunFolder,
          settings: RunConfig, console: Console | None, progress: bool) -> list[WorkerResult]:
    """The load itself, by this process's one worker, worker processes or Ray actors; each
    worker's result."""
    display = (ProgressDisplay(console or Console(stderr=True), config.duration_s,
                               config.requests) if progress else None)
    with display or nullcontext():
        update = display.update if display else None
        if config.ray is not None:
            from latlab.load.workers.ray_driver import run_ray_workers

            results, settings.ray = run_ray_workers(
                config, plan, lambda lead: _start_clock(run, settings, lead), update, console)
            return results
        if config.workers == 1:
            return [_run_here(config, plan, workload, run, settings, update)]
        return run_workers(config, plan, lambda: _start_clock(run, settings), update)


def _after_the_load(config: BenchConfig, scraper: Scraper, engine: ServerProcess | None,
                    results: list[WorkerResult]) -> list[str]:
    """What the run should say of its context: no scrape succeeded, the engine died."""
    notes = []
    if config.scrape_interval_s and not scraper.count:
        notes.append(f"no scrape of {scraper.url} succeeded ({scraper.last_error}): "
                     "the run has no load context")
    aborted = any(r.stop_reason == "aborted" for r in results)
    if engine is not None and engine.exited(ENGINE_EXIT_WAIT_S if aborted else 0.0):
        notes.append(f"the embedded engine exited with code {engine.process.returncode} "
                     f"during the run; its log ({engine.log_path}):\n{engine.log_tail(5)}")
    return notes


def _resolve_workers(config: BenchConfig, workload: Workload,
                     console: Console | None) -> BenchConfig:
    count, why = auto_workers(config, workload, remote=config.ray is not None)
    if console is not None:
        console.print(why, style="dim", markup=False, highlight=False)
    return config.model_copy(update={"workers": count})


@contextmanager
def _not_started(run: RunFolder, settings: RunConfig) -> Iterator[None]:
    """Record in config.json why a run failed before any request ended, so that `report`
    and `runs` say it did not start instead of reading an empty run as a healthy one."""
    try:
        yield
    except BaseException as e:
        records = run.path / REQUESTS
        if not records.is_file() or records.stat().st_size == 0:
            settings.failed = ("interrupted before the load began"
                               if isinstance(e, KeyboardInterrupt) else str(e) or type(e).__name__)
            run.write_config(settings)
        raise


def run_config(config: BenchConfig, command: Sequence[str] | None) -> RunConfig:
    """The config.json of a bench run, before it starts."""
    return RunConfig(
        latlab_version=__version__,
        command=shlex.join(redact(command if command is not None else sys.argv)),
        name=config.name, tags=config.tags, bench=config,
        target=Target(url=config.url, model=config.model,
                      embedded=config.url is None and config.launch is None, launch=config.launch,
                      api_key_given=config.api_key is not None),
        warmup_s=config.warmup_s, cooldown_s=config.cooldown_s, duration_s=config.duration_s,
        slos=config.slos,
        concurrency=config.arrivals.max_concurrency if config.arrivals.open_loop else None)


def _start_clock(run: RunFolder, settings: RunConfig, lead_s: float = START_LEAD_S) -> int:
    """Fix the run's start `t0` `lead_s` ahead, with the wall-clock anchor, in config.json."""
    anchor_ns, unix = time.perf_counter_ns(), time.time()
    t0 = anchor_ns + int(lead_s * 1e9)
    settings.clock = Clock(perf_counter_ns=anchor_ns, unix_time=unix, t0_ns=t0)
    run.write_config(settings)
    return t0


def _run_here(config: BenchConfig, plan: WorkerPlan, workload: Workload, run: RunFolder,
              settings: RunConfig, update: Callable[[WorkerSnapshot], None] | None
              ) -> WorkerResult:
    import uvloop

    plan.t0_ns = _start_clock(run, settings)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(Worker(config, plan, workload, update).run())
