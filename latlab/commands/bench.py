"""`latlab bench`: options → `BenchConfig`, run the load, summarize, explain, print, exit.

    result = run_bench(BenchConfig(url="http://127.0.0.1:8000", requests=200))
    result.summary.percentile("ttft", "p99"), result.analysis.findings

Every option is checked before any load is sent; a bad one is reported by its name.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from pydantic import ValidationError
from rich.console import Console

from latlab.analysis import RunAnalysis, analyze
from latlab.commands.common import (EXIT_FAILED, Interrupted, RunFailed, UsageError, console,
                                    print_json)
from latlab.commands.groups import (ArrivalShape, OutputOptions, SessionOptions, StopOptions,
                                    TargetOptions, WorkloadOptions, arrival_process,
                                    engine_tokenizer, window_s)
from latlab.commands.options import opt, validation_message
from latlab.load.generator import run_load
from latlab.load.telemetry.spans import join_run
from latlab.metrics.client import client_check
from latlab.metrics.formulas import FORMULAS
from latlab.metrics.summary import summarize
from latlab.records.config import BenchConfig
from latlab.records.folder import RunFolder
from latlab.records.spans import SPANS
from latlab.records.summary import RunSummary
from latlab.records.window import run_window
from latlab.records.workload import ArrivalConfig
from latlab.report.console import print_analysis, print_summary, summary_line
from latlab.report.html import write_html
from latlab.store import RunStore, key_numbers

DEFAULT_DURATION_S = 20.0
DEFAULT_USERS = 4


class BenchOptions(TargetOptions, WorkloadOptions, SessionOptions, ArrivalShape, StopOptions,
                   OutputOptions):
    users: int | None = opt(None, "Closed loop: N users, each sends when its last request "
                                  "ends (default: 4 without --rate).")
    rate: float | None = opt(None, "Open loop: requests per second.")
    ramp: float = opt(0.0, "Seconds to ramp the rate (or users) up from zero.", to="ramp_s")
    trace: Path | None = opt(None, "Replay arrival times from JSONL (`timestamp` s or "
                                   "`timestamp_ms` per line).")
    otlp_port: int | None = opt(None, "Receive the server's OpenTelemetry spans (OTLP/HTTP, "
                                      "protobuf or JSON) on this loopback port (0: a free one) "
                                      "and join them to the requests.")
    span_wait: float = opt(10.0, "Seconds to wait after the load for the server's last spans "
                                 "(exporters send in batches).", to="span_wait_s")
    scrape: float | None = opt(None, "Poll the target's Prometheus /metrics every this many "
                                     "seconds (e.g. 0.5) and keep the time series.",
                               to="scrape_interval_s")
    json_output: bool = opt(False, "Print summary.json to stdout.", "--json")
    explain: bool = opt(False, "Print the metric formulas and exit.")

    def bench_config(self) -> BenchConfig:
        """The `BenchConfig` of the command line; `UsageError` names the bad option."""
        serve = self.serve()
        workload = self.workload(engine_tokenizer(serve) if self.url is None else None)
        duration = self.duration
        if duration is None and self.requests is None and self.trace is None:
            duration = DEFAULT_DURATION_S
        workload.sessions = self.sessions(duration)
        turns = workload.sessions.turns if workload.sessions else None
        if (turns is not None and turns.kind == "fixed" and self.requests is not None
                and self.requests < turns.a):
            raise UsageError(f"--requests {self.requests} is fewer than one session's "
                             f"{int(turns.a)} requests: sessions run whole")
        warmup, cooldown = window_s(duration, self.warmup, self.cooldown)
        try:
            arrivals = ArrivalConfig(users=DEFAULT_USERS if self.users is None else self.users,
                                     rate=self.rate,
                                     burstiness=1.0 if self.burstiness is None else self.burstiness,
                                     max_concurrency=self.max_concurrency, ramp_s=self.ramp,
                                     trace=self.trace, seed=self.seed, process=arrival_process(
                                         self.arrival, self.burstiness, self.rate,
                                         self.users, self.trace))
            return BenchConfig(url=self.url, model=self.model, api_key=self.api_key,
                               workload=workload, arrivals=arrivals, duration_s=duration,
                               requests=self.requests, warmup_s=warmup, cooldown_s=cooldown,
                               timeout_s=self.timeout, drain_s=self.drain,
                               workers=self.worker_count(), ray=self.ray,
                               ignore_eos=self.ignore_eos,
                               continuous_usage=self.continuous_usage, stream=self.stream,
                               keepalive=self.keepalive, server_kind=self.server_kind,
                               otlp_port=self.otlp_port, span_wait_s=self.span_wait,
                               scrape_interval_s=self.scrape, slos=self.slos(),
                               serve_args=serve, out=self.out,
                               name=self.name or ("engine" if self.url is None else "bench"),
                               tags=self.tag)
        except ValidationError as e:
            raise UsageError(validation_message(e, self.flags_by_target())) from None



@dataclass
class BenchResult:
    """A measured run: its folder, summary and analysis (None if explaining it failed)."""

    run: RunFolder
    summary: RunSummary
    analysis: RunAnalysis | None
    failed: bool
    message: str | None = None


def run_bench(config: BenchConfig, *, console: Console | None = None, progress: bool = False,
              command: Sequence[str] | None = None, store: Path | None = None) -> BenchResult:
    """Run the load, write summary.json and report.html, register the run in the store of
    `store` (default: `config.out`). Raises `BenchError` (target or engine unusable) or a
    `ValueError` naming the option (dataset, trace, tokenizer) before any load."""
    load = run_load(config, console=console, progress=progress, command=command)
    spans = join_run(load.run) if (load.run.path / SPANS).is_file() else None
    records = load.run.read_table()
    window = run_window(load.config, records)
    summary = summarize(records, window, config.slos,
                        client=client_check(load.health, records, window),
                        stop_reason=load.stop_reason, notes=load.notes,
                        concurrency_cap=load.config.concurrency)
    summary.spans = spans
    load.run.write_summary(summary)
    with RunStore(store or config.out) as runs:
        runs.register(load.run.path, "bench", load.config, key_numbers(summary), summary)
    return BenchResult(load.run, summary, _explain(load.run, console), load.failed, load.message)


def _explain(run: RunFolder, err: Console | None) -> RunAnalysis | None:
    """Decompose and diagnose the finished run and write its report.html. The run folder is
    complete already: a failure here loses nothing and `latlab report` can redo it."""
    try:
        analysis = analyze(run)
        write_html(run, analysis)
    except Exception as e:  # noqa: BLE001 - the measurement is safe on disk; say what failed
        if err is not None:
            err.print(f"latlab bench: could not explain the run ({type(e).__name__}: {e}); "
                      f"try `latlab report {run.path}`", style="yellow", markup=False)
        return None
    return analysis


def bench(options: BenchOptions) -> None:
    """Run a workload against an OpenAI-compatible server and measure every request."""
    out, err = console(), console(stderr=True)
    if options.explain:
        return explain(out)
    config = options.bench_config()
    result = run_bench(config, console=err, command=sys.argv,
                       progress=err.is_terminal if options.progress is None
                       else options.progress)
    if options.json_output:
        findings = ([f.to_json() for f in result.analysis.findings]
                    if result.analysis else None)
        print_json(result.summary.to_json() | {"run": str(result.run.path),
                                                "findings": findings})
    else:
        print_summary(out, result.summary, result.run.path)
        if result.analysis is not None:
            print_analysis(out, result.analysis)
        if not out.is_terminal:
            out.print(summary_line(result.summary, result.run.path))
    shown = set(result.summary.warnings) if not options.json_output else set()
    message = "\n".join(line for line in (result.message or "").splitlines() if line not in shown)
    if message:
        err.print(f"latlab bench: {message}", markup=False, highlight=False,
                  style="bold red" if result.failed else "yellow")
    if result.failed:
        raise RunFailed(code=EXIT_FAILED)
    if result.summary.stop_reason == "interrupted":
        raise Interrupted("interrupted: the requests finished so far and the summary are kept")


def explain(out: Console) -> None:
    from rich.table import Table

    table = Table(title="latlab metric definitions (all latencies in ms)", title_justify="left")
    table.add_column("metric")
    table.add_column("definition")
    for name, formula in FORMULAS.items():
        table.add_row(name, formula)
    out.print(table)
