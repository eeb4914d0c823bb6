"""The embedded target: `latlab serve` in its own process on a free loopback port, or any
server command (`start_server`).

    with start_engine(["--model", "tiny"], log_path=run.path / "engine.log") as engine:
        ... send load to engine.url ...

The server runs in its own session (a new process group), so a Ctrl-C in the terminal reaches
latlab, which stops the whole group (SIGTERM, then SIGKILL) on every way out, children too.
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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

READY_POLL_S = 0.2
LOG_TAIL_LINES = 20


class EngineError(RuntimeError):
    """The embedded engine could not be started or died."""


@dataclass
class ServerProcess:
    """A server in its own process group; `ready_s` is from just before its start to the
    first 200 of `ready_url`."""

    url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    started_s: float
    ready_url: str
    name: str = "latlab serve"
    ready_s: float | None = None

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def exited(self, wait_s: float = 0.0) -> bool:
        """Whether the process has exited, waiting up to `wait_s` for it (a killed process
        refuses connections a moment before it can be reaped)."""
        try:
            self.process.wait(wait_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])

    def wait_ready(self, timeout_s: float, poll_s: float = READY_POLL_S) -> None:
        """Poll `ready_url` until it answers 200; raise `EngineError` if the server dies or
        is slow."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive:
                raise EngineError(f"{self.name} exited with code {self.process.returncode} "
                                  f"before it was ready; its log ({self.log_path}):\n"
                                  f"{self.log_tail()}")
            if responds_ok(self.ready_url):
                self.ready_s = time.monotonic() - self.started_s
                return
            time.sleep(poll_s)
        raise EngineError(f"{self.name} was not ready after {timeout_s:g} s ({self.ready_url} "
                          f"never answered 200); its log ({self.log_path}):\n{self.log_tail()}")

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM to the process group, SIGKILL after `timeout_s`, then SIGKILL to whatever
        of the group outlived its leader; returns the leader's exit code."""
        if self.alive:
            self._signal_group(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self.process.wait(timeout_s)
        self._signal_group(signal.SIGKILL)
        return self.process.returncode

    def _signal_group(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self.process.pid, sig)
        except (ProcessLookupError, PermissionError):  # the group is gone
            pass

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def interrupt_on_sigterm() -> None:
    """Make SIGTERM raise KeyboardInterrupt like Ctrl-C, so the cleanup that stops the servers
    latlab started runs for it too (main thread only; an event loop's own handlers replace it
    while they are installed)."""
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    try:
        signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread
        pass


@contextmanager
def remembered_interrupts() -> Iterator[Callable[[], bool]]:
    """Ctrl-C raises KeyboardInterrupt as always, and is remembered: one that Python swallowed
    (raised inside a weakref callback or a `__del__`, which can only print it) is found by
    `pressed()` at the next point where stopping is safe. Main thread only."""
    pressed: list[int] = []

    def interrupt(signum: int, frame: object) -> None:
        pressed.append(signum)
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGINT, interrupt)
    except ValueError:  # not the main thread
        yield lambda: False
        return
    try:
        yield lambda: bool(pressed)
    finally:
        signal.signal(signal.SIGINT, previous)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def responds_ok(url: str, timeout_s: float = 2.0) -> bool:
    """Whether `url` answers a GET with 200."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def start_engine(serve_args: Sequence[str] = (), *, ready_timeout_s: float = 120.0,
                 log_path: Path | None = None, host: str = "127.0.0.1",
                 poll_s: float = READY_POLL_S) -> ServerProcess:
    """Start `python -m latlab serve` on a free port of `host` and wait until it is ready."""
    port = free_port(host)
    command = [sys.executable, "-m", "latlab", "serve", "--host", host, "--port", str(port),
               *serve_args]
    url = f"http://{host}:{port}"
    return start_server(command, url, url + "/ready", ready_timeout_s=ready_timeout_s,
                        log_path=log_path, poll_s=poll_s)


def start_server(command: Sequence[str], url: str, ready_url: str, *,
                 ready_timeout_s: float = 120.0, log_path: Path | None = None,
                 poll_s: float = READY_POLL_S, name: str = "latlab serve",
                 env: Mapping[str, str] | None = None) -> ServerProcess:
    """Start `command` in a new process group (output to `log_path`, `env` added to this
    process's environment) and wait until `ready_url` answers 200; on any failure (Ctrl-C
    too) the group is stopped."""
    if log_path is None:
        fd, temp = tempfile.mkstemp(prefix="latlab-server-", suffix=".log")
        os.close(fd)
        log_path = Path(temp)
    started = time.monotonic()
    try:
        with open(log_path, "wb") as log:
            process = subprocess.Popen(list(command), stdin=subprocess.DEVNULL, stdout=log,
                                       stderr=subprocess.STDOUT, start_new_session=True,
                                       env=os.environ | dict(env) if env else None)
    except OSError as e:
        raise EngineError(f"{name}: cannot start {command[0]!r}: {e.strerror or e}") from None
    server = ServerProcess(url, process, log_path, started, ready_url, name)
    try:
        server.wait_ready(ready_timeout_s, poll_s)
    except BaseException:
        server.stop()
        raise
    return server
