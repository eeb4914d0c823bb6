"""`latlab report`: explain a run folder again: summary, budget, findings, report.html,
and the per-request table as CSV or Parquet."""

from __future__ import annotations

from pathlib import Path

from latlab.analysis import analyze
from latlab.commands.common import UsageError, console
from latlab.commands.options import Options, opt
from latlab.records.folder import RunFolder, RunFolderError
from latlab.report.console import print_budget, print_findings, print_summary
from latlab.report.export import write_csv, write_parquet
from latlab.report.html import write_html


class ReportOptions(Options):
    out: str | None = opt(None, "Where to write the HTML report (default: RUN_DIR/report.html).",
                          "--out", "-o")
    csv: bool = opt(False, "Also write the per-request table to RUN_DIR/requests.csv.")
    parquet: bool = opt(False, "Also write the per-request table to RUN_DIR/requests.parquet.")
    full: bool = opt(False, "Print every component, not only the buckets.")


def report(run_dir: str, options: ReportOptions) -> None:
    """Explain a run: where the time goes, the findings, and one self-contained HTML report.

    Works on a partial run (no summary.json: it is recomputed from the records)."""
    try:
        analysis = analyze(RunFolder.open(run_dir))
    except RunFolderError as e:
        raise UsageError(str(e)) from None
    out = console()
    print_summary(out, analysis.summary, analysis.run.path)
    out.print()
    print_budget(out, analysis, full=options.full)
    out.print()
    print_findings(out, analysis)
    written = [write_html(analysis.run, analysis, Path(options.out) if options.out else None)]
    if options.csv:
        written.append(write_csv(analysis))
    if options.parquet:
        written.append(write_parquet(analysis))
    for path in written:
        out.print(f"wrote {path}")
