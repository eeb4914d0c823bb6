"""Every run folder latlab writes, `latlab report` reads: a burst (`--rate inf`), one
interrupted by SIGTERM, one killed mid-run, one written before infinity was written as "inf";
a torn or malformed line is named; a burst is measured over its own window and is not
stopped by its first fast failures; a refused API key is named as such."""

from __future__ import annotations

import signal
import subprocess
import sys

import orjson
import pytest
from aiohttp import web
from processes import interrupted, wait_until
from sse_server import DONE, Server, Step, completion, status, stream, usage_only
from typer.testing import CliRunner

from latlab.analysis.analyze import analyze
from latlab.cli import app
from latlab.load import BenchError
from latlab.records.arrivals import ArrivalConfig
from latlab.records.bench import BenchConfig
from latlab.records.config import RunConfig
from latlab.records.files import RunFolderError
from latlab.records.folder import RunFolder
from latlab.records.lengths import LengthDistribution
from latlab.records.workload import WorkloadConfig
from latlab.services.bench import run_bench

SMALL = WorkloadConfig(prompt_tokens=LengthDistribution(kind="fixed", a=8),
                       output_tokens=LengthDistribution(kind="fixed", a=2))
SLOW = [Step(0.3, completion("a")), Step(0, usage_only(8, 1)), Step(0, DONE)]


def report(folder) -> str:
    result = CliRunner().invoke(app, ["report", str(folder)])
    assert result.exit_code == 0, result.output
    return result.output


def test_a_burst_is_read_back_measured_over_its_own_window_and_not_stopped_by_fast_429s(
        tmp_path):
    calls = []

    async def mixed(request: web.Request) -> web.StreamResponse:
        calls.append(1)  # the first 12 are turned away at once, the others take 0.3 s
        return await (status(429) if len(calls) <= 12 else stream(SLOW))(request)

    with Server(mixed) as server:
        result = run_bench(BenchConfig(url=server.url, workload=SMALL, requests=40,
                                       out=tmp_path, arrivals=ArrivalConfig(rate=float("inf"))))
    assert result.summary.stop_reason == "requests" and not result.failed
    assert result.summary.failures == {"http_429": 12} and result.summary.ok == 28
    assert b'"rate": "inf"' in result.run.config_path.read_bytes()
    config = result.run.read_config()
    assert config.bench.arrivals.burst and config.warmup_s == config.cooldown_s == 0
    window = analyze(result.run).window
    assert window.duration_s >= 0.3  # to its last request's end, not to the first 429s
    assert "report.html" in report(result.run.path)


def test_a_burst_with_a_warmup_is_refused():
    with pytest.raises(ValueError, match="--warmup would leave out all or none"):
        BenchConfig(url="http://127.0.0.1:9", requests=5, warmup_s=1.0,
                    arrivals=ArrivalConfig(rate=float("inf")))


def test_a_burst_written_with_a_null_rate_is_read_as_one():
    config = RunConfig(bench=BenchConfig(url="http://127.0.0.1:9", requests=5,
                                         arrivals=ArrivalConfig(rate=float("inf"))))
    written = orjson.loads(orjson.dumps(config.model_dump(mode="json")))
    written["bench"]["arrivals"]["rate"] = None  # how latlab wrote infinity before
    assert RunConfig.model_validate(written).bench.arrivals.burst


def test_sigterm_is_named_and_the_run_is_read_back(tmp_path):
    with Server(stream(SLOW)) as server:
        code, out, err = interrupted(
            ["bench", "--url", server.url, "--duration", "30", "--users", "2",
             "--out", str(tmp_path)],
            lambda: any(p.stat().st_size for p in tmp_path.glob("*/requests.jsonl")),
            "the first record", sig=signal.SIGTERM)
    assert code == 130, err.decode()
    assert b"interrupted (SIGTERM)" in out and b"interrupted (Ctrl-C)" not in out
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert "report.html" in report(folder)


def test_a_killed_run_with_a_torn_last_line_is_read_back_and_the_tear_noted(tmp_path):
    with Server(stream(SLOW)) as server:
        process = subprocess.Popen([sys.executable, "-m", "latlab", "bench", "--url",
                                    server.url, "--duration", "30", "--users", "2", "--out",
                                    str(tmp_path)], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        try:
            wait_until(lambda: any(p.stat().st_size for p in tmp_path.glob("*/requests.jsonl")),
                       timeout_s=60, what="the first record")
        finally:
            process.send_signal(signal.SIGKILL)
            process.wait(30)
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    records = folder / "requests.jsonl"
    whole = records.read_bytes()
    records.write_bytes(whole + whole[:40])  # a record cut off mid-write
    assert not (folder / "summary.json").exists()
    output = report(folder / "config.json")  # a file of the run names its folder
    assert "torn line (40 bytes" in output


def test_records_cut_short_beside_their_summary_are_noted(tmp_path):
    """The stored summary counts what the run measured; records lost since (a copy cut
    short, an edit) would make the findings disagree with it without a word."""
    fast = [Step(0, completion("a")), Step(0, usage_only(8, 1)), Step(0, DONE)]
    with Server(stream(fast)) as server:
        result = run_bench(BenchConfig(url=server.url, workload=SMALL, requests=6,
                                       out=tmp_path))
    assert "requests.jsonl holds" not in report(result.run.path)
    records = result.run.path / "requests.jsonl"
    records.write_bytes(records.read_bytes().splitlines(keepends=True)[0])
    output = " ".join(report(result.run.path).split())  # however the console wrapped it
    assert "summary.json counts 6 requests but requests.jsonl holds 1" in output


def test_a_malformed_record_names_its_own_line(tmp_path):
    run = RunFolder.create(tmp_path, "bad")
    good = orjson.dumps({"id": "a", "index": 0}) + b"\n"
    (run.path / "requests.jsonl").write_bytes(good + b'{"id": "b", "index": \n' + good)
    with pytest.raises(RunFolderError, match="line 2: not JSON"):
        run.read_table()
    with pytest.raises(RunFolderError, match="line 2: unreadable"):
        run.read_records()


def test_a_file_that_is_not_a_run_is_named_as_a_file(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("x")
    with pytest.raises(RunFolderError, match="a file, not a run folder"):
        RunFolder.open(path)


@pytest.mark.parametrize("given", [None, "wrong"])
def test_a_refused_api_key_is_named_even_with_model_given(tmp_path, given):
    pytest.importorskip("torch")
    from engine_server import running_server

    with running_server(api_key="right") as s:
        with pytest.raises(BenchError, match="API key") as e:
            run_bench(BenchConfig(url=s.url, model="tiny", api_key=given, requests=2,
                                  workload=SMALL, out=tmp_path))
    assert ("wants an API key" if given is None else "refused the API key") in str(e.value)
    assert "LATLAB_API_KEY" in str(e.value)
