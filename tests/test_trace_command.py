"""`latlab trace`: a trace's profile (numbers worked out by hand on a small trace), its page,
its export as Mooncake-style JSONL (a slice, a run's traffic) read back the same; and the
trace's settings on sweep and predict."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from latlab.cli import app
from latlab.load.workload.traces import Trace, window
from latlab.records.arrivals import ArrivalConfig
from latlab.records.bench import BenchConfig
from latlab.records.folder import RunFolder
from latlab.records.sweep import SweepConfig
from latlab.records.timeline import RequestTimeline, SessionStep, TraceStep
from latlab.records.trace import TraceConfig, TraceProfile
from latlab.services.trace import profile_trace

MOONCAKE = Path(__file__).parent / "fixtures" / "traces" / "mooncake.jsonl"


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def test_a_small_traces_profile_as_worked_out_by_hand(tmp_path):
    path = jsonl(tmp_path / "t.jsonl", [
        {"timestamp": 0, "input_length": 1024, "output_length": 10, "hash_ids": [1, 2]},
        {"timestamp": 1000, "input_length": 1500, "output_length": 30, "hash_ids": [1, 2, 3]},
        {"timestamp": 1500, "input_length": 100, "output_length": 20, "hash_ids": [4]},
        {"timestamp": 4000, "input_length": 700, "output_length": 40, "hash_ids": [1, 5]}])
    p = profile_trace(TraceConfig(arrivals=ArrivalConfig(trace=path)))
    assert (p.requests, p.span_s, p.rate) == (4, 4.0, 1.0)
    gaps = [1.0, 0.5, 2.5]
    mean = sum(gaps) / 3
    std = (sum((g - mean) ** 2 for g in gaps) / 3) ** 0.5
    assert p.interarrival_cv == pytest.approx(std / mean)
    assert (p.prompt.mean, p.prompt.max, p.output.p50) == (831.0, 1500.0, 25.0)
    s = p.sharing
    # cached prefixes: request 2 finds blocks 1, 2 (1024 tokens), request 4 block 1 (512)
    assert s.cacheable_share == pytest.approx((1024 + 512) / (1024 + 1500 + 100 + 700))
    assert (s.hit_requests, s.blocks, s.reused_blocks) == (0.5, 5, 2)
    # their deepest cached blocks were last used 1 request (1 s) and 2 requests (3 s) back
    assert (s.reuse_requests_p50, s.reuse_s_p50, s.common_first_share) == (1.5, 2.0, 0.75)
    assert "--prefix-tokens 512 --prefix-fraction 0.75" in " ".join(p.flags)
    half = profile_trace(TraceConfig(arrivals=ArrivalConfig(trace=path, length_scale=0.5)))
    assert half.prompt.max == 750 and half.sharing.block_tokens == 256
    assert half.sharing.cacheable_share == pytest.approx(s.cacheable_share, rel=0.01)


def test_the_command_prints_plots_and_prints_json(tmp_path):
    page = tmp_path / "page.html"
    result = invoke("trace", MOONCAKE, "--html", page, "--trace-start", 10, "--duration", 30)
    assert result.exit_code == 0, result.output
    assert "mooncake" in result.output and "latlab bench --rate" in result.output
    assert "Plotly.newPlot" in page.read_text()
    data = invoke("trace", MOONCAKE, "--no-page", "--json", "--requests", 50)
    profile = TraceProfile.model_validate(orjson.loads(data.stdout))
    assert profile.requests == 50 and profile.sharing is not None


def test_a_bad_trace_is_a_usage_error_naming_the_line_and_field(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1}\n'
                    '{"timestamp": 1, "input_length": -5, "output_length": 1}\n')
    result = invoke("trace", path, "--no-page")
    assert result.exit_code == 2 and "line 2: `input_length` must be" in result.output
    scaled = invoke("trace", MOONCAKE, "--export", tmp_path / "x.jsonl", "--length-scale", 0.5)
    assert scaled.exit_code == 2 and "scale them when you replay it" in scaled.output


def test_an_exported_slice_reads_back_as_the_window(tmp_path):
    out = tmp_path / "slice.jsonl"
    result = invoke("trace", MOONCAKE, "--no-page", "--trace-start", 12, "--duration", 20,
                    "--export", out)
    assert result.exit_code == 0, result.output
    source = [r for r in window(Trace(MOONCAKE), start_s=12.0) if r.offset_s < 20.0]
    back = list(window(Trace(out)))
    assert Trace(out).format == "mooncake" and len(back) == len(source)
    for a, b in zip(source, back):
        assert b.offset_s == pytest.approx(a.offset_s, abs=1e-6)
        assert (b.row.prompt_tokens, b.row.output_tokens) == (a.row.prompt_tokens,
                                                                a.row.output_tokens)
    ids = {}  # the same sharing under new numbers: a one-to-one renaming of the blocks
    for a, b in zip(source, back):
        for x, y in zip(a.row.hash_ids, b.row.hash_ids):
            assert ids.setdefault(x, y) == y
    assert len(set(ids.values())) == len(ids) and min(ids.values()) == 0


def test_a_runs_traffic_exports_without_text(tmp_path):
    run = RunFolder.create(tmp_path, "r")
    with run.record_writer() as w:
        for i in range(3):
            w.write(RequestTimeline(
                id=f"x-{i}", index=i, scheduled_ns=1_000_000_000 * (i + 1), prompt_tokens=64 + i,
                completion_tokens=8, tenant="t", session=SessionStep(id="s", turn=i + 1, turns=3),
                trace=TraceStep(row=i, time_s=float(i), hash_ids=[9, 10 + i])))
    out = tmp_path / "traffic.jsonl"
    assert invoke("trace", run.path, "--no-page", "--export", out).exit_code == 0
    rows = [orjson.loads(line) for line in out.read_text().splitlines()]
    # `api`: the input length is the server's count (the model's whole input)
    assert rows[1] == {"timestamp": 1000.0, "input_length": 65, "output_length": 8,
                       "hash_ids": [0, 2], "session": "s", "turn": 2, "tenant": "t",
                       "api": "completions"}
    assert "prompt" not in out.read_text()
    again = list(Trace(out))
    assert [(r.session, r.turn, r.tenant) for r in again] == [("s", 1, "t"), ("s", 2, "t"),
                                                              ("s", 3, "t")]


def test_sweep_and_predict_take_a_trace(tmp_path):
    with pytest.raises(ValueError, match="give --rates"):
        SweepConfig(base=BenchConfig(arrivals=ArrivalConfig(trace=MOONCAKE)))
    sweep = SweepConfig(base=BenchConfig(arrivals=ArrivalConfig(trace=MOONCAKE)), rates=[1, 2])
    assert sweep.base.arrivals.trace == MOONCAKE
    help_text = invoke("sweep", "--help").output
    assert "--trace-speed" in help_text and "--length-scale" in help_text
    assert "--rate " not in help_text and "--users" not in help_text


def test_ab_replays_the_same_trace_against_both_sides(tmp_path):
    from sse_server import DONE, Server, Step, completion, stream, usage_only

    answer = stream([Step(0.002, completion("a")), Step(0, usage_only(8, 1)), Step(0, DONE)])
    with Server(answer) as a, Server(answer) as b:
        result = invoke("ab", "--a", a.url, "--b", b.url, "--trace", MOONCAKE, "--requests", 6,
                        "--trace-speed", 50, "--length-scale", 1 / 256, "--rounds", 1,
                        "--max-rounds", 1, "--warmup-rounds", 0, "--out", tmp_path, "--json")
        prompts = [[r["body"]["prompt"] for r in s.received] for s in (a, b)]
    assert result.exit_code == 0, result.output
    lengths = [sorted(len(p.split()) for p in side) for side in prompts]
    assert lengths[0] == lengths[1] == sorted(max(1, round(r.row.prompt_tokens / 256))
                                              for r in list(window(Trace(MOONCAKE)))[:6])
