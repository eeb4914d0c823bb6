"""The `latlab` command: declarations only; each command lives in `latlab.commands`.

Heavy modules (torch, the engine) load inside the commands that need them, so `latlab
--help` and the load generator start fast and never need torch.
"""

from __future__ import annotations

from pathlib import Path

import typer

from latlab import __version__
from latlab.commands import (
    ab,
    bench,
    calibrate,
    coldstart,
    compare,
    export,
    observe,
    predict,
    report,
    runs,
    serve,
    sweep,
    trace,
    tune,
)
from latlab.commands.options import (
    ConfigFile,
    JsonOutput,
    NamedWorkload,
    TestedAdvice,
    command,
)
from latlab.records.ab import ABConfig
from latlab.records.bench import BenchConfig
from latlab.records.coldstart import ColdstartConfig
from latlab.records.engine import ServeConfig
from latlab.records.observe import ObserveConfig
from latlab.records.predict import CalibrateConfig, PredictConfig
from latlab.records.sweep import SweepConfig
from latlab.records.trace import TraceConfig
from latlab.records.tune import TuneConfig
from latlab.records.verdict import CompareConfig

# Plain click help: each option's text wraps beside it at any width (rich's panels squeeze
# it into a narrow column at 80), and piped help is plain text.
PLAIN_HELP = {"rich_markup_mode": None, "no_args_is_help": True}
app = typer.Typer(
    name="latlab",
    help="Measure, explain and predict the end-to-end latency of AI inference services.",
    add_completion=False,
    pretty_exceptions_enable=False,
    **PLAIN_HELP,
)
tokenizer_app = typer.Typer(help="The tokenizer latlab's engine uses.", **PLAIN_HELP)
model_app = typer.Typer(help="The models latlab's engine serves.", **PLAIN_HELP)
app.add_typer(tokenizer_app, name="tokenizer")
app.add_typer(model_app, name="model")


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


RUN_DIR = ("run_dir", str, typer.Argument(..., metavar="RUN_DIR",
                                          help="A run folder from `latlab bench`."))
RUNS = ("runs", list[str], typer.Argument(..., metavar="RUN_A RUN_B [RUN...]",
                                          help="Run folders or run ids (see `latlab runs`); "
                                               "each is compared with the first."))
SOURCE = ("source", Path, typer.Argument(..., metavar="TRACE", help="A trace (Mooncake JSONL, "
                                         "Azure or BurstGPT CSV, latlab JSONL) or a run "
                                         "folder."))
FOLDER = ("folder", Path, typer.Argument(..., help="Where to write the Hugging Face folder."))

command(app, bench.bench, config=BenchConfig, options=bench.BenchDisplay)
command(app, sweep.sweep, config=SweepConfig, options=bench.Display, exclude=sweep.NOT_TAKEN)
command(app, coldstart.coldstart, config=ColdstartConfig, options=ConfigFile,
        exclude=coldstart.NOT_TAKEN)
command(app, predict.predict, config=PredictConfig, options=TestedAdvice,
        exclude=predict.NOT_TAKEN)
command(app, calibrate.calibrate, config=CalibrateConfig, options=JsonOutput)
command(app, report.report, options=report.ReportOptions, arguments=(RUN_DIR,))
command(app, compare.compare, config=CompareConfig, options=compare.CompareOptions,
        arguments=(RUNS,))
command(app, ab.ab, config=ABConfig, options=NamedWorkload, exclude=ab.NOT_TAKEN)
command(app, tune.tune, config=TuneConfig, options=NamedWorkload, exclude=tune.NOT_TAKEN)
command(app, observe.observe, config=ObserveConfig, options=JsonOutput)
command(app, runs.runs, options=runs.RunsOptions)
command(app, trace.trace, config=TraceConfig, options=trace.TraceOptions,
        exclude=trace.NOT_TAKEN, arguments=(SOURCE,), into={"source": ("arrivals", "trace")})
command(app, serve.serve, config=ServeConfig)
command(tokenizer_app, export.tokenizer_export, options=export.TokenizerExportOptions,
        name="export", arguments=(FOLDER,))
command(model_app, export.model_export, options=export.ModelExportOptions, name="export",
        arguments=(FOLDER,))


def main() -> None:
    app()
