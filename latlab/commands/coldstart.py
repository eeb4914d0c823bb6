"""`latlab coldstart`: start the server several times and measure what its first request
costs; coldstart.json after every start, so Ctrl-C keeps the starts measured so far.

    result = run_coldstart(ColdstartConfig(runs=3, serve_args=["--model", "tiny"]))
    result.record.summary["excess_ttft"].median
"""

from __future__ import annotations

import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter_ns
from typing import Sequence

from pydantic import ValidationError
from rich.console import Console

from latlab import __version__
from latlab.analysis.coldstart import coldstart_record, summarize_start
from latlab.commands.common import EXIT_INTERRUPTED, RunFailed, UsageError, console, print_json
from latlab.commands.groups import TargetOptions, WorkloadOptions, engine_tokenizer
from latlab.commands.options import opt, parse_seconds, validation_message
from latlab.load.target.probe import start_and_probe
from latlab.load.target.launch import interrupt_on_sigterm
from latlab.load.workload.requests import Workload
from latlab.records.coldstart import COLDSTART_JSON, ColdstartRecord, Start
from latlab.records.config import Clock, ColdstartConfig, RunConfig, Target, redact
from latlab.records.folder import RunFolder, write_json
from latlab.report.coldstart import print_coldstart
from latlab.store import RunStore
from latlab.units import ms


class ColdstartOptions(TargetOptions, WorkloadOptions):
    runs: int = opt(3, "How many times to start the server.")
    command: str | None = opt(None, "The server command to start (default: the embedded "
                                    "engine, with --serve-args).", "--command")
    url: str | None = opt(None, "Where --command's server answers requests (http://HOST:PORT).")
    ready_url: str | None = opt(None, "Polled until it answers 200 (default: --url + "
                                      "/v1/models).")
    warm_requests: int = opt(5, "Requests after the first; their median is the warm baseline.")
    idle_gaps: str = opt("1s,5s", "Idle gaps to probe, e.g. 1s,5s,30s (empty: none).",
                         to="idle_gaps_s")
    ready_timeout: float = opt(300.0, "Seconds to wait for the server to be ready.",
                               to="ready_timeout_s")
    prompt_tokens: str = opt("128", "Prompt length distribution (as in bench).")
    output_tokens: str = opt("32", "Output length distribution (as in bench).")
    out: Path = opt(Path("runs"), "Folder for run folders.")
    name: str | None = opt(None, "Run name (in the folder name).")
    tag: list[str] = opt([], "Free-form tag recorded in config.json (repeatable).", to="tags")
    json_output: bool = opt(False, "Print coldstart.json to stdout.", "--json")

    def coldstart_config(self) -> ColdstartConfig:
        server = shlex.split(self.command) if self.command else []
        serve = self.serve()
        try:
            return ColdstartConfig(
                runs=self.runs, command=server, url=self.url, ready_url=self.ready_url,
                serve_args=serve, model=self.model, api_key=self.api_key,
                warm_requests=self.warm_requests,
                idle_gaps_s=parse_seconds(self.idle_gaps, "--idle-gaps"),
                ready_timeout_s=self.ready_timeout, timeout_s=self.timeout,
                ignore_eos=self.ignore_eos, continuous_usage=self.continuous_usage,
                out=self.out, tags=self.tag,
                name=self.name or (Path(server[0]).name if server else "engine"),
                workload=self.workload(None if server else engine_tokenizer(serve)))
        except ValidationError as e:
            raise UsageError(validation_message(e, self.flags_by_target())) from None


@dataclass
class ColdstartResult:
    run: RunFolder
    record: ColdstartRecord

    @property
    def interrupted(self) -> bool:
        return self.record.interrupted


def run_coldstart(config: ColdstartConfig, *, console: Console | None = None,
                  command: Sequence[str] | None = None) -> ColdstartResult:
    """Run every start to the end (or Ctrl-C). Raises `BenchError` when a server cannot be
    started or used (after writing what was measured)."""
    workload = Workload(config.workload)
    run = RunFolder.create(config.out, f"coldstart-{config.name}")
    settings = RunConfig(kind="coldstart", latlab_version=__version__,
                         command=shlex.join(redact(command if command is not None else sys.argv)),
                         name=run.path.name, tags=config.tags, coldstart=config,
                         target=Target(url=config.url, model=config.model,
                                       embedded=not config.command),
                         clock=Clock(perf_counter_ns=perf_counter_ns(), unix_time=time.time()))
    run.write_config(settings)
    starts: list[Start] = []
    interrupted = False
    try:
        with run.record_writer() as writer:
            for i in range(config.runs):
                if console is not None:
                    console.print(f"[bold]start {i + 1} of {config.runs}[/]", highlight=False)
                ready_s, records = start_and_probe(config, workload, run, writer, i,
                                                   settings.target)
                starts.append(summarize_start(i, ready_s, records, config.warm_requests,
                                              config.idle_gaps_s))
                if console is not None:
                    console.print(_line(starts[-1]), style="dim", highlight=False)
                _write(run, settings, starts, config, interrupted)
    except KeyboardInterrupt:
        interrupted = True
    except BaseException as e:
        if not starts:
            settings.failed = str(e) or type(e).__name__
        raise
    finally:
        run.write_config(settings)
        record = _write(run, settings, starts, config, interrupted)
        records = run.read_records()
        with RunStore(config.out) as store:
            store.register(run.path, "coldstart", settings,
                           {"requests": len(records), "ok": sum(r.ok for r in records)})
    return ColdstartResult(run, record)


def _write(run: RunFolder, settings: RunConfig, starts: list[Start], config: ColdstartConfig,
           interrupted: bool) -> ColdstartRecord:
    record = coldstart_record(settings.target.model_dump(), starts, config.idle_gaps_s,
                              interrupted)
    write_json(run.path / COLDSTART_JSON, record)
    return record


def _line(start: Start) -> str:
    if start.error:
        return f"  ready in {start.ready_s:.2f} s; {start.error}"
    return (f"  ready in {start.ready_s:.2f} s; first TTFT {ms(start.first.ttft)} vs warm "
            f"{ms(start.warm.ttft)}, E2E {ms(start.first.e2e)} vs {ms(start.warm.e2e)}")


def coldstart(options: ColdstartOptions) -> None:
    """Measure cold start: start the server --runs times; time to ready, the first request
    against the warm ones after it, and the next request after idle gaps. Every process it
    starts is stopped, on errors and Ctrl-C too."""
    config = options.coldstart_config()
    err = console(stderr=True)
    interrupt_on_sigterm()
    result = run_coldstart(config, console=err, command=sys.argv)
    if options.json_output:
        print_json(result.record.model_dump(mode="json") | {"run": str(result.run.path)})
    else:
        print_coldstart(console(), result.record, result.run.path)
    err.print(f"run folder: {result.run.path} (coldstart.json, requests.jsonl)", highlight=False)
    if result.interrupted:
        raise RunFailed("interrupted (the starts finished so far are kept)",
                        code=EXIT_INTERRUPTED)
