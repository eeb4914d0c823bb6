"""A server latlab starts dies with latlab however latlab dies: SIGKILLed (no cleanup runs),
or stopped by SIGTERM or Ctrl-C (its cleanup stops the server). Tested with real processes: a
small driver (as latlab) starts a server, the test signals the driver and watches the
server's PIDs, for any command (a shell, `sleep`, latlab serve, a fake HTTP server)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from processes import alive

from latlab.load.target.launch import ServerLaunch, launched, spawn_server

SERVER = Path(__file__).with_name("coldstart_server.py")
TEMPLATE = f"{shlex.quote(sys.executable)} {SERVER} --port {{port}} {{args}}"
GONE_WITHIN_S = 15.0
# the tests read processes, their groups and signal masks from /proc (Linux's)
pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="no /proc")

# latlab, as far as a server can tell: it starts one and waits, printing the server's PID
DRIVER = """
import json, sys, time
from pathlib import Path
from latlab.load.target.interrupts import interrupt_on_sigterm
from latlab.load.target.launch import ServerLaunch, launched, spawn_server

how, command, log = json.loads(sys.argv[1])
interrupt_on_sigterm()
if how == "spawn":
    server = spawn_server(ServerLaunch(tuple(command), "http://127.0.0.1:9",
                                       "http://127.0.0.1:9/", "srv"), log_path=Path(log))
    print(server.process.pid, flush=True)
    time.sleep(120)
else:
    with launched(ServerLaunch.templated(command, ["--pidfile", log + ".pids"],
                                         ready_path="/health"), log_path=Path(log)) as server:
        print(server.process.pid, flush=True)
        time.sleep(120)
"""


def gone(pid: int) -> bool:
    """No such process, or only its zombie (waiting for whoever adopted it to reap it)."""
    return not alive(pid)


def group_of(pgid: int) -> list[int]:
    """The live processes of process group `pgid`."""
    members = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(proc.name))
    return members


def wait_gone(pids: list[int]) -> list[int]:
    deadline = time.monotonic() + GONE_WITHIN_S
    while any(not gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if not gone(p)]


def wait_for(found, within_s: float = GONE_WITHIN_S):
    """`found()` once it is not empty (the watchdog execs itself a moment after the fork)."""
    deadline = time.monotonic() + within_s
    while not (result := found()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert result
    return result


def start_driver(how: str, command: object, log: Path) -> tuple[subprocess.Popen, int]:
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, json.dumps([how, command,
                                                                          str(log)])],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    line = driver.stdout.readline()
    assert line.strip().isdigit(), driver.stderr.read().decode()
    return driver, int(line)


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        if not gone(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("server", ["a shell and its child", "latlab serve"])
def test_a_sigkilled_latlab_takes_its_server_group_with_it(server, tmp_path):
    children = tmp_path / "children"
    command = (["sh", "-c", f"sleep 300 & echo $! > {children}; exec sleep 301"]
               if server == "a shell and its child"
               else [sys.executable, "-m", "latlab.commands.serve", "--model", "tiny"])
    driver, leader = start_driver("spawn", command, tmp_path / "server.log")
    group: list[int] = []
    try:
        if server == "a shell and its child":
            deadline = time.monotonic() + 30
            while not (children.exists() and children.read_text().strip()) and \
                    time.monotonic() < deadline:
                time.sleep(0.05)
            assert int(children.read_text()) in group_of(leader)
        group = group_of(leader)
        assert leader in group and len(group) >= 2  # the server and the tether's watchdog
        driver.kill()
        driver.wait(10)
        assert wait_gone(group) == [], "the server group outlived a SIGKILLed latlab"
    finally:
        kill_all([driver.pid, *group])
        driver.wait()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_or_ctrl_c_of_latlab_stops_its_server(sig, tmp_path):
    driver, leader = start_driver("launched", TEMPLATE, tmp_path / "server.log")
    group = group_of(leader)
    try:
        assert leader in group
        driver.send_signal(sig)
        assert driver.wait(30) != 0
        assert wait_gone(group) == []
    finally:
        kill_all([driver.pid, *group])
        driver.wait()


def test_the_started_pid_is_the_commands_own_and_it_gets_default_signals(tmp_path):
    """No wrapper between latlab and the server: its PID runs the command (exit code and
    signals reach it), and it does not inherit Python's ignored SIGPIPE; the watchdog does
    not show as a second copy of the command."""
    launch = ServerLaunch(("sleep", "60"), "http://127.0.0.1:9", "http://127.0.0.1:9/", "srv")
    server = spawn_server(launch, log_path=tmp_path / "s.log")
    try:
        cmdline = Path(f"/proc/{server.process.pid}/cmdline").read_bytes()
        assert cmdline.split(b"\0")[:2] == [b"sleep", b"60"]
        status = Path(f"/proc/{server.process.pid}/status").read_text()
        ignored = int(next(x for x in status.splitlines() if x.startswith("SigIgn:")).split()[1],
                      16)
        assert not ignored & (1 << (signal.SIGPIPE - 1))
        group = group_of(server.process.pid)
        watchdog = wait_for(lambda: [p for p in group_of(server.process.pid)
                                     if b"--watch" in Path(f"/proc/{p}/cmdline").read_bytes()])
        assert b"sleep" not in Path(f"/proc/{watchdog[0]}/cmdline").read_bytes()
        group = group_of(server.process.pid)
    finally:
        assert server.stop() == -signal.SIGTERM
    assert wait_gone(group) == []  # the watchdog too


def test_a_server_that_exits_by_itself_leaves_nothing_after_its_stop(tmp_path):
    launch = ServerLaunch.templated(f"{shlex.quote(sys.executable)} -c 'import sys; "
                                    "sys.exit(3)' {port}", [])
    server = spawn_server(launch, log_path=tmp_path / "s.log")
    assert server.exited(30) and server.process.returncode == 3
    watchdog = group_of(server.process.pid)
    with launched(ServerLaunch.templated(TEMPLATE, []), log_path=tmp_path / "t.log"):
        pass  # another server's start and stop leave the first one's watchdog alone
    assert len(watchdog) == 1 and not gone(watchdog[0])
    server.stop()
    assert wait_gone(watchdog) == []


def test_a_second_stop_signals_no_group(tmp_path, monkeypatch):
    """Once stopped (its group killed, the tether cut), a server's PID may be another
    process group's: a second stop (a `with` after an explicit one) signals nothing."""
    launch = ServerLaunch(("sleep", "60"), "http://127.0.0.1:9", "http://127.0.0.1:9/", "srv")
    server = spawn_server(launch, log_path=tmp_path / "s.log")
    assert server.stop() == -signal.SIGTERM
    sent = []
    monkeypatch.setattr(os, "killpg", lambda pgid, sig: sent.append((pgid, sig)))
    with server:
        pass
    assert server.stop() == -signal.SIGTERM and sent == []
