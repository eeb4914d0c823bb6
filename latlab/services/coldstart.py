"""Cold starts: start the server several times and measure what its first request
costs; coldstart.json after every start, so Ctrl-C keeps the starts measured so far.

    result = run_coldstart(ColdstartConfig(runs=3, serve_args=["--model", "tiny"]))
    result.record.summary["excess_ttft"].median
"""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from time import perf_counter_ns

from rich.console import Console

from latlab import __version__
from latlab.analysis.coldstart import coldstart_record, summarize_start
from latlab.load.target.interrupts import remembered_interrupts
from latlab.load.target.probe import start_and_probe
from latlab.load.workload.prompts import with_salt
from latlab.load.workload.requests import Workload
from latlab.records.coldstart import COLDSTART_JSON, ColdstartConfig, ColdstartRecord, Start
from latlab.records.config import Clock, RunConfig, Target
from latlab.records.folder import RunFolder, write_json
from latlab.records.target import redact
from latlab.store import RunStore
from latlab.units import ms


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
    config = config.model_copy(update={"workload": with_salt(config.workload)})
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
        with run.record_writer() as writer, remembered_interrupts() as pressed:
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
                if pressed():  # a Ctrl-C Python swallowed during the start: stop now
                    raise KeyboardInterrupt
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
