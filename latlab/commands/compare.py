"""`latlab compare`: runs side by side, each metric's change, whether it is real, where it
came from; `--fail-if` gates for CI (exit code 1 when one trips, 3 when the runs are too
noisy to tell)."""

from __future__ import annotations

from pathlib import Path

from latlab.analysis import analyze
from latlab.analysis.compare import CompareError
from latlab.analysis.compare import compare as compare_runs
from latlab.analysis.gate import Gate, GateError
from latlab.analysis.replicates import from_blocks
from latlab.commands.common import EXIT_INCONCLUSIVE, RunFailed, UsageError, console
from latlab.commands.options import Options
from latlab.records.folder import RunFolder, RunFolderError
from latlab.records.settings import OUTPUT, VERDICT, setting
from latlab.records.verdict import CompareConfig
from latlab.report.comparison import print_comparison
from latlab.store import resolve_run


class CompareOptions(Options):
    fail_if: list[str] = setting([], "Regression gate like 'p99_ttft>+10%' or "
                                 "'output_tokens_per_s<-5%' (repeatable): exit code 1 when one "
                                 "trips, 3 when one cannot tell for the noise.", "--fail-if",
                                 group=VERDICT)
    allow_different_workloads: bool = setting(False, "Compare runs whose workloads differ.",
                                              group=VERDICT)
    runs_dir: Path = setting(Path("runs"), "Runs folder holding the run store.", group=OUTPUT)
    full: bool = setting(False, "Show mean and p90 too, not only p50 and p99.", group=OUTPUT)


def compare(runs: list[str], config: CompareConfig, options: CompareOptions) -> None:
    """Compare runs side by side: each metric's change, its verdict (better, worse, same
    within the minimum effect, or can't tell), and which component of the latency budget it
    came from."""
    if len(runs) < 2:
        raise UsageError("give at least two runs")
    out = console()
    slos = config.slos or None
    try:
        gates = [Gate.parse(text) for text in options.fail_if]
        folders = [open_run(ref, options.runs_dir) for ref in runs]
        if config.noise is not None:
            folders.append(open_run(str(config.noise), options.runs_dir))
        for folder in folders:  # a big run's first read, its parse, is its memory's peak:
            folder.read_table()  # all before any analysis, the peaks do not add up
        analyses = [analyze(folder, slos, diagnosis=False) for folder in folders]
        repeat = analyses.pop() if config.noise is not None else None
        comparisons = [compare_runs(analyses[0], analysis, from_blocks(analyses[0], analysis,
                                                                       repeat), config)
                       for analysis in analyses[1:]]
        for ref, comparison in zip(runs[1:], comparisons):
            if comparison.workload_differences and not options.allow_different_workloads:
                raise CompareError(f"{runs[0]} and {ref} ran different workloads ("
                                   + "; ".join(comparison.workload_differences)
                                   + "); pass --allow-different-workloads to compare anyway")
        results = [g.check(comparison) for comparison in comparisons for g in gates]
    except (RunFolderError, GateError, CompareError) as e:
        raise UsageError(str(e)) from None
    for analysis, comparison in zip(analyses[1:], comparisons):
        print_comparison(out, comparison, str(analyses[0].run.path), str(analysis.run.path),
                         full=options.full)
    style = {"passed": "green", "tripped": "red", "inconclusive": "yellow"}
    for r in results:
        out.print(f"[{style[r.status]}]gate {r.status}:[/] {r.message}", highlight=False)
    statuses = {r.status for r in results}
    if gates and statuses == {"passed"}:
        out.print(f"[green]all {len(results)} gates passed[/]")
    if "tripped" in statuses:
        raise RunFailed()
    if "inconclusive" in statuses:
        raise RunFailed("the runs are too noisy to gate: rerun longer or on a quieter host, "
                        "or give --noise RUN (a repeat of the first run)", code=EXIT_INCONCLUSIVE)


def open_run(ref: str, runs_dir: Path) -> RunFolder:
    return RunFolder.open(resolve_run(ref, runs_dir))
