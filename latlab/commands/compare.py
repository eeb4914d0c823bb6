"""`latlab compare`: runs side by side, each metric's change, whether it is real, where it
came from; `--fail-if` gates for CI (exit code 1 when one trips)."""

from __future__ import annotations

from pathlib import Path

from latlab.analysis import analyze
from latlab.analysis.compare import CompareError
from latlab.analysis.compare import compare as compare_runs
from latlab.analysis.gate import Gate, GateError
from latlab.commands.common import RunFailed, UsageError, console
from latlab.commands.options import Options
from latlab.records.bench import SloConfig
from latlab.records.folder import RunFolder, RunFolderError
from latlab.records.settings import setting
from latlab.report.comparison import print_comparison
from latlab.store import resolve_run


class CompareOptions(Options):
    fail_if: list[str] = setting([], "Regression gate like 'p99_ttft>+10%' or "
                                 "'output_tokens_per_s<-5%' (repeatable); exit code 1 when one "
                                 "trips.", "--fail-if")
    require_significance: bool = setting(False, "Let a gate trip only when its change is "
                                            "significant (95% CI excludes zero).")
    allow_different_workloads: bool = setting(False, "Compare runs whose workloads differ.")
    runs_dir: Path = setting(Path("runs"), "Runs folder holding the run store.")
    full: bool = setting(False, "Show mean and p90 too, not only p50 and p99.")


def compare(runs: list[str], config: SloConfig, options: CompareOptions) -> None:
    """Compare runs side by side: each metric's change, its confidence, and which component
    of the latency budget it came from."""
    if len(runs) < 2:
        raise UsageError("give at least two runs")
    out = console()
    slos = config.slos or None
    try:
        gates = [Gate.parse(text) for text in options.fail_if]
        folders = [RunFolder.open(resolve_run(ref, options.runs_dir)) for ref in runs]
        for folder in folders:  # a big run's first read, its parse, is its memory's peak:
            folder.read_table()  # all before any analysis, the peaks do not add up
        analyses = [analyze(folder, slos, diagnosis=False) for folder in folders]
        comparisons = [compare_runs(analyses[0], analysis) for analysis in analyses[1:]]
        for ref, comparison in zip(runs[1:], comparisons):
            if comparison.workload_differences and not options.allow_different_workloads:
                raise CompareError(f"{runs[0]} and {ref} ran different workloads ("
                                   + "; ".join(comparison.workload_differences)
                                   + "); pass --allow-different-workloads to compare anyway")
        tripped = [m for comparison in comparisons for g in gates
                   if (m := g.check(comparison, options.require_significance))]
    except (RunFolderError, GateError, CompareError) as e:
        raise UsageError(str(e)) from None
    for analysis, comparison in zip(analyses[1:], comparisons):
        print_comparison(out, comparison, str(analyses[0].run.path), str(analysis.run.path),
                         full=options.full)
    for message in tripped:
        out.print(f"[red]regression:[/] {message}")
    if gates and not tripped:
        out.print(f"[green]all {len(gates)} gates passed[/]")
    if tripped:
        raise RunFailed()
