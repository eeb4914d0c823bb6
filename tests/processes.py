"""Waiting for a condition, whether a process lives, and latlab run as a subprocess that is
interrupted."""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


def alive(pid: int) -> bool:
    """Whether process `pid` runs: not gone, nor only its zombie (Linux's /proc)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return state[0] != "Z"


def wait_until(condition, timeout_s: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def interrupted(args: list[str], ready: Callable[[], object], what: str,
                timeout_s: float = 60.0, after_s: float = 0.0,
                sig: int = signal.SIGINT) -> tuple[int, bytes, bytes]:
    """`python -m latlab ARGS`, sent `sig` `after_s` after `ready()` is true: its exit code,
    stdout and stderr. Fails at once, with its stderr, if it ends before; it is killed if it
    outlives this."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([sys.executable, "-m", "latlab", *args], stdout=out, stderr=err)
        try:
            wait_until(lambda: proc.poll() is not None or ready(), timeout_s, what)
            if proc.poll() is not None:
                err.seek(0)
                raise AssertionError(f"latlab ended (exit {proc.returncode}) before {what}: "
                                     f"{err.read().decode()[-2000:]}")
            time.sleep(after_s)
            proc.send_signal(sig)
            proc.wait(60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        out.seek(0)
        err.seek(0)
        return proc.returncode, out.read(), err.read()


@dataclass
class Running:
    """`python -m latlab ARGS` in its own session (`running`): its process, and once the
    block has ended its exit code, stdout and stderr."""

    process: subprocess.Popen
    returncode: int | None = None
    out: bytes = b""
    err: bytes = b""


@contextmanager
def running(args: list[str], timeout_s: float = 120.0) -> Iterator[Running]:
    """latlab running for the block, sent Ctrl-C when the block ends and waited for (killed,
    by its PID, if the block fails or it outlives `timeout_s`)."""
    process = subprocess.Popen([sys.executable, "-m", "latlab", *args], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, start_new_session=True)
    run = Running(process)
    try:
        yield run
        process.send_signal(signal.SIGINT)
        run.out, run.err = process.communicate(timeout=timeout_s)
        run.returncode = process.returncode
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
