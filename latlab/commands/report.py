"""`latlab report`: explain a run folder again: summary, budget, findings, report.html,
and the per-request table as CSV or Parquet."""

from __future__ import annotations

from pathlib import Path

from latlab.analysis import analyze
from latlab.commands.common import RunFailed, UsageError, console
from latlab.commands.options import Options
from latlab.load.telemetry.otlp import read_spans
from latlab.load.telemetry.spans import join_run
from latlab.records.folder import RunFolder, RunFolderError
from latlab.records.settings import setting
from latlab.report.budget_bars import print_budget
from latlab.report.console import print_findings, print_server_view, print_summary
from latlab.report.export import write_csv, write_parquet
from latlab.report.html import write_html


class ReportOptions(Options):
    out: str | None = setting(None, "Where to write the HTML report (default: "
                              "RUN_DIR/report.html).",
                          "--out", "-o")
    csv: bool = setting(False, "Also write the per-request table to RUN_DIR/requests.csv.")
    parquet: bool = setting(False, "Also write the per-request table to RUN_DIR/requests.parquet.")
    full: bool = setting(False, "Print every component, not only the buckets.")
    spans: Path | None = setting(None, "Join the server's spans from this file to the requests "
                                   "first (an OTel collector's file export, OTLP/JSON lines, or "
                                   "latlab serve --otel-file).")


def report(run_dir: str, options: ReportOptions) -> None:
    """Explain a run: where the time goes, the findings, and one self-contained HTML report.

    Works on a partial run (no summary.json: it is recomputed from the records)."""
    html = Path(options.out) if options.out else None
    if html is not None and not html.parent.is_dir():
        raise UsageError(f"--out {html}: {html.parent} is no folder")
    try:
        run = RunFolder.open(run_dir)
        failed = run.read_config().failed
        if failed is not None:
            raise RunFailed(f"{run.path} did not start, nothing was measured: {failed}")
        if options.spans is not None:
            _join(run, options.spans)
        analysis = analyze(run)
    except RunFolderError as e:
        raise UsageError(str(e)) from None
    out = console()
    print_summary(out, analysis.summary, analysis.run.path)
    out.print()
    print_budget(out, analysis, full=options.full)
    print_server_view(out, analysis)
    out.print()
    print_findings(out, analysis)
    try:
        written = [write_html(analysis.run, analysis, html)]
    except OSError as e:
        raise UsageError(f"--out {html}: cannot write it ({e.strerror or e})") from None
    if options.csv:
        written.append(write_csv(analysis))
    if options.parquet:
        written.append(write_parquet(analysis))
    for path in written:
        out.print(f"wrote {path}")


def _join(run: RunFolder, path: Path) -> None:
    """Join the spans of `path` to the run's requests; the summary records the join."""
    try:
        joined = join_run(run, read_spans(path))
    except (OSError, ValueError) as e:
        raise UsageError(f"--spans {path}: {getattr(e, 'strerror', None) or e}") from None
    summary = run.read_summary()
    if summary is not None:
        summary.spans = joined
        run.write_summary(summary)
    console(stderr=True).print(f"joined {joined.requests_joined} of "
                               f"{joined.requests_with_trace} traced requests to "
                               f"{joined.spans} spans", highlight=False)
