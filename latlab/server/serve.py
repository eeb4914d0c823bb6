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

import uvicorn
import uvloop

from latlab.engine.engine import LLMEngine
from latlab.records.engine import EngineConfig, ServeConfig
from latlab.server.app import create_app
from latlab.server.async_engine import AsyncEngine
from latlab.server.auth import read_api_key


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


def build_server(serve: ServeConfig) -> uvicorn.Server:
    """A uvicorn server around a new engine; the engine warms up once the server starts.
    The API key is read here (--api-key, LATLAB_API_KEY or --api-key-file)."""
    config = serve.engine
    serve = serve.model_copy(update={"api_key": read_api_key(serve.api_key, serve.api_key_file),
                                     "api_key_file": None})
    engine = AsyncEngine(LLMEngine(config.model_copy(update={"warmup": False})),
                         config.max_waiting, step_log=serve.step_log)
    app = create_app(engine, serve, warmup=config.warmup)
    return _Server(uvicorn.Config(app, host=serve.host, port=serve.port, log_level="warning",
                                  access_log=False, timeout_graceful_shutdown=5,
                                  lifespan="on"), engine)


def run_server(serve: ServeConfig) -> None:
    started = time.perf_counter()
    server = build_server(serve)

    async def main() -> None:
        announce = asyncio.create_task(_announce(server, serve.engine, serve.host, serve.port,
                                                 started))
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
