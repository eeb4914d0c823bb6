"""The `latlab` command. Each subcommand parses options and hands off to its module.

Imports of heavy modules (torch, the engine, plotly) stay inside the commands so that
`latlab --help` and the load generator start fast and never need torch.
"""

from __future__ import annotations

import typer

from latlab import __version__

app = typer.Typer(
    name="latlab",
    help="Measure, explain and predict the end-to-end latency of AI inference services.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"latlab {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """Measure, explain and predict the end-to-end latency of AI inference services."""


@app.command()
def report(
    run_dir: str = typer.Argument(..., metavar="RUN_DIR", help="A run folder from `latlab bench`."),
    out: str = typer.Option(None, "--out", "-o", help="Where to write the HTML report "
                            "(default: RUN_DIR/report.html)."),
    csv: bool = typer.Option(False, "--csv", help="Also write the per-request table to "
                             "RUN_DIR/requests.csv."),
    parquet: bool = typer.Option(False, "--parquet", help="Also write the per-request table "
                                 "to RUN_DIR/requests.parquet."),
    full: bool = typer.Option(False, "--full", help="Print every component, not only the buckets."),
) -> None:
    """Explain a run: where the time goes, the findings, and one self-contained HTML report.

    Works on a partial run (no summary.json: it is recomputed from the records)."""
    from pathlib import Path

    from rich.console import Console

    from latlab.analysis import analyze
    from latlab.report.console import print_budget, print_findings
    from latlab.report.export import write_csv, write_parquet
    from latlab.report.html import write_html
    from latlab.rundir import RunDir, RunDirError

    console = Console()
    try:
        analysis = analyze(RunDir.open(run_dir))
    except RunDirError as e:
        console.print(f"[red]error:[/] {e}")
        raise typer.Exit(2) from None
    print_budget(console, analysis, full=full)
    console.print()
    print_findings(console, analysis)
    written = [write_html(analysis.run, analysis, Path(out) if out else None)]
    if csv:
        written.append(write_csv(analysis))
    if parquet:
        written.append(write_parquet(analysis))
    for path in written:
        console.print(f"wrote {path}")


def main() -> None:
    app()
