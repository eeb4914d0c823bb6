"""A child process tied to latlab's life: when latlab dies in any way (SIGKILL, its terminal
closed), the child's whole process group is killed, whatever the command is (what leaves
the group, a daemon calling `setsid`, is out of its reach, as of `ServerProcess.stop`'s).

    tethered = spawn_tethered(["llama-server", "--port", "8080"], stdout=log)
    ...
    tethered.tether.cut()  # once the group is stopped

The command runs in a new session through this file, run as a script (`python -I -S
tether.py`: the standard library only, no latlab import). Before it execs the command it
forks a watchdog into the same process group that blocks reading a pipe whose only write end
latlab holds: the kernel closes that end when latlab dies, and the watchdog then SIGKILLs the
group. A pipe, not `prctl(PR_SET_PDEATHSIG)`: that fires when the *thread* that started the
child exits, and it needs `preexec_fn`, unsafe once latlab has threads. The watchdog is forked
twice, so it is not the server's child (no stray SIGCHLD, no zombie in the server), and
ignores SIGTERM and SIGINT: latlab's stop ends the group with SIGTERM, the server shuts down
gracefully while the watchdog still guards it, and the closing SIGKILL ends the watchdog. The
command's exec error comes back through a second pipe (closed on exec), as `subprocess` does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO

# signals Python ignores at start-up, which an exec'd command would inherit ignored
_RESTORED = ("SIGPIPE", "SIGXFSZ", "SIGXFZ")
_SCRIPT = os.path.abspath(__file__)


@dataclass
class Tether:
    """The write end of the pipe a tethered group's watchdog reads; `cut()` closes it (the
    watchdog then kills whatever is left of the group). Latlab's exit cuts it too."""

    fd: int | None

    def cut(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


@dataclass(frozen=True)
class Tethered:
    """A started command (its PID is the command's own, the leader of its process group) and
    the tether that ends the group when latlab dies."""

    process: subprocess.Popen[bytes]
    tether: Tether


def spawn_tethered(command: Sequence[str], *, stdout: IO[bytes] | int | None = None
                   ) -> Tethered:
    """Start `command` in a new session, tethered to this process; stdin from /dev/null,
    stdout and stderr to `stdout`. Raises `OSError` (its filename the command) if the command
    cannot be executed, after its group is gone."""
    tether_read, tether_write = os.pipe()
    report_read, report_write = os.pipe()
    shim = [sys.executable, "-I", "-S", _SCRIPT, str(tether_read),
            str(report_write), "--", *command]
    try:
        process = subprocess.Popen(shim, stdin=subprocess.DEVNULL, stdout=stdout,
                                   stderr=subprocess.STDOUT, start_new_session=True,
                                   pass_fds=(tether_read, report_write))
    except BaseException:
        for fd in (tether_read, tether_write, report_read, report_write):
            os.close(fd)
        raise
    os.close(tether_read)
    os.close(report_write)
    tether = Tether(tether_write)
    try:
        report = _read_to_end(report_read)  # ends at the command's exec
    except BaseException:  # Ctrl-C while the shim starts
        _end(process, tether)
        raise
    finally:
        os.close(report_read)
    if report:
        _end(process, tether)
        code = int(report)
        raise OSError(code, os.strerror(code), command[0])
    return Tethered(process, tether)


def _read_to_end(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 64):
        chunks.append(chunk)
    return b"".join(chunks)


def _end(process: subprocess.Popen[bytes], tether: Tether) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()
    tether.cut()


def _watch(tether: int) -> None:
    """The watchdog: detached from the server's output, it execs itself afresh (so `ps` shows
    `tether.py --watch`, not a second copy of the server's command line), then waits for the
    tether's end of file and kills the group (itself too)."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # kept across the exec
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # holds no pipe or log of the server's open
        os.dup2(devnull, fd)
    os.chdir("/")
    try:
        os.execv(sys.executable, [sys.executable, "-I", "-S", _SCRIPT, "--watch", str(tether)])
    except OSError:
        _wait_and_kill(tether)  # the same watch, under the server's name


def _wait_and_kill(tether: int) -> None:
    while os.read(tether, 64):
        pass
    os.killpg(0, signal.SIGKILL)


def _shim(argv: list[str]) -> None:
    """Run as a script: `TETHER_FD REPORT_FD -- COMMAND...`."""
    tether, report, command = int(argv[0]), int(argv[1]), argv[3:]
    os.set_inheritable(report, False)  # closed by the exec: the parent's end of file
    watchdog = os.fork()
    if watchdog == 0:
        try:
            os.close(report)
            if os.fork() == 0:
                _watch(tether)
        finally:
            os._exit(0)
    os.waitpid(watchdog, 0)
    os.close(tether)
    for name in _RESTORED:
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    try:
        os.execvp(command[0], command)
    except OSError as e:
        os.write(report, str(e.errno or 0).encode())
        os.killpg(0, signal.SIGKILL)


if __name__ == "__main__":
    if sys.argv[1] == "--watch":
        _wait_and_kill(int(sys.argv[2]))
    else:
        _shim(sys.argv[1:])
