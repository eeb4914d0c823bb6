"""`latlab bench`: options → `BenchConfig` → `run_bench` → print → exit code."""

from __future__ import annotations

import sys

from rich.console import Console

from latlab.commands.common import (
    EXIT_FAILED,
    Interrupted,
    RunFailed,
    UsageError,
    console,
    print_json,
)
from latlab.commands.options import NamedWorkload, TestedAdvice
from latlab.records.bench import BenchConfig
from latlab.records.catalog import formulas
from latlab.records.settings import OUTPUT, setting
from latlab.report.console import print_analysis, print_summary, summary_line
from latlab.services.bench import run_bench


class Display(NamedWorkload):
    progress: bool | None = setting(None, "Live progress (default: on a terminal).",
                                    "--progress/--no-progress", group=OUTPUT)


class BenchDisplay(Display, TestedAdvice):
    explain: bool = setting(False, "Print the metric formulas and exit.", group=OUTPUT)


def bench(config: BenchConfig, options: BenchDisplay) -> None:
    """Run a workload against an OpenAI-compatible server and measure every request."""
    out, err = console(), console(stderr=True)
    if options.explain:
        return explain(out)
    try:
        config.check_target()
    except ValueError as e:
        raise UsageError(str(e)) from None
    result = run_bench(config, console=err, command=sys.argv, test_advice=options.test_advice,
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
    for name, formula in formulas().items():
        table.add_row(name, formula)
    out.print(table)
