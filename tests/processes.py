"""Waiting for a condition, and latlab run as a subprocess that is interrupted."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable


def wait_until(condition, timeout_s: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def interrupted(args: list[str], ready: Callable[[], object]) -> tuple[int, bytes, bytes]:
    """`python -m latlab ARGS`, sent SIGINT once `ready()` returns: its exit code, stdout
    and stderr (it is killed if it outlives this)."""
    proc = subprocess.Popen([sys.executable, "-m", "latlab", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        ready()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out, err
