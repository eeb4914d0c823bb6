"""How the server took the requests: one at a time, none in the window; what a failed run
should try first; advice that depends on whose server it is."""

import orjson
import pytest
from timelines import MS, steady, timeline, write_run
from typer.testing import CliRunner

from latlab.analysis import analyze
from latlab.cli import app
from latlab.records.timeline import Outcome

SERVICE_CONFIG = {"target": {"server_kind": "llamacpp"}}


def serial(n: int = 24, users: int = 3, **config) -> list:
    """A closed loop of `users` against a server that takes one request at a time: each
    request's prefill starts when the one before it is done; answers of varying length."""
    records, free_at, next_at = [], 0.0, [0.0] * users
    for i in range(n):
        at = next_at[i % users]
        received = at + 0.5 + 1.0  # the timeline's upload and preprocess
        r = timeline(i, at, queue=max(0.0, free_at - received), prefill=20.0,
                     tokens=6 + 3 * (i % 4), itl=5.0)
        free_at = next_at[i % users] = r.done_ns / MS
        records.append(r)
    return records


@pytest.fixture
def diagnose(tmp_path):
    def run(records, config=None, **kwargs):
        a = analyze(write_run(tmp_path, records, config=config, **kwargs))
        return {f.rule: f for f in a.findings}, {u.rule: u for u in a.unevaluated}
    return run


def test_a_server_that_takes_one_request_at_a_time(diagnose):
    findings, _ = diagnose(serial(), SERVICE_CONFIG)
    f = findings["one_at_a_time"]
    assert "23 of 23 requests" in f.evidence[0] and "-np N" in f.fix  # llama.cpp's own switch
    assert orjson.loads(orjson.dumps(f.to_json()))["impact"] > 0.5  # `bench --json` prints it
    assert "continuous-batching" in diagnose(serial(), {})[0]["one_at_a_time"].fix


def test_batching_servers_are_not_one_at_a_time(diagnose):
    overlapping = steady(40, gap=20.0, tokens=10, itl=5.0)  # decodes overlap
    # long prefills side by side, two-token answers: each ends before the next one's first
    # token, but a first token does not wait on the one before
    prefills = [timeline(i, i * 5.0, prefill=200.0, tokens=2, itl=1.0) for i in range(40)]
    jittered = [timeline(i, i * 60.0 + (i * 17) % 23, prefill=150.0 + (i * 31) % 40,
                         tokens=2, itl=10.0) for i in range(40)]
    for records in (overlapping, prefills, jittered):
        assert "one_at_a_time" not in diagnose(records)[0]


def test_a_run_with_nothing_in_its_window_is_critical_and_says_how_long_the_first_took(
        diagnose):
    records = [timeline(i, 0.0, queue=30_000.0 + 100 * i) for i in range(4)]  # a cold load
    config = {"warmup_s": 2.0, "cooldown_s": 1.0, "clock": {"t0_ns": 0, "end_ns": 20_000 * MS}}
    findings, _ = diagnose(records, config, summary=False)
    f = findings["nothing_in_window"]
    assert f.severity == 3 and "30.01 s to its first token (a cold load?)" in f.evidence[1]
    assert "nothing_in_window" not in diagnose(steady(20))[0]


def test_a_missing_endpoint_is_not_told_to_fix_its_payload(diagnose):
    failed = [timeline(i, i * 10.0, outcome=Outcome.HTTP_4XX) for i in range(10)]
    for r in failed:
        r.status, r.error = 404, "HTTP 404 Not Found: File Not Found"
    assert "--api" in diagnose(failed)[0]["failures"].fix
    for r in failed:
        r.error = "HTTP 404 Not Found: The model `nope` does not exist."
    assert "--model NAME" in diagnose(failed)[0]["failures"].fix
    for r in failed:
        r.status, r.error = 422, "HTTP 422: Unexpected fields in the request: {'ignore_eos'}"
    assert "--no-ignore-eos" in diagnose(failed)[0]["failures"].fix


def test_the_per_chunk_advice_is_what_that_server_can_do(diagnose, tmp_path):
    from latlab.metrics.summary import RunContext, summarize

    records = steady(10)
    for r in records:
        r.completion_tokens += 1  # one token more than the events carried
    def warnings(kind: str) -> list[str]:
        return summarize(records, context=RunContext(server_kind=kind)).warnings

    advice = {kind: next(w for w in warnings(kind) if "token events" in w)
              for kind in ("llamacpp", "vllm", "openai")}
    assert "timings_per_token" in advice["llamacpp"] and "ask" not in advice["llamacpp"]
    assert "--continuous-usage" in advice["vllm"]
    assert "sends no per-chunk" in advice["openai"]


def test_bench_exits_1_when_nothing_landed_in_the_window(tmp_path):
    from sse_server import DONE, Server, Step, completion, stream, usage_only

    slow = [Step(1.5, completion("a")), Step(0, usage_only(3, 1)), Step(0, DONE)]
    with Server(stream(slow)) as server:
        out = CliRunner().invoke(app, ["bench", "--url", server.url, "--duration", "1",
                                       "--warmup", "0.5", "--cooldown", "0", "--drain", "5",
                                       "--users", "2", "--out", str(tmp_path), "--no-progress"])
    assert out.exit_code == 1, out.output
    assert "no request landed in the measurement window" in out.output
