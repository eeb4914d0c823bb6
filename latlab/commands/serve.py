"""`latlab serve`: latlab's own OpenAI-compatible inference server (the reference engine).

`python -m latlab.commands.serve ARGS` is `latlab serve ARGS` without the rest of the CLI's
imports (every other command's, about 2-3 s of a start on 2 cores): how latlab starts the
servers it measures itself (`load.target.launch.ServerLaunch.embedded`).
"""

from __future__ import annotations

from latlab.commands.common import UsageError
from latlab.records.engine import ConfigError, ServeConfig


def serve(config: ServeConfig) -> None:
    """Serve a model through an OpenAI-compatible API (latlab's reference engine, on the CPU
    or a CUDA GPU)."""
    from latlab.engine.loader import ModelLoadError
    from latlab.server.serve import run_server

    if config.step_log is not None:
        try:
            open(config.step_log, "ab").close()
        except OSError as e:
            raise UsageError(f"--step-log {config.step_log}: {e.strerror or e}") from None
    try:
        run_server(config)
    except (ConfigError, ModelLoadError) as e:
        raise UsageError(str(e)) from None


def main() -> None:
    """`latlab serve` alone: its options, none of the other commands' imports."""
    import typer

    from latlab.commands.options import command

    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False,
                      rich_markup_mode=None)
    command(app, serve, config=ServeConfig)
    app(prog_name="latlab serve")


if __name__ == "__main__":
    main()
