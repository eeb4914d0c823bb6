"""`run_bench` end to end against in-test servers: the run folder, windows, failures, workers."""

import math
import signal
import subprocess
import sys
import threading
import time

import orjson
import pytest
from sse_server import DONE, Server, Step, completion, status, stream, usage_only

from latlab.load import BenchError
from latlab.records.arrivals import ArrivalConfig
from latlab.records.bench import BenchConfig
from latlab.records.folder import RunFolder
from latlab.records.lengths import LengthDistribution
from latlab.records.timeline import Outcome
from latlab.records.window import run_window
from latlab.records.workload import WorkloadConfig
from latlab.services.bench import run_bench

SMALL = WorkloadConfig(prompt_tokens=LengthDistribution(kind="fixed", a=8),
                       output_tokens=LengthDistribution(kind="fixed", a=3))


def three_tokens(delay_s: float = 0.0) -> list[Step]:
    return [Step(delay_s, completion("a", {"prompt_tokens": 8, "completion_tokens": 1})),
            Step(0.002, completion("b", {"prompt_tokens": 8, "completion_tokens": 2})),
            Step(0.002, completion("c", {"prompt_tokens": 8, "completion_tokens": 3})),
            Step(0, usage_only(8, 3, {"queue": 0.1, "total": 5.0})), Step(0, DONE)]


def config(url: str, tmp_path, **kw) -> BenchConfig:
    fields = dict(url=url, workload=SMALL, out=tmp_path, duration_s=None, requests=30,
                  warmup_s=0, cooldown_s=0)  # every request measured (a duration's default
    #                                            warm-up would leave out the first ones)
    return BenchConfig(**(fields | kw))


def test_run_folder_holds_config_records_and_summary(tmp_path):
    with Server(stream(three_tokens(0.01))) as server:
        result = run_bench(config(server.url, tmp_path, slos={"ttft": 5000.0},
                                  arrivals=ArrivalConfig(users=3)))
        received = server.received
    assert not result.failed and result.message is None
    run = RunFolder.open(result.run.path)
    cfg = run.read_config()
    assert cfg.target.model_dump(exclude_none=True, exclude={"rtt_ms"}) == {
        "url": server.url, "model": "fake-model", "embedded": False, "api_key_given": False,
        "server_kind": "openai"}
    assert 0 < cfg.target.rtt_ms < 1000  # the null request's round trip before the run
    assert cfg.bench.requests == 30 and cfg.bench.arrivals.users == 3
    clock = cfg.clock
    assert clock.t0_ns >= clock.perf_counter_ns and clock.unix_time > 1.6e9
    records = run.read_records()
    assert sorted(r.index for r in records) == list(range(30)) == sorted(
        int(h["headers"]["X-Request-Id"].rsplit("-", 1)[1]) for h in received)
    assert all(r.ok and r.token_counts == [1, 1, 1] and r.completion_tokens == 3 for r in records)
    assert all(r.scheduled_ns >= clock.t0_ns and r.server.total == 5.0 for r in records)
    summary = run.read_summary()
    assert summary == result.summary
    assert summary.requests == summary.ok == 30
    assert summary.latency["ttft"].n == 30 and summary.latency["itl"].n == 60
    assert summary.latency["ttft"].min >= 10.0
    assert summary.goodput.good == 30
    client = summary.client
    assert client.workers == 1 and isinstance(client.bottleneck, bool)
    assert client.loop_lag_ms.p99 is not None and client.cpu_percent.mean > 0
    assert summary.stop_reason == "requests"


def test_warmup_and_cooldown_are_kept_in_records_but_not_in_statistics(tmp_path):
    with Server(stream(three_tokens())) as server:
        result = run_bench(config(server.url, tmp_path, requests=None, duration_s=1.5,
                                  warmup_s=0.5, cooldown_s=0.5,
                                  arrivals=ArrivalConfig(process="constant", rate=20.0)))
    run = result.run
    records = run.read_records()
    cfg = run.read_config()
    t0 = cfg.clock.t0_ns
    assert cfg.clock.end_ns == t0 + 1_500_000_000
    assert len(records) == 30  # 20/s for 1.5 s, every one recorded
    window = run_window(cfg, records)
    assert (window.start_ns, window.end_ns) == (t0 + 500_000_000, t0 + 1_000_000_000)
    assert result.summary.in_window == 10  # scheduled at 0.50, 0.55, ..., 0.95 s
    assert result.summary.throughput.offered_rate == pytest.approx(20.0)
    assert result.summary.window.seconds == pytest.approx(0.5)


def test_failures_are_recorded_by_class_and_adjust_the_percentiles(tmp_path):
    calls = []

    async def mixed(request):
        calls.append(1)
        handler = status(429) if len(calls) % 4 == 0 else stream(three_tokens())
        return await handler(request)

    with Server(mixed) as server:
        result = run_bench(config(server.url, tmp_path, requests=40,
                                  arrivals=ArrivalConfig(users=1)))
    records = result.run.read_records()
    failed = [r for r in records if not r.ok]
    assert len(records) == 40 and len(failed) == 10
    assert {r.outcome for r in failed} == {Outcome.HTTP_429}
    s = result.summary
    assert s.failures == {"http_429": 10} and s.ok == 30
    adjusted = s.failure_adjusted["ttft"]
    assert adjusted.n == 40 and adjusted["p90"] == math.inf
    assert s.latency["ttft"].n == 30
    assert not result.failed


def test_a_target_that_fails_every_request_stops_early_and_fails_the_run(tmp_path):
    with Server(stream([Step(0, None)])) as server:  # lists its model, drops every request
        result = run_bench(config(server.url, tmp_path, requests=None, duration_s=30.0,
                                  arrivals=ArrivalConfig(users=2)))
    records = result.run.read_records()
    assert result.failed and "of the" in result.message
    assert "requests sent so far failed" in result.message
    assert 10 <= len(records) <= 22  # 90% of those sent, two of them still in flight
    (outcome,) = {r.outcome for r in records}
    assert not outcome == Outcome.OK
    assert result.summary.failures[str(outcome)] == len(records)
    assert result.summary.stop_reason == "aborted"
    assert result.run.summary_path.is_file()


def test_an_unreachable_target_does_not_start(tmp_path):
    with Server(status(200)) as server:
        url = server.url
    with pytest.raises(BenchError, match=f"cannot reach {url}"):
        run_bench(config(url, tmp_path, model="m"))
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert "cannot reach" in RunFolder.open(folder).read_config().failed


def test_unauthorized_is_a_failed_run_with_its_records(tmp_path):
    with Server(status(401, {"error": {"message": "bad key"}})) as server:
        result = run_bench(config(server.url, tmp_path, api_key="wrong"))
        assert server.received[0]["headers"]["Authorization"] == "Bearer wrong"
    records = result.run.read_records()
    assert result.failed and all(r.outcome == Outcome.HTTP_4XX for r in records)
    assert "bad key" in records[0].error
    assert "wrong" not in result.run.config_path.read_text()  # the key is not written


def test_a_server_dying_mid_run_keeps_what_finished(tmp_path):
    server = Server(stream(three_tokens(0.005)))
    server.__enter__()
    killer = threading.Timer(0.8, server.__exit__)
    killer.start()
    try:
        result = run_bench(config(server.url, tmp_path, requests=None, duration_s=20.0,
                                  arrivals=ArrivalConfig(users=2)))
    finally:
        killer.join()
    records = result.run.read_records()
    outcomes = {r.outcome for r in records}
    assert Outcome.OK in outcomes and len(outcomes) > 1
    # by whichever rule comes first: 200 in a row, or 90% of what was sent
    assert result.failed and "stopped early" in result.message
    assert result.summary.ok == sum(r.ok for r in records) > 0


def test_workers_share_one_schedule_and_one_file(tmp_path):
    with Server(stream(three_tokens())) as server:
        result = run_bench(config(server.url, tmp_path, requests=40, workers=2,
                                  arrivals=ArrivalConfig(process="constant", rate=80.0)))
    records = result.run.read_records()
    assert sorted(r.index for r in records) == list(range(40))
    assert {r.worker for r in records} == {0, 1}
    assert all(r.worker == r.index % 2 for r in records)
    t0 = result.run.read_config().clock.t0_ns
    assert sorted(r.scheduled_ns - t0 for r in records) == [int(i / 80.0 * 1e9) for i in range(40)]
    client = result.summary.client
    assert client.workers == 2 and len(client.cpu_percent.per_process) == 2


def interrupt_after_first_record(root) -> None:
    """Ctrl-C (SIGINT to this process) once a run under `root` has written a record."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if any(p.stat().st_size for p in root.glob("*/requests.jsonl")):
            time.sleep(0.2)
            signal.raise_signal(signal.SIGINT)
            return
        time.sleep(0.05)


def test_ctrl_c_keeps_finished_records_and_writes_a_summary(tmp_path):
    slow = [Step(0, completion("a")), Step(0.3, usage_only(8, 1)), Step(0, DONE)]
    with Server(stream(slow)) as server:
        threading.Thread(target=interrupt_after_first_record, args=(tmp_path,)).start()
        result = run_bench(config(server.url, tmp_path, requests=None, duration_s=20.0,
                                  arrivals=ArrivalConfig(users=2)))
    records = result.run.read_records()
    assert result.summary.stop_reason == "interrupted"
    assert {r.outcome for r in records} == {Outcome.OK, Outcome.CANCELLED}
    assert 1 <= sum(r.outcome == Outcome.CANCELLED for r in records) <= 2
    assert result.run.summary_path.is_file()
    assert any("interrupted" in w for w in result.summary.warnings)
    # the window is what ran, up to the Ctrl-C; what it cancelled is not the server's failure
    interrupted_at = result.run.read_config().clock.end_ns
    assert max(r.done_ns for r in records if r.ok) <= interrupted_at
    assert interrupted_at <= min(r.done_ns for r in records if r.outcome == Outcome.CANCELLED)
    s = result.summary
    assert s.failures == {} and s.ok > 0 and s.cancelled >= 1
    assert s.throughput.achieved_rate > 0 and s.ok + s.cancelled == s.in_window
    assert any("cancelled when the run was interrupted" in w for w in s.warnings)


def test_a_partial_run_folder_recomputes_its_window(tmp_path):
    with Server(stream(three_tokens())) as server:
        result = run_bench(config(server.url, tmp_path, requests=10))
    cfg = result.run.read_config()
    records = result.run.read_records()
    window = run_window(cfg, records)
    assert window.start_ns == cfg.clock.t0_ns
    assert window.end_ns == max(r.done_ns for r in records) + 1
    assert not math.isnan(window.duration_s)


def test_the_load_generator_does_not_import_torch():
    code = ("import sys, latlab.load.generator, latlab.commands.bench, latlab.report.console\n"
            "import latlab.commands.sweep, latlab.commands.coldstart, latlab.analysis.compare\n"
            "import latlab.report.html, latlab.report.sweep, latlab.store\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n"
            "assert not any(m.startswith('latlab.engine') "
            "for m in sys.modules)\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_summary_json_is_plain_json(tmp_path):
    with Server(stream(three_tokens())) as server:
        result = run_bench(config(server.url, tmp_path, requests=5))
    assert orjson.loads(result.run.summary_path.read_bytes())["ok"] == 5
