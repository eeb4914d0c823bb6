"""Any server, launched by template (`--launch "CMD --port {port} {args}"`): latlab picks the
port, fills in the side's arguments, waits until the server is ready, keeps its log in the
run folder and stops its whole process group by PID. Tested with a small fake server command,
and with a real llama-server where one has been built."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from processes import alive
from typer.testing import CliRunner

from latlab.cli import app
from latlab.load.target.launch import EngineError, ServerLaunch
from latlab.records.bench import BenchConfig
from latlab.records.folder import RunFolder
from latlab.services.bench import run_bench

SERVER = Path(__file__).with_name("coldstart_server.py")
TEMPLATE = f"{shlex.quote(sys.executable)} {SERVER} --port {{port}} {{args}}"
LLAMA_SERVER = Path(os.environ.get("LATLAB_LLAMA_SERVER", "/work/build/llama-server"))


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def test_a_template_gets_a_free_port_and_the_sides_arguments():
    launch = ServerLaunch.templated("srv --port {port} --flag {args} --log x-{port}.log",
                                    ["-b", "64", "-ub", "64"], ready_path="/health")
    port = launch.url.rsplit(":", 1)[1]
    assert launch.command == ("srv", "--port", port, "--flag", "-b", "64", "-ub", "64",
                              "--log", f"x-{port}.log")
    assert launch.ready_url == f"{launch.url}/health" and launch.name == "srv"
    with pytest.raises(EngineError, match="has no {args}"):  # the sides would be the same
        ServerLaunch.templated("srv --port {port}", ["-np", "4"])
    assert ServerLaunch.templated("srv --port {port}", []).command[0] == "srv"


def test_bench_measures_a_launched_server_keeps_its_log_and_stops_it(tmp_path):
    pids = tmp_path / "pids"
    config = BenchConfig(launch=TEMPLATE, serve_args=f"--pidfile {pids}", requests=8,
                         users=2, out=tmp_path / "runs")
    result = run_bench(config)
    assert not result.failed, result.message
    run = RunFolder.open(result.run.path)
    target = run.read_config().target
    assert target.launch == TEMPLATE and not target.embedded and result.summary.ok == 8
    assert (run.path / "server.log").is_file()
    leader, child = map(int, pids.read_text().split())
    deadline = time.monotonic() + 10
    while (alive(leader) or alive(child)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(leader) and not alive(child)  # the group, the server's child too


def test_ab_compares_two_settings_of_one_launched_command(tmp_path):
    r = invoke("ab", "--launch", TEMPLATE, "--a", "", "--b", "--idle-after 0 --idle-ms 80",
               "--requests", 12, "--users", 1, "--rounds", 1, "--max-rounds", 1, "--out", tmp_path,
               "--json")
    assert r.exit_code in (0, 1), r.output
    record = orjson.loads(r.stdout[r.stdout.index("{"):])
    folder = Path(record["folder"])
    assert (folder / "server-A-1.log").is_file() and (folder / "server-B-1.log").is_file()
    ttft = next(c for c in record["changes"] if c["key"] == "p50_ttft")
    assert ttft["b"] - ttft["a"] >= 60  # B's 80 ms on every request, measured


@pytest.mark.parametrize("args, message", [
    (["--launch", "srv --port 8000"], "{port}"),
    (["--launch", TEMPLATE, "--url", "http://127.0.0.1:9"], "drop --url"),
])
def test_a_bad_template_is_one_clear_line(args, message, tmp_path):
    r = invoke("bench", *args, "--requests", 1, "--out", tmp_path)
    assert r.exit_code != 0 and message in r.output and "Traceback" not in r.output


def test_a_server_that_never_gets_ready_is_stopped_and_its_log_shown(tmp_path):
    r = invoke("bench", "--launch", f"{shlex.quote(sys.executable)} -c "
               "'import sys,time; print(\"no health here\"); sys.stdout.flush(); "
               "time.sleep(60)' {port}", "--launch-timeout", 2, "--requests", 1,
               "--out", tmp_path)
    assert r.exit_code != 0 and "not ready after 2 s" in r.output
    assert "no health here" in r.output


@pytest.mark.skipif(not LLAMA_SERVER.is_file(), reason=f"no llama-server at {LLAMA_SERVER} "
                    "(build it as scripts/llamacpp.sh says, or set LATLAB_LLAMA_SERVER)")
def test_ab_of_two_llama_server_settings(tmp_path):
    model = tmp_path / "model"
    subprocess.run([sys.executable, "-m", "latlab", "model", "export", str(model), "--model",
                    "tiny", "--gguf"], check=True, capture_output=True, timeout=300)
    template = (f"{LLAMA_SERVER} -m {model / 'model.gguf'} --host 127.0.0.1 --port {{port}} "
                "-t 1 -c 2048 -np 2 --metrics {args}")
    r = invoke("ab", "--launch", template, "--a", "-b 2048 -ub 512", "--b", "-b 64 -ub 64",
               "--requests", 16, "--users", 2, "--prompt-tokens", 400,
               "--output-tokens", "fixed:16", "--rounds", 1, "--max-rounds", 1, "--out", tmp_path,
               "--json")
    assert r.exit_code in (0, 1), r.output
    record = orjson.loads(r.stdout[r.stdout.index("{"):])
    assert {c["key"] for c in record["changes"]} >= {"p50_ttft", "p99_itl"}
    folder = Path(record["folder"])
    assert "-b 64" in (folder / "server-B-1.log").read_text(errors="replace") or \
        (folder / "server-B-1.log").stat().st_size > 0


def test_a_log_in_a_folder_not_made_yet_is_made_and_a_missing_binary_named(tmp_path):
    from latlab.load.target.launch import EngineError, launched

    launch = ServerLaunch.templated(TEMPLATE, [], ready_path="/health")
    with launched(launch, log_path=tmp_path / "new" / "server.log") as server:
        assert server.process.poll() is None
    assert (tmp_path / "new" / "server.log").is_file()
    missing = ServerLaunch.templated(f"{tmp_path}/no-such-server --port {{port}}", [])
    with pytest.raises(EngineError, match="cannot start .*no-such-server"):
        with launched(missing, log_path=tmp_path / "x.log"):
            pass


def test_a_swallowed_ctrl_c_ends_the_wait_for_readiness(tmp_path):
    """A Ctrl-C Python swallowed (remembered, not raised) still ends a wait on a server that
    never gets ready, well before its ready timeout, and the server is stopped."""
    from latlab.load.target import interrupts
    from latlab.load.target import launch as launching

    never = ServerLaunch.templated(f"{shlex.quote(sys.executable)} -c "
                                   "'import time; time.sleep(60)' {port}", [])
    started = time.monotonic()
    with interrupts.remembered_interrupts() as pressed:
        interrupts.PRESSED.append(2)  # as the handler records one whose raise was swallowed
        assert pressed()
        with pytest.raises(KeyboardInterrupt):
            with launching.launched(never, log_path=tmp_path / "s.log", ready_timeout_s=60):
                pass
    assert time.monotonic() - started < 30 and not interrupts.PRESSED  # the outermost forgets


def test_sigterm_during_a_first_calibration_stops_the_probes_server(tmp_path):
    """`latlab calibrate` (as `latlab predict`'s first use) starts the probes' latlab serve
    beside its in-process grid: SIGTERM while the grid runs stops that server as Ctrl-C
    does, not leaves it serving."""
    from latlab.commands.common import EXIT_INTERRUPTED

    env = os.environ | {"TMPDIR": str(tmp_path), "LATLAB_CACHE": str(tmp_path / "cache")}
    command = [sys.executable, "-m", "latlab", "calibrate", "--serve-args", "--model tiny",
               "--out", str(tmp_path / "calibration.json")]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
    servers: list[int] = []
    try:
        for line in process.stderr:
            if b"latlab serve for the probes ready" in line:
                break
        servers = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()
                   and _cmdline(p).startswith(f"{sys.executable} -m latlab.commands.serve ")
                   and str(tmp_path) in _cmdline(p)]
        assert len(servers) == 1, "the probes' latlab serve, its step log under TMPDIR"
        process.send_signal(signal.SIGTERM)
        err = process.stderr.read()
        assert process.wait(60) == EXIT_INTERRUPTED, err.decode()
        assert not alive(servers[0])
    finally:
        for pid in [process.pid, *servers]:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        process.wait()


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_the_servers_latlab_starts_run_latlab_serve_without_the_other_commands_imports():
    """`ServerLaunch.embedded` runs `python -m latlab.commands.serve`: latlab serve's own
    options, none of the CLI's other commands (their imports cost seconds of every start)."""
    launch = ServerLaunch.embedded(["--model", "tiny"])
    assert launch.command[1:3] == ("-m", "latlab.commands.serve")
    help_run = subprocess.run([sys.executable, "-X", "importtime", *launch.command[1:],
                               "--help"], capture_output=True, text=True, timeout=120)
    assert help_run.returncode == 0 and "--max-num-seqs" in help_run.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in help_run.stderr.splitlines()}
    assert "latlab.commands.options" in imported
    assert not {"latlab.cli", "latlab.commands.bench", "latlab.services.predict"} & imported
