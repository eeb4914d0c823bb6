"""`latlab serve`: build the engine, start uvicorn on uvloop, announce readiness.

`run_server` blocks until SIGINT/SIGTERM, then shuts down cleanly (in-flight streams end,
the engine thread stops).
"""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import uvicorn
import uvloop

from latlab.engine.config import EngineConfig
from latlab.engine.engine import LLMEngine
from latlab.server.app import create_app
from latlab.server.async_engine import AsyncEngine
from latlab.server.openai_serving import ServerSettings


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, engine: AsyncEngine) -> None:
        super().__init__(config)
        self.engine = engine

    async def shutdown(self, sockets: list | None = None) -> None:
        # End the requests in flight now (an error event, then [DONE]) rather than cancel
        # them after the graceful-shutdown timeout.
        self.engine.stop()
        await super().shutdown(sockets)

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        """SIGINT/SIGTERM start a graceful shutdown, after which the process exits 0
        (uvicorn's own handler re-raises the signal once it has shut down)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.handle_exit, sig, None)
        try:
            yield
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)


def build_server(config: EngineConfig, settings: ServerSettings, host: str,
                 port: int) -> uvicorn.Server:
    """A uvicorn server around a new engine; the engine warms up once the server starts."""
    engine = AsyncEngine(LLMEngine(replace(config, warmup=False)), config.max_waiting,
                         step_log=settings.step_log)
    app = create_app(engine, settings, warmup=config.warmup)
    return _Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                  access_log=False, timeout_graceful_shutdown=5,
                                  lifespan="on"), engine)


def run_server(config: EngineConfig, settings: ServerSettings, host: str = "127.0.0.1",
               port: int = 8000) -> None:
    started = time.perf_counter()
    server = build_server(config, settings, host, port)

    async def main() -> None:
        announce = asyncio.create_task(_announce(server, config, host, port, started))
        try:
            await server.serve()
        finally:
            announce.cancel()

    uvloop.run(main())
    if not server.started:
        sys.exit(1)
    print("latlab serve: stopped", flush=True)


async def _announce(server: uvicorn.Server, config: EngineConfig, host: str, port: int,
                    started: float) -> None:
    engine: AsyncEngine = server.config.app.state.engine
    while not (server.started and engine.ready.is_set()):
        if engine.failed:
            print(f"latlab serve: the engine failed: {engine.failed}", file=sys.stderr)
            server.should_exit = True
            return
        await asyncio.sleep(0.01)
    model, device = engine.engine.model_config, engine.engine.device.type
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
    print(f"latlab serve: ready on {url} (model {config.model}, "
          f"{model.num_parameters / 1e6:.1f}M parameters, on {device}, "
          f"warm-up {engine.startup_s:.1f} s, startup {time.perf_counter() - started:.1f} s)",
          flush=True)
