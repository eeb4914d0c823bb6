"""`latlab serve`: latlab's own OpenAI-compatible inference server (the reference engine)."""

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
