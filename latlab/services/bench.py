"""A bench run: run the load, summarize, explain, register.

    result = run_bench(BenchConfig(url="http://127.0.0.1:8000", requests=200))
    result.summary.percentile("ttft", "p99"), result.analysis.findings
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from latlab.analysis import RunAnalysis, analyze
from latlab.load.generator import run_load
from latlab.load.telemetry.spans import join_run
from latlab.metrics.client import client_check
from latlab.metrics.summary import RunContext, summarize
from latlab.records.bench import BenchConfig
from latlab.records.folder import RunFolder
from latlab.records.spans import SPANS
from latlab.records.summary import RunSummary
from latlab.records.window import run_window
from latlab.report.html import write_html
from latlab.store import RunStore, key_numbers

NOTHING_MEASURED = ("no successful request landed in the measurement window: nothing was "
                    "measured (the findings say how long the first requests took)")


@dataclass
class BenchResult:
    """A measured run: its folder, summary and analysis (None if explaining it failed)."""

    run: RunFolder
    summary: RunSummary
    analysis: RunAnalysis | None
    failed: bool
    message: str | None = None


def run_bench(config: BenchConfig, *, console: Console | None = None, progress: bool = False,
              command: Sequence[str] | None = None, store: Path | None = None,
              test_advice: bool = False) -> BenchResult:
    """Run the load, write summary.json and report.html, register the run in the store of
    `store` (default: `config.out`); with `test_advice`, each setting a finding suggests is
    simulated first (`advice_effects`). Raises `BenchError` (target or engine unusable) or a
    `ValueError` naming the option (dataset, trace, tokenizer) before any load."""
    load = run_load(config, console=console, progress=progress, command=command)
    spans = join_run(load.run) if (load.run.path / SPANS).is_file() else None
    records = load.run.read_table()
    window = run_window(load.config, records)
    summary = summarize(records, window, config.slos, context=RunContext(
        client=client_check(load.health, records, window, load.host),
        stop_reason=load.stop_reason, notes=load.notes, concurrency_cap=load.config.concurrency,
        users=load.config.users, scrapes=load.run.read_scrapes(),
        server_kind=load.config.target.server_kind))
    summary.spans = spans
    load.run.write_summary(summary)
    with RunStore(store or config.out) as runs:
        runs.register(load.run.path, "bench", load.config, key_numbers(summary), summary)
    failed, message = load.failed, load.message
    if not failed and summary.ok == 0:  # requests succeeded, but none inside the window
        failed = True
        message = "\n".join(m for m in (message, NOTHING_MEASURED) if m)
    return BenchResult(load.run, summary, _explain(load.run, console, test_advice), failed,
                       message)


def _explain(run: RunFolder, err: Console | None, test_advice: bool = False
             ) -> RunAnalysis | None:
    """Decompose and diagnose the finished run and write its report.html. The run folder is
    complete already: a failure here loses nothing and `latlab report` can redo it."""
    try:
        analysis = analyze(run)
        if test_advice and any(f.changes for f in analysis.findings):
            if err is not None:
                err.print("testing the advice in the simulator (--no-test-advice skips it)…",
                          style="dim")
            # the simulator and the engine's scheduler load only when there is advice to test:
            # measuring a remote fleet imports no engine (test_bench_runner)
            from latlab.services.advice_effects import annotate

            annotate(analysis)
        write_html(run, analysis)
    except Exception as e:  # noqa: BLE001 - the measurement is safe on disk; say what failed
        if err is not None:
            err.print(f"latlab bench: could not explain the run ({type(e).__name__}: {e}); "
                      f"try `latlab report {run.path}`", style="yellow", markup=False)
        return None
    return analysis
