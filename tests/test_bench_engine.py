"""The no-URL path: `latlab bench` starts the embedded engine, runs, and stops it."""

import socket
import threading
import time
from urllib.parse import urlparse

import psutil
import pytest
from typer.testing import CliRunner

from latlab.cli import app
from latlab.load import BenchError
from latlab.load.target.launch import EngineError, ServerLaunch, embedded_engine, start_server
from latlab.records.bench import BenchConfig
from latlab.records.folder import RunFolder
from latlab.records.lengths import LengthDistribution
from latlab.records.workload import WorkloadConfig
from latlab.services.bench import run_bench

pytest.importorskip("torch")

TINY = "--model tiny --max-model-len 1024"


def refused(url: str) -> bool:
    u = urlparse(url)
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((u.hostname, u.port)) != 0


def test_bench_without_url_runs_the_embedded_engine_and_stops_it(tmp_path):
    result = CliRunner().invoke(app, ["bench", "--serve-args", TINY, "--requests", "8",
                                      "--prompt-tokens", "24", "--output-tokens", "6",
                                      "--out", str(tmp_path), "--no-progress"])
    assert result.exit_code == 0, result.output
    (path,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    run = RunFolder.open(path)
    config = run.read_config()
    assert config.target.embedded and config.target.engine_ready_s > 0
    assert config.bench.serve_args == TINY.split()
    records = run.read_records()
    assert len(records) == 8 and all(r.ok for r in records)
    assert all(r.completion_tokens == 6 and r.prompt_tokens == 24 for r in records)
    assert all(r.server is not None and r.server.total is not None for r in records)
    assert "ready on" in (path / "engine.log").read_text()
    assert refused(config.target.url)


def test_an_engine_that_cannot_start_is_a_clear_failure(tmp_path):
    cli = CliRunner()
    result = cli.invoke(app, ["bench", "--serve-args", "--model /nonexistent/model",
                              "--requests", "3", "--out", str(tmp_path)])
    assert result.exit_code == 1
    assert "latlab serve exited" in result.output and "/nonexistent/model" in result.output
    (path,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert "/nonexistent/model" in RunFolder.open(path).read_config().failed
    report = cli.invoke(app, ["report", str(path)])
    assert report.exit_code == 1 and "did not start" in report.output
    runs = cli.invoke(app, ["runs", "--runs-dir", str(tmp_path), "--rescan"])
    assert "did not start" in runs.output


def test_the_workload_is_fitted_to_the_servers_context(tmp_path):
    """A server that lists a 48-token context: output is shortened to fit, and prompts that
    cannot fit stop the run before anything is sent."""
    with embedded_engine(["--model", "tiny", "--max-model-len", "48"],
                         log_path=tmp_path / "engine.log", ready_timeout_s=60) as engine:
        def bench(prompt: int) -> tuple:
            config = BenchConfig(url=engine.url + "/v1", requests=6, out=tmp_path, workload=(
                WorkloadConfig(prompt_tokens=LengthDistribution(kind="fixed", a=prompt),
                               output_tokens=LengthDistribution(kind="fixed", a=30))))
            return run_bench(config), config
        fitted, config = bench(30)
        records = fitted.run.read_records()
        assert config.url == engine.url  # the OpenAI base URL's /v1 is dropped
        assert fitted.run.read_config().target.max_model_len == 48
        assert all(r.ok and r.fitted and r.max_tokens == 48 - 30 - 1 for r in records)
        assert any("6 of 6 requests asked for fewer output tokens" in w
                   for w in fitted.summary.warnings)
        with pytest.raises(BenchError, match="no room for output in the server's context of 48"):
            bench(60)
        (folder,) = [p for p in tmp_path.iterdir() if p.is_dir() and p != fitted.run.path]
        assert not (folder / "requests.jsonl").exists()
        assert "no room for output" in RunFolder.open(folder).read_config().failed


def test_start_and_stop_the_engine(tmp_path):
    engine = start_server(ServerLaunch.embedded(TINY.split()), log_path=tmp_path / "engine.log",
                          ready_timeout_s=60)
    try:
        assert engine.alive and engine.ready_s > 0 and not refused(engine.url)
    finally:
        code = engine.stop()
    assert not engine.alive and code is not None
    assert refused(engine.url)


def test_engine_error_carries_the_log_tail(tmp_path):
    with pytest.raises(EngineError, match="exited with code") as e:
        with embedded_engine(["--no-such-option"], log_path=tmp_path / "engine.log",
                             ready_timeout_s=60):
            pass
    assert "no-such-option" in str(e.value)


def kill_engine_after_first_record(root) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if any(p.stat().st_size for p in root.glob("*/requests.jsonl")):
            for child in psutil.Process().children():
                if any(part.endswith("serve") for part in child.cmdline()):
                    child.kill()
            return
        time.sleep(0.05)


def test_an_engine_dying_mid_run_is_reported_and_the_folder_stays_valid(tmp_path):
    killer = threading.Thread(target=kill_engine_after_first_record, args=(tmp_path,))
    killer.start()
    config = BenchConfig(serve_args=TINY.split(), duration_s=30.0, out=tmp_path,
                         workload=WorkloadConfig(
                             prompt_tokens=LengthDistribution(kind="fixed", a=16),
                             output_tokens=LengthDistribution(kind="fixed", a=4)))
    result = run_bench(config)
    killer.join()
    records = result.run.read_records()
    assert result.failed and "the embedded engine exited" in result.message, result.message
    assert any(r.ok for r in records) and any(not r.ok for r in records), \
        [(r.outcome, r.error) for r in records]
    assert result.run.read_summary().failures


def test_scraping_the_engines_metrics_during_a_run(tmp_path):
    config = BenchConfig(serve_args=TINY.split(), duration_s=2.0, out=tmp_path,
                         scrape_interval_s=0.1,
                         workload=WorkloadConfig(
                             prompt_tokens=LengthDistribution(kind="fixed", a=16),
                             output_tokens=LengthDistribution(kind="fixed", a=8)))
    result = run_bench(config)
    scrapes = result.run.read_scrapes()
    assert len(scrapes) >= 5
    assert all(set(s.values) >= {"running", "waiting", "kv_usage", "preemptions"} for s in scrapes)
    assert max(s.values["running"] for s in scrapes) >= 1
    assert "latlab_engine_steps_total" in scrapes[-1].raw
    assert "kv_cache_full" not in {u.rule for u in result.analysis.unevaluated}
    page = result.run.report_path.read_text()
    assert "the server's own view (\\u002fmetrics)" in page  # plotly escapes the slash
