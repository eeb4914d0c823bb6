"""The client bounded by its own limits (issue 11): no secret on disk, --duration bounds a run
against a stalled server, an empty answer is a failure, Ctrl-C says so in the exit code."""

import time

import pytest
from processes import interrupted
from sse_server import DONE, Server, Step, completion, stream, usage_only
from typer.testing import CliRunner

from latlab.cli import app
from latlab.records.arrivals import ArrivalConfig
from latlab.records.bench import BenchConfig
from latlab.records.lengths import LengthDistribution
from latlab.records.target import redact
from latlab.records.timeline import Outcome
from latlab.records.workload import WorkloadConfig
from latlab.services.bench import run_bench

SMALL = WorkloadConfig(prompt_tokens=LengthDistribution(kind="fixed", a=8),
                       output_tokens=LengthDistribution(kind="fixed", a=2))


def test_secrets_are_redacted_wherever_a_command_line_goes():
    argv = ["latlab", "bench", "--api-key", "k1", "--api-key=k2",
            "--serve-args", "--model tiny --api-key k3", "--api-key-file", "/run/key"]
    assert redact(argv) == ["latlab", "bench", "--api-key", "***", "--api-key=***",
                            "--serve-args", "--model tiny --api-key ***",
                            "--api-key-file", "/run/key"]


def test_no_secret_reaches_the_run_folder(tmp_path):
    pytest.importorskip("torch")
    secret = "s3cr3t-d0-not-st0re"
    result = CliRunner().invoke(app, ["bench", "--serve-args", f"--model tiny --api-key {secret}",
                                      "--api-key", secret, "--requests", "2", "--users", "1",
                                      "--prompt-tokens", "8", "--output-tokens", "2",
                                      "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "report.html" for p in files)
    for path in files:
        assert secret.encode() not in path.read_bytes(), path


def test_duration_bounds_a_run_against_a_stalled_server(tmp_path):
    stalled = [Step(0, completion("a")), Step(8, usage_only(8, 1)), Step(0, DONE)]
    with Server(stream(stalled)) as server:
        started = time.monotonic()
        result = run_bench(BenchConfig(url=server.url, workload=SMALL, duration_s=1.0,
                                       warmup_s=0, drain_s=0.5, timeout_s=300, out=tmp_path,
                                       arrivals=ArrivalConfig(users=2)))
        took = time.monotonic() - started
    assert took < 6  # not the 8 s stall, not the 300 s timeout: the run's own limit
    records = result.run.read_records()
    assert {r.outcome for r in records} == {Outcome.UNFINISHED}
    assert all("after --duration" in r.error for r in records)
    assert result.summary.failures == {"unfinished": 2}


def test_an_answer_without_a_token_or_usage_is_a_failure(tmp_path):
    empty = [Step(0, b": ping\n\n"), Step(0, DONE)]
    with Server(stream(empty)) as server:
        result = run_bench(BenchConfig(url=server.url, workload=SMALL, requests=3,
                                       duration_s=None, out=tmp_path,
                                       arrivals=ArrivalConfig(users=1)))
    assert result.summary.failures == {"empty": 3} and result.summary.ok == 0


def test_ctrl_c_during_the_load_exits_130_with_the_summary_written(tmp_path):
    slow = [Step(0, completion("a")), Step(0.2, usage_only(8, 1)), Step(0, DONE)]
    with Server(stream(slow)) as server:
        code, _, err = interrupted(
            ["bench", "--url", server.url, "--duration", "30", "--users", "2",
             "--out", str(tmp_path)],
            lambda: any(p.stat().st_size for p in tmp_path.glob("*/requests.jsonl")),
            "the first record")
    assert code == 130, err.decode()
    assert b"interrupted" in err and list(tmp_path.glob("*/summary.json"))
