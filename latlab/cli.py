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


def main() -> None:
    app()
