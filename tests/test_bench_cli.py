"""`latlab bench` from the command line against an in-test server."""

import json
import subprocess
import sys

import pytest
from sse_server import DONE, Server, Step, completion, status, stream, usage_only
from typer.testing import CliRunner

from latlab.cli import app
from latlab.records.folder import RunFolder
from latlab.store import RunStore

STEPS = [Step(0.005, completion("a", {"prompt_tokens": 8, "completion_tokens": 1})),
         Step(0.002, completion("b", {"prompt_tokens": 8, "completion_tokens": 2})),
         Step(0, usage_only(8, 2)), Step(0, DONE)]


def bench(*args: str):
    return CliRunner().invoke(app, ["bench", *args])


def only_run(root) -> RunFolder:
    (path,) = [p for p in root.iterdir() if p.is_dir()]
    return RunFolder.open(path)


def test_json_output_exit_code_and_run_folder(tmp_path):
    with Server(stream(STEPS)) as server:
        done = subprocess.run(
            [sys.executable, "-m", "latlab", "bench", "--url", server.url, "--requests", "24",
             "--rate", "60", "--prompt-tokens", "fixed:16", "--output-tokens", "2",
             "--slo", "ttft=2s", "--tenant", "a:2", "--tenant", "b", "--priority", "1",
             "--out", str(tmp_path), "--name", "cli test", "--json"],
            capture_output=True, text=True, timeout=120)
        bodies = [r["body"] for r in server.received]
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    run = only_run(tmp_path)
    assert summary["run"] == str(run.path) and run.path.name.endswith("cli-test")
    assert summary["ok"] == summary["requests"] == 24
    assert summary["goodput"]["slos"] == {"ttft": 2000.0}
    assert set(summary["client"]) >= {"loop_lag_ms", "cpu_percent", "lateness_p99_ms",
                                      "workers", "zero_gap_share", "bottleneck", "reasons"}
    assert {b["user"] for b in bodies} == {"a", "b"} and {b["priority"] for b in bodies} == {1}
    assert all(b["max_tokens"] == 2 for b in bodies)
    config = run.read_config()
    assert "--rate 60" in config.command and config.bench.arrivals.process == "poisson"
    assert len(run.read_records()) == 24
    assert summary["findings"] is not None and run.report_path.is_file()
    with RunStore(tmp_path) as store:
        assert [r.path for r in store.list()] == [run.path.resolve()]


def test_the_summary_table(tmp_path):
    with Server(stream(STEPS)) as server:
        result = bench("--url", server.url, "--requests", "12", "--users", "2",
                       "--out", str(tmp_path), "--no-progress")
    assert result.exit_code == 0, result.output
    for text in ("TTFT", "from schedule", "TPOT", "ITL", "E2E", "p99.9", "throughput",
                 "2 closed-loop users sent", "client"):
        assert text in result.output
    run = only_run(tmp_path)
    assert str(run.path) in result.output.replace("\n", "")
    last = result.stdout.strip().splitlines()[-1]  # piped: the run in one line, at the end
    assert last.startswith("12 of 12 ok · TTFT p50") and last.endswith(str(run.path))
    table = [line for line in result.stdout.splitlines() if not line.startswith("!")]
    assert max(map(len, table)) <= 120 + len(str(run.path))  # warnings: whole sentences


@pytest.mark.parametrize("args,fragment", [
    (["--rate", "-2"], "--rate -2.0: Input should be greater than 0"),
    (["--rate", "2", "--arrival", "weibull"], "--arrival 'weibull'"),
    (["--prompt-tokens", "zipf:2"], "--prompt-tokens 'zipf:2': unknown distribution"),
    (["--slo", "ttft=fast"], "--slo: bad SLO"),
    (["--slo", "latency=200ms"], "unknown metric 'latency'"),
    (["--dataset", "/nonexistent/data.jsonl"], "--dataset /nonexistent/data.jsonl: cannot read"),
    (["--trace", "/nonexistent/trace.jsonl"], "--trace /nonexistent/trace.jsonl: cannot read"),
    (["--users", "2", "--rate", "3"], "exclude each other"),
    (["--duration", "2", "--warmup", "2"], "leave nothing of --duration"),
    (["--workers", "0"], "--workers 0"),
    (["--workers", "many"], "--workers 'many': expected a count or auto"),
    (["--workers", "65"], "--workers 65: at most 64 processes on one machine"),
    (["--tenant", "a:heavy"], "--tenant 'a:heavy'"),
    (["--prefix-fraction", "1.5"], "--prefix-fraction 1.5"),
    (["--url", "localhost:8000"], "--url 'localhost:8000'"),
    (["--users", "0"], "--users 0: Input should be greater than or equal to 1"),
    (["--rate", "2", "--burstiness", "0"], "--burstiness 0.0: Input should be greater than 0"),
    (["--rate", "inf"], "--rate inf sends every request at once: bound it with --requests"),
    (["--server-kind", "triton"], "--server-kind 'triton'"),
    (["--api", "grpc"], "--api 'grpc'"),
])
def test_bad_options_fail_before_any_load(tmp_path, args, fragment):
    with Server(stream(STEPS)) as server:
        url = [] if "--url" in args else ["--url", server.url]
        result = bench(*url, *args, "--out", str(tmp_path))
        assert server.received == []
    assert result.exit_code == 2
    assert fragment in result.output.replace("\n", " ")
    assert "Traceback" not in result.output


def test_unreachable_target_is_a_run_that_did_not_start(tmp_path):
    with Server(status(200)) as server:
        url = server.url
    result = bench("--url", url, "--model", "m", "--requests", "50", "--out", str(tmp_path))
    assert result.exit_code == 1
    assert f"cannot reach {url}" in result.output
    run = only_run(tmp_path)
    assert "cannot reach" in run.read_config().failed and not run.read_records()


def test_an_unreachable_target_says_so_not_give_model(tmp_path):
    with Server(status(200)) as server:
        url = server.url
    result = bench("--url", url, "--requests", "5", "--out", str(tmp_path))
    assert result.exit_code == 1 and f"cannot reach {url}" in result.output
    assert "give --model" not in result.output and "Traceback" not in result.output


def test_a_server_without_a_model_list_asks_for_model(tmp_path):
    with Server(status(200), model=None) as server:
        result = bench("--url", server.url, "--requests", "5", "--out", str(tmp_path))
        assert server.received == []
    assert result.exit_code == 1 and "lists no model: give --model NAME" in result.output


def test_wrong_model_name_is_a_failed_run(tmp_path):
    with Server(status(404, {"error": {"message": "model 'nope' does not exist"}})) as server:
        result = bench("--url", server.url, "--model", "nope", "--requests", "5",
                       "--out", str(tmp_path))
    assert result.exit_code == 1
    assert "every request failed" in result.output and "does not exist" in result.output


def test_slow_results_are_not_a_failure(tmp_path):
    slow = [Step(0.3, completion("a")), Step(0, usage_only(8, 1)), Step(0, DONE)]
    with Server(stream(slow)) as server:
        result = bench("--url", server.url, "--requests", "4", "--users", "4",
                       "--slo", "ttft=1ms", "--out", str(tmp_path), "--json")
    assert result.exit_code == 0
    assert json.loads(result.stdout)["goodput"]["good"] == 0


def test_explain_prints_every_formula():
    result = bench("--explain")
    assert result.exit_code == 0
    for name in ("ttft_sched", "tpot", "itl", "chunk_gap", "goodput", "failure_adjusted"):
        assert name in result.output


def test_the_bench_command_does_not_import_torch(tmp_path):
    with Server(stream(STEPS)) as server:
        code = ("import sys\nfrom typer.testing import CliRunner\nfrom latlab.cli import app\n"
                f"r = CliRunner().invoke(app, ['bench', '--url', '{server.url}', '--requests', "
                f"'3', '--out', r'{tmp_path}'])\n"
                "assert r.exit_code == 0, r.output\n"
                "assert 'torch' not in sys.modules, 'torch imported'\n")
        subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_the_embedded_engines_checkpoint_tokenizer_counts_the_prompts(tmp_path):
    from latlab.tokenizer import Tokenizer

    checkpoint = Tokenizer.load(None).save_pretrained(tmp_path / "checkpoint")
    out = tmp_path / "runs"
    result = bench("--serve-args", f"--model {checkpoint}", "--requests", "2", "--out", str(out))
    assert result.exit_code == 1  # a folder with only a tokenizer is no model: serve refuses it
    assert only_run(out).read_config().bench.workload.tokenizer == str(checkpoint)


def test_workers_auto_picks_a_count_from_the_offered_load(tmp_path):
    with Server(stream(STEPS)) as server:
        result = bench("--url", server.url, "--requests", "6", "--rate", "30", "--workers",
                       "auto", "--output-tokens", "2", "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert "--workers auto: 1 for about 60 token events/s offered" in result.output
    run = only_run(tmp_path)
    assert run.read_config().bench.workers == 1 and len(run.read_records()) == 6


def test_serve_args_read_as_latlab_serve_reads_them():
    """--serve-args (bench, sweep, ab, calibrate, predict) take latlab serve's options: a
    repeatable option keeps every value, --no-X turns a flag off, a wrong one is named."""
    from latlab.commands.common import UsageError
    from latlab.commands.options import parse_args
    from latlab.records.engine import ServeConfig

    o = parse_args(ServeConfig, ["--allow-origin", "a", "--allow-origin=b",
                                 "--no-chunked-prefill", "--max-num-seqs", "8"], "--serve-args")
    assert (o.allow_origins, o.engine.enable_chunked_prefill, o.engine.max_num_seqs) == (
        ["a", "b"], False, 8)
    with pytest.raises(UsageError, match="--serve-args: .*--no-such"):
        parse_args(ServeConfig, ["--no-such"], "--serve-args")
    with pytest.raises(UsageError, match="--serve-args: .*--max-num-seqs"):
        parse_args(ServeConfig, ["--max-num-seqs", "x"], "--serve-args")
