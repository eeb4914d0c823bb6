"""`latlab serve`: build the engine, start uvicorn on uvloop, announce readiness.

`run_server` blocks until SIGINT/SIGTERM, then shuts down cleanly (in-flight streams end,
the engine's loop stops).
"""

from __future__ import annotations

import asyncio
import functools
import resource
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
import uvloop

from latlab.engine.device import resolve_device
from latlab.records.engine import EngineConfig, ServeConfig
from latlab.server.app import create_app
from latlab.server.async_engine import AsyncEngine
from latlab.server.auth import read_api_key
from latlab.server.connections import ConnectionGuard, GuardedH11Protocol
from latlab.server.engine_core import engine_core
from latlab.server.engine_messages import CoreKind

FILES_KEPT = 128  # open files kept for the model, logs and the engine besides connections


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
    The API key is read here (--api-key, LATLAB_API_KEY or --api-key-file); the connections
    are guarded (`connections`), at most as many as the open-files limit allows."""
    config = serve.engine
    serve = serve.model_copy(update={"api_key": read_api_key(serve.api_key, serve.api_key_file),
                                     "api_key_file": None,
                                     "max_connections": connection_limit(serve.max_connections)})
    engine = AsyncEngine(engine_core(core_kind(serve), config, serve.step_log),
                         config.max_waiting)
    app = create_app(engine, serve, warmup=config.warmup)
    app.state.connections = guard = ConnectionGuard(serve)
    app.state.telemetry.registry.register(guard)
    return _Server(uvicorn.Config(app, host=serve.host, port=serve.port, log_level="warning",
                                  access_log=False, timeout_graceful_shutdown=5,
                                  lifespan="on", backlog=serve.max_connections,
                                  http=functools.partial(GuardedH11Protocol, guard=guard)),
                   engine)


def core_kind(serve: ServeConfig) -> CoreKind:
    """`--engine-core auto`: a process of its own on CUDA, where one Python core is the
    limit of a fast step; a thread on the CPU, where the steps use the cores."""
    if serve.engine_core != "auto":
        return serve.engine_core
    config = serve.engine
    cuda = resolve_device(config.device, config.quantization).type == "cuda"
    return "process" if cuda else "thread"


def connection_limit(wanted: int) -> int:
    """`wanted` connections, or as many as the open-files limit leaves room for (raised to
    its hard limit first, as vLLM's server does), with `FILES_KEPT` for everything else."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = wanted + FILES_KEPT
    if soft != resource.RLIM_INFINITY and soft < needed:
        raised = needed if hard == resource.RLIM_INFINITY else min(hard, needed)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return wanted
    allowed = max(1, soft - FILES_KEPT)
    print(f"latlab serve: --max-connections {wanted} lowered to {allowed}: the open-files "
          f"limit is {soft} (ulimit -n)", file=sys.stderr, flush=True)
    return allowed


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
    model, device = engine.info.model_config, engine.info.device
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
    print(f"latlab serve: ready on {url} (model {config.model}, "
          f"{model.num_parameters / 1e6:.1f}M parameters, on {device}, engine in a "
          f"{engine.core.kind}, "
          f"warm-up {engine.startup_s:.1f} s, startup {time.perf_counter() - started:.1f} s)",
          flush=True)
