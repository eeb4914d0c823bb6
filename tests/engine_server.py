"""`latlab serve` in-process for tests: uvicorn in a thread on a free 127.0.0.1 port."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from latlab.records.engine import EngineConfig, ServeConfig
from latlab.server.async_engine import AsyncEngine
from latlab.server.serve import build_server

TINY = dict(model="tiny", max_model_len=256, block_size=8, max_num_seqs=8,
            max_num_batched_tokens=64, num_kv_blocks=64)


@dataclass
class RunningServer:
    url: str
    engine: AsyncEngine
    server: uvicorn.Server


@contextmanager
def running_server(api_key: str | None = None, wait_ready: bool = True,
                   otel_file: Path | None = None, settings: dict | None = None,
                   **engine_options: object) -> Iterator[RunningServer]:
    """A server with the tiny preset (override any EngineConfig field, and any
    ServeConfig field through `settings`), ready unless `wait_ready` is False (then only
    listening)."""
    config = EngineConfig(**{**TINY, **engine_options})
    serve = ServeConfig(engine=config, api_key=api_key, otel_file=otel_file,
                        **(settings or {}))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = build_server(serve.model_copy(update={"port": port}))
    engine: AsyncEngine = server.config.app.state.engine
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not (server.started and (engine.ready.is_set() or not wait_ready)):
            assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
            time.sleep(0.01)
        yield RunningServer(f"http://127.0.0.1:{port}", engine, server)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
        assert not thread.is_alive(), "server did not stop"
