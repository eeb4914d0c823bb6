"""The embedded target: `latlab serve` in its own process on a free loopback port.

    with start_engine(["--model", "tiny"], log_path=run.path / "engine.log") as engine:
        ... send load to engine.url ...

The engine runs in its own session, so a Ctrl-C in the terminal reaches latlab, which stops
the engine (SIGTERM, then SIGKILL) on every way out.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

READY_POLL_S = 0.2
LOG_TAIL_LINES = 20


class EngineError(RuntimeError):
    """The embedded engine could not be started or died."""


@dataclass
class EmbeddedEngine:
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    started_s: float
    ready_s: float | None = None

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])

    def wait_ready(self, timeout_s: float) -> None:
        """Poll /ready until it answers 200; raise `EngineError` if the engine dies or is slow."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive:
                raise EngineError(f"latlab serve exited with code {self.process.returncode} "
                                  f"before it was ready; its log ({self.log_path}):\n"
                                  f"{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/ready", timeout=2) as resp:
                    if resp.status == 200:
                        self.ready_s = time.monotonic() - self.started_s
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(READY_POLL_S)
        raise EngineError(f"latlab serve was not ready after {timeout_s:g} s; its log "
                          f"({self.log_path}):\n{self.log_tail()}")

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after `timeout_s`; returns the exit code."""
        if self.alive:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout_s)
        return self.process.returncode

    def __enter__(self) -> EmbeddedEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def start_engine(serve_args: Sequence[str] = (), *, ready_timeout_s: float = 120.0,
                 log_path: Path | None = None, host: str = "127.0.0.1") -> EmbeddedEngine:
    """Start `python -m latlab serve` on a free port of `host` and wait until it is ready."""
    port = free_port(host)
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix="latlab-engine-", suffix=".log")
        os.close(fd)
        log_path = Path(name)
    command = [sys.executable, "-m", "latlab", "serve", "--host", host, "--port", str(port),
               *serve_args]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    engine = EmbeddedEngine(f"http://{host}:{port}", process, log_path, time.monotonic())
    try:
        engine.wait_ready(ready_timeout_s)
    except BaseException:
        engine.stop()
        raise
    return engine
