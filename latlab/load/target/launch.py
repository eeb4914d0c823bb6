"""The servers latlab starts: `latlab serve` on a free loopback port (`embedded_engine`), or
any server command (`ServerLaunch` and `launched`).

    with embedded_engine(["--model", "tiny"], log_path=run.path / "engine.log") as engine:
        ... send load to engine.url ...

A `ServerLaunch` says what to run and where it answers; `launched` starts it, waits until it is
ready and stops it on every way out. The server runs in its own session (a new process group),
so a Ctrl-C in the terminal reaches latlab, which stops the whole group by its leader's PID
(SIGTERM, then SIGKILL), children too; the group is tethered to latlab (`tether`), so it dies
with latlab even when latlab is killed before it can stop it. Every failure to start raises
`EngineError`, a `BenchError`, whose message names the server and ends with its log's tail.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

from latlab.load import BenchError
from latlab.load.target.interrupts import PRESSED
from latlab.load.target.tether import Tether, spawn_tethered
from latlab.records.bench import TargetConfig

READY_POLL_S = 0.2
READY_TIMEOUT_S = 120.0  # a started server's, unless its config says (--launch-timeout)
LOG_TAIL_LINES = 20


class EngineError(BenchError):
    """A server latlab started could not be started, or was not ready in time."""


@dataclass(frozen=True)
class ServerLaunch:
    """How to start one server: its command line, the base URL it serves, the URL that answers
    200 once it is ready, and the name its errors give it."""

    command: tuple[str, ...]
    url: str
    ready_url: str
    name: str

    @classmethod
    def embedded(cls, serve_args: Sequence[str] = (), *, host: str = "127.0.0.1",
                 name: str = "latlab serve") -> ServerLaunch:
        """`latlab serve` on a free port of `host`, through its own entry (`python -m
        latlab.commands.serve`: the CLI's other commands not imported)."""
        port = free_port(host)
        url = f"http://{host}:{port}"
        command = (sys.executable, "-m", "latlab.commands.serve", "--host", host, "--port",
                   str(port), *serve_args)
        return cls(command, url, url + "/ready", name)

    @classmethod
    def templated(cls, template: str, args: Sequence[str] = (), *, host: str = "127.0.0.1",
                  ready_path: str = "/health", name: str | None = None) -> ServerLaunch:
        """Any server command, `template` with `{port}` (a free port of `host`), `{host}` and
        `{args}` (`args`, as separate arguments) filled in; ready once `ready_path` answers
        200."""
        port = free_port(host)
        command: list[str] = []
        try:
            tokens = shlex.split(template)
        except ValueError as e:
            raise EngineError(f"--launch {template!r}: {e}") from None
        if args and not any("{args}" in token for token in tokens):
            raise EngineError(f"--launch {template!r} has no {{args}}: the arguments "
                              f"{shlex.join(args)!r} would be left out (both sides of an ab "
                              "alike); put {args} where the server takes them")
        for token in tokens:
            if token == "{args}":
                command += args
                continue
            command.append(token.replace("{port}", str(port)).replace("{host}", host)
                           .replace("{args}", shlex.join(args)))
        url = f"http://{host}:{port}"
        return cls(tuple(command), url, url + ready_path,
                   name or Path(command[0]).name if command else "the --launch server")


@dataclass
class ServerProcess:
    """A started server in its own process group, tethered to latlab; `ready_s` is from just
    before its start to the first 200 of its ready URL."""

    launch: ServerLaunch
    process: subprocess.Popen[bytes]
    log_path: Path
    started_s: float
    tether: Tether
    ready_s: float | None = None

    @property
    def url(self) -> str:
        return self.launch.url

    @property
    def name(self) -> str:
        return self.launch.name

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
        ready_url = self.launch.ready_url
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive:
                raise EngineError(f"{self.name} exited with code {self.process.returncode} "
                                  f"before it was ready; its log ({self.log_path}):\n"
                                  f"{self.log_tail()}")
            if responds_ok(ready_url):
                self.ready_s = time.monotonic() - self.started_s
                return
            if PRESSED:  # a Ctrl-C that Python swallowed: waiting on would outlast it
                raise KeyboardInterrupt
            time.sleep(poll_s)
        raise EngineError(f"{self.name} was not ready after {timeout_s:g} s ({ready_url} "
                          f"never answered 200); its log ({self.log_path}):\n{self.log_tail()}")

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM to the process group, SIGKILL after `timeout_s`, then SIGKILL to whatever
        of the group outlived its leader (the tether's watchdog too); returns the leader's exit
        code."""
        if self.tether.fd is None:  # stopped before: its PID may lead another group by now
            return self.process.returncode
        if self.alive:
            self._signal_group(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self.process.wait(timeout_s)
        self._signal_group(signal.SIGKILL)
        self.tether.cut()
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


@contextmanager
def launched(launch: ServerLaunch, *, log_path: Path | None = None,
             ready_timeout_s: float = READY_TIMEOUT_S, poll_s: float = READY_POLL_S
             ) -> Iterator[ServerProcess]:
    """The server of `launch`, started and ready, stopped when the block ends."""
    with start_server(launch, log_path=log_path, ready_timeout_s=ready_timeout_s,
                      poll_s=poll_s) as server:
        yield server


def embedded_engine(serve_args: Sequence[str] = (), *, log_path: Path | None = None,
                    ready_timeout_s: float = READY_TIMEOUT_S, poll_s: float = READY_POLL_S,
                    host: str = "127.0.0.1", name: str = "latlab serve"
                    ) -> AbstractContextManager[ServerProcess]:
    """`latlab serve serve_args` on a free port of `host`, ready, stopped when the block ends;
    `name` is what its errors call it."""
    return launched(ServerLaunch.embedded(serve_args, host=host, name=name), log_path=log_path,
                    ready_timeout_s=ready_timeout_s, poll_s=poll_s)


def target_server(target: TargetConfig, log_path: Path, *, name: str | None = None,
                  engine_args: Sequence[str] = ()) -> AbstractContextManager[ServerProcess]:
    """The server a bench config without a URL measures, started for the block: its
    `--launch` command with `--serve-args` as its `{args}`, else latlab serve with them (and
    `engine_args`)."""
    return launched(target_launch(target, name=name, engine_args=engine_args),
                    log_path=log_path, ready_timeout_s=ready_timeout(target))


def target_launch(target: TargetConfig, *, name: str | None = None,
                  engine_args: Sequence[str] = ()) -> ServerLaunch:
    """How to start the server a bench config without a URL measures (`target_server`'s)."""
    if target.launch is not None:
        return ServerLaunch.templated(target.launch, target.serve_args,
                                      ready_path=target.launch_ready, name=name)
    return ServerLaunch.embedded([*target.serve_args, *engine_args],
                                 name=name or "latlab serve")


def ready_timeout(target: TargetConfig) -> float:
    """Seconds the server of `target_launch` may take to be ready."""
    return target.launch_timeout_s if target.launch is not None else READY_TIMEOUT_S


def start_server(launch: ServerLaunch, *, log_path: Path | None = None,
                 ready_timeout_s: float = READY_TIMEOUT_S, poll_s: float = READY_POLL_S
                 ) -> ServerProcess:
    """Start `launch` in a new process group (output to `log_path`, a temporary file if None)
    and wait until it is ready; on any failure (Ctrl-C too) the group is stopped. The caller
    stops it (`stop()`, or `with`); `launched` is the block that does."""
    server = spawn_server(launch, log_path=log_path)
    try:
        server.wait_ready(ready_timeout_s, poll_s)
    except BaseException:
        server.stop()
        raise
    return server


def spawn_server(launch: ServerLaunch, *, log_path: Path | None = None) -> ServerProcess:
    """Start `launch` in a new process group tethered to latlab (output to `log_path`, a
    temporary file if None) without waiting for it: the caller does other work meanwhile,
    then `wait_ready()`, and stops it on every way out (`with`)."""
    if log_path is None:
        fd, temp = tempfile.mkstemp(prefix="latlab-server-", suffix=".log")
        os.close(fd)
        log_path = Path(temp)
    started = time.monotonic()
    try:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(log_path, "wb")
    except OSError as e:
        raise EngineError(f"{launch.name}: cannot write its log {log_path}: "
                          f"{e.strerror or e}") from None
    try:
        with log:
            tethered = spawn_tethered(launch.command, stdout=log)
    except OSError as e:
        raise EngineError(f"{launch.name}: cannot start {launch.command[0]!r}: "
                          f"{e.strerror or e}") from None
    return ServerProcess(launch, tethered.process, log_path, started, tethered.tether)
