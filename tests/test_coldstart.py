"""`latlab coldstart` against a fake server command with known delays, and once against the
embedded engine: time to ready, cold and idle excess, records, and every started process
stopped — after success, failures and Ctrl-C."""

import shlex
import signal
import socket
import sys
import time
from pathlib import Path

import orjson
import pytest
from processes import alive, interrupted
from sse_server import DONE, Server, Step, completion, stream
from typer.testing import CliRunner

from latlab.analysis.coldstart import spread
from latlab.cli import app
from latlab.load.target.launch import free_port
from latlab.records.folder import RunFolder
from latlab.store import RunStore

SERVER = Path(__file__).with_name("coldstart_server.py")


def fake(port: int, pidfile: Path, *options: str) -> str:
    return shlex.join([sys.executable, str(SERVER), "--port", str(port), "--pidfile",
                       str(pidfile), *options])


def all_gone(pidfile: Path, timeout_s: float = 10.0) -> bool:
    pids = [int(p) for p in pidfile.read_text().split()]
    assert pids, "the fake server wrote no pids"
    deadline = time.monotonic() + timeout_s
    while any(alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def coldstart(*args: str):
    return CliRunner().invoke(app, ["coldstart", *args])


def test_cold_and_idle_excess_over_the_warm_baseline(tmp_path):
    port, pids = free_port(), tmp_path / "pids"
    result = coldstart("--command", fake(port, pids, "--delay", "0.4", "--cold-ms", "300",
                                         "--idle-after", "0.25", "--idle-ms", "150"),
                       "--url", f"http://127.0.0.1:{port}", "--runs", "2",
                       "--warm-requests", "3", "--idle-gaps", "50ms,0.5s",
                       "--out", str(tmp_path / "runs"), "--json")
    assert result.exit_code == 0, result.output
    data = orjson.loads(result.stdout)
    assert len(data["runs"]) == 2 and not data["interrupted"]
    for run in data["runs"]:
        assert run["ready_s"] >= 0.4 and run["error"] is None
        assert run["excess"]["ttft"] > 150 and run["excess"]["e2e"] > 150  # 300 ms cold
        assert run["warm"]["n"] == 3 and run["first"]["ttft"] >= 300
        long_gap = run["idle"][1]
        assert long_gap["gap_s"] == 0.5 and long_gap["excess_ttft"] > 75  # 150 ms after idling
    summary = data["summary"]
    assert summary["excess_ttft"]["n"] == 2
    assert summary["excess_ttft"]["min"] <= summary["excess_ttft"]["median"] \
        <= summary["excess_ttft"]["max"]
    assert [g["gap_s"] for g in data["idle"]] == [0.05, 0.5]

    run = RunFolder.open(data["run"])
    records = run.read_records()
    assert len(records) == 2 * (1 + 3 + 2) and all(r.ok for r in records)
    by_id = {r.id: r for r in records}
    first = by_id[data["runs"][0]["first"]["id"]]
    assert (first.first_token_ns - first.sent_ns) / 1e6 == pytest.approx(
        data["runs"][0]["first"]["ttft"])
    assert len({r.index for r in records}) == len(records)
    assert run.read_config().kind == "coldstart"
    with RunStore(tmp_path / "runs") as store:
        (entry,) = store.list(kind="coldstart")
    assert entry.path == run.path.resolve() and entry.numbers["ok"] == 12
    assert all_gone(pids)  # the server and its child, both runs


def test_a_failure_after_the_start_still_stops_the_process_group(tmp_path):
    port, pids = free_port(), tmp_path / "pids"
    result = coldstart("--command", fake(port, pids, "--no-models"),
                       "--url", f"http://127.0.0.1:{port}",
                       "--ready-url", f"http://127.0.0.1:{port}/health",
                       "--out", str(tmp_path))
    assert result.exit_code == 1 and "give --model NAME" in result.output
    assert all_gone(pids)


def test_a_server_that_never_gets_ready_is_stopped(tmp_path):
    port, pids = free_port(), tmp_path / "pids"
    # 5 s: time for the fake server to start and write its pids on a busy machine
    result = coldstart("--command", fake(port, pids, "--delay", "60"), "--url",
                       f"http://127.0.0.1:{port}", "--ready-timeout", "5", "--out", str(tmp_path))
    assert result.exit_code == 1 and "was not ready after 5 s" in result.output
    assert all_gone(pids)


def test_a_url_already_answering_is_refused_before_anything_starts(tmp_path):
    with Server(stream([Step(0, completion("x")), Step(0, DONE)])) as server:
        result = coldstart("--command", "sleep 60", "--url", server.url, "--out", str(tmp_path))
    assert result.exit_code == 1 and "already answers" in result.output


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_keeps_the_finished_starts_and_stops_the_server(tmp_path, sig):
    """The signal comes once the first start is on disk and while the second, which never gets
    ready, is starting."""
    port, pids = free_port(), tmp_path / "pids"
    command = ["coldstart", "--command", fake(port, pids, "--hang-from", "2"),
               "--url", f"http://127.0.0.1:{port}", "--runs", "3", "--warm-requests", "2",
               "--idle-gaps", "1s", "--out", str(tmp_path / "runs")]

    def second_start_begun() -> bool:
        recorded = list((tmp_path / "runs").glob("*-coldstart-*/coldstart.json"))
        return (len(recorded) == 1 and len(orjson.loads(recorded[0].read_bytes())["runs"]) == 1
                and pids.is_file() and len(pids.read_text().splitlines()) >= 2)

    code, _, err = interrupted(command, second_start_begun,
                               "the first start recorded and the second begun", sig=sig)
    assert code == 130, err.decode()
    (folder,) = (tmp_path / "runs").glob("*-coldstart-*")
    data = orjson.loads((folder / "coldstart.json").read_bytes())
    assert data["interrupted"] and len(data["runs"]) == 1
    assert all_gone(pids)


@pytest.mark.parametrize("args, message", [
    (["--command", "sleep 1"], "--command needs --url"),
    (["--url", "http://127.0.0.1:9"], "go with --command"),
    (["--idle-gaps", "5h"], "--idle-gaps"),
    (["--runs", "0"], "--runs"),
])
def test_bad_coldstart_options_are_named(tmp_path, args, message):
    result = coldstart(*args, "--out", str(tmp_path))
    assert result.exit_code == 2 and message in result.output
    assert not list(tmp_path.iterdir())


def test_spread_over_runs():
    assert spread([3.0, None, 1.0, 2.0]).model_dump() == {"n": 3, "median": 2.0, "min": 1.0,
                                                           "max": 3.0}
    assert spread([None]).model_dump() == {"n": 0, "median": None, "min": None, "max": None}


def test_the_embedded_engine_cold_start(tmp_path):
    pytest.importorskip("torch")
    result = coldstart("--serve-args", "--model tiny --max-model-len 256", "--runs", "1",
                       "--warm-requests", "2", "--idle-gaps", "", "--prompt-tokens", "16",
                       "--output-tokens", "4", "--out", str(tmp_path), "--json")
    assert result.exit_code == 0, result.output
    data = orjson.loads(result.stdout)
    (run,) = data["runs"]
    assert run["ready_s"] > 0 and run["first"]["ok"] and run["warm"]["n"] == 2
    assert run["excess"]["ttft"] is not None and data["idle"] == []
    url = data["target"]["url"]
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", int(url.rsplit(":", 1)[1]))) != 0
    assert (Path(data["run"]) / "server-1.log").read_text()
