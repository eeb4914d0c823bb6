"""What every command shares: exit codes, errors as one line on stderr, and consoles that
print plain, unwrapped lines when the output is not a terminal."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import orjson
import typer
from rich.console import Console

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INCONCLUSIVE, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
PIPED_WIDTH = 200


class CommandError(Exception):
    """Ends a command with `code` and the message as one line on stderr."""

    code = EXIT_FAILED
    prefix = ""

    def __init__(self, message: str = "", code: int | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class UsageError(CommandError):
    """A bad option or input, reported by name before anything is sent."""

    code = EXIT_USAGE
    prefix = "error: "


class RunFailed(CommandError):
    """The run could not start, or measured nothing usable."""


class Interrupted(CommandError):
    """Ctrl-C: what was measured so far is kept."""

    code = EXIT_INTERRUPTED


def console(stderr: bool = False) -> Console:
    """A console for results (stdout) or messages (stderr): on a terminal as rich draws it;
    piped, in plain lines that are never wrapped (a log or a test reads them whole)."""
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(stderr=stderr)
    width = int(os.environ.get("COLUMNS", "0") or 0) or PIPED_WIDTH
    return Console(stderr=stderr, soft_wrap=True, width=max(width, PIPED_WIDTH),
                   no_color=True, highlight=False)


def print_json(data: dict[str, Any]) -> None:
    """`--json`: the record as indented JSON on stdout, nothing else there."""
    sys.stdout.write(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode() + "\n")


def run_command(name: str, body: Callable[[], None]) -> None:
    """Run a command's body; a `CommandError` becomes its exit code and one line on stderr,
    Ctrl-C exit code 130. The services' and the load generator's own errors are named here
    once: bad input (a dataset, a trace, a tokenizer, a calibration) is a usage error, a
    target that cannot be used or work that could not be done a failed run."""
    try:
        try:
            body()
        except Exception as e:
            usage, failed = _named_errors()
            if isinstance(e, usage):
                raise UsageError(str(e)) from None
            if isinstance(e, failed):
                raise RunFailed(str(e)) from None
            raise
    except CommandError as e:
        if str(e):
            console(stderr=True).print(f"latlab {name}: {e.prefix}{e}", markup=False,
                                       highlight=False, style=None if e.code == EXIT_USAGE
                                       else "bold red")
        raise typer.Exit(e.code) from None
    except KeyboardInterrupt:
        console(stderr=True).print(f"latlab {name}: interrupted", style="yellow")
        raise typer.Exit(EXIT_INTERRUPTED) from None


def _named_errors() -> tuple[tuple[type[Exception], ...], tuple[type[Exception], ...]]:
    """The services' and the load generator's errors that `run_command` names: (bad input,
    failed work). Imported once one is raised, so that a command that never loads the load
    generator (`latlab serve`) does not import it to start."""
    from latlab.load import BenchError
    from latlab.load.workload.arrivals import ArrivalError
    from latlab.load.workload.datasets import DatasetError
    from latlab.records.folder import UnwritableOut
    from latlab.records.lengths import WorkloadError
    from latlab.services.errors import InputError, ServiceFailed

    return ((WorkloadError, ArrivalError, DatasetError, InputError, UnwritableOut),
            (BenchError, ServiceFailed))
