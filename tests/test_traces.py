"""Trace readers: the public formats (fixtures: real rows of Mooncake's FAST'25 synthetic
trace, Azure's 2023 and 2024 LLM traces and BurstGPT v2; see fixtures/traces/README.md),
latlab's own JSONL and a run folder; windows, speed and scale; errors that name the line and
the field; reading a big trace with bounded memory."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import orjson
import pytest

from latlab.load.workload import traces
from latlab.load.workload.arrivals import arrival_times
from latlab.load.workload.traces import (
    Trace,
    TraceCursor,
    TraceError,
    replay_window,
    survey,
    window,
)
from latlab.records.arrivals import ArrivalConfig
from latlab.records.folder import RunFolder
from latlab.records.timeline import RequestTimeline, SessionStep, TraceStep

FIXTURES = Path(__file__).parent / "fixtures" / "traces"
MOONCAKE, AZURE, AZURE_2024, BURSTGPT = (FIXTURES / name for name in (
    "mooncake.jsonl", "azure_conv.csv", "azure_2024.csv", "burstgpt_v2.csv"))


def rows(path, **kw):
    return list(window(Trace(path), **kw))


def test_each_public_format_is_told_by_its_file_and_read_as_it_says():
    moon = rows(MOONCAKE)
    assert Trace(MOONCAKE).format == "mooncake" and len(moon) == 209
    first = moon[0].row
    assert (first.prompt_tokens, first.output_tokens, first.hash_ids[:3], len(first.hash_ids)) \
        == (40160, 6, [0, 1, 2], 79)
    assert moon[-1].offset_s == pytest.approx(60.024)  # timestamps in ms
    azure = rows(AZURE)
    assert Trace(AZURE).format == "azure" and len(azure) == 216
    assert (azure[0].row.prompt_tokens, azure[0].row.output_tokens) == (374, 44)
    assert azure[1].offset_s == pytest.approx(50.9951690 - 46.6805900)  # 7-digit fractions
    assert azure[0].row.hash_ids is None and azure[0].row.line == 2
    zoned = rows(AZURE_2024)  # dates with a zone, as in the 2024 files
    assert [r.row.prompt_tokens for r in zoned] == [2162, 2399, 76, 2376, 7670]
    assert zoned[-1].offset_s == pytest.approx(0.083890 - 0.009930)
    burst = rows(BURSTGPT)
    assert Trace(BURSTGPT).format == "burstgpt"
    assert [r.offset_s for r in burst] == [0.0, 51.0, 82.0, 144.0]
    assert burst[0].row.session == "1722ac82-0a46-4bf0-aa08-89794e7a2b3f"
    assert burst[0].row.turn == 1


def test_latlab_jsonl_takes_lengths_blocks_sessions_and_labels(tmp_path):
    path = tmp_path / "mine.jsonl"
    lines = [{"timestamp": 10.0, "prompt_tokens": 100, "output_tokens": 5, "session": "a",
              "tenant": "team-1", "priority": 2, "hash_ids": [7, 8]},
             {"timestamp_ms": 10500, "prompt_tokens": 140, "session": "a"},
             {"timestamp": 11.0}]
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in lines))
    got = rows(path)
    assert Trace(path).format == "latlab"
    assert [r.offset_s for r in got] == [0.0, 0.5, 1.0]
    a, b, c = (r.row for r in got)
    assert (a.session, a.turn, a.tenant, a.priority, a.hash_ids) == ("a", 1, "team-1", 2, [7, 8])
    assert (b.session, b.turn, b.prompt_tokens, b.output_tokens) == ("a", 2, 140, None)
    assert (c.prompt_tokens, c.session) == (None, None)  # times only: lengths are drawn


def test_burstgpt_v1_csv_and_zero_token_rows(tmp_path):
    path = tmp_path / "BurstGPT_1.csv"
    path.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                    "5,ChatGPT,472,18,490,Conversation log\n"
                    "7,ChatGPT,0,20,20,Conversation log\n"
                    "45,GPT-4,200,0,200,API log\n"
                    "46,GPT-4,300,40,340,API log\n")
    trace = Trace(path)
    got = list(trace)
    assert [(r.prompt_tokens, r.output_tokens, r.session) for r in got] == [
        (472, 18, None), (300, 40, None)]
    assert trace.skipped == {traces.formats.ZERO: 2} and "skipped 2 rows" in (
        trace.describe_skipped())


def test_window_start_speed_and_a_few_rows_out_of_order(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(f'{{"timestamp": {t}}}\n' for t in (100.5, 100.0, 102.25, 104.0)))
    assert list(arrival_times(ArrivalConfig(trace=path))) == [0.0, 0.5, 2.25, 4.0]
    late = list(arrival_times(ArrivalConfig(trace=path, trace_start_s=2.0, trace_speed=2.0)))
    assert late == [0.0, 0.875]  # from 102.25, the gap halved
    assert [r.since_s for r in rows(path, start_s=2.0)] == [2.25, 4.0]


def test_rows_out_of_order_beyond_the_buffer_are_an_error(tmp_path, monkeypatch):
    monkeypatch.setattr(traces, "REORDER", 2)
    path = tmp_path / "t.jsonl"
    path.write_text("".join(f'{{"timestamp": {t}}}\n' for t in (5, 6, 7, 8, 1)))
    with pytest.raises(TraceError, match=r"line 5: `timestamp` is .* out of time order"):
        list(Trace(path))


@pytest.mark.parametrize("name,content,fragment", [
    ("m.jsonl", '{"timestamp": 0, "input_length": 10, "output_length": 2}\n'
                '{"timestamp": 5, "output_length": 2}\n', "line 2: `input_length` must be"),
    ("m.jsonl", '{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1, -2]}\n',
     "line 1: `hash_ids` must be a list of block ids"),
    ("m.jsonl", '{"timestamp": "noon", "input_length": 10, "output_length": 2}\n',
     "line 1: `timestamp` must be a number of ms"),
    ("l.jsonl", '{"timestamp": 1}\n{oops\n', "line 2: `(line)` is not JSON"),
    ("l.jsonl", '{"timestamp": 1}\n[1, 2]\n', "line 2: `(line)` is not a JSON object"),
    ("l.jsonl", '{"timestamp": 1, "turn": 0, "session": "s"}\n', "line 1: `turn` must be"),
    ("l.jsonl", '{"when": 1}\n', "line 1: `timestamp` is missing"),
    ("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,374,44\n"
              "yesterday,1,1\n", "line 3: `TIMESTAMP` must be a date"),
    ("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,3.5,44\n",
     "line 2: `ContextTokens` must be a token count"),
    ("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,374\n",
     "line 2: `GeneratedTokens` is missing"),
    ("b.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
              "soon,ChatGPT,1,1,2,API log\n", "line 2: `Timestamp` must be a number"),
    ("x.csv", "time,prompt,output\n1,2,3\n", "line 1: `(header)` is 'time,prompt,output'"),
    ("e.jsonl", "\n\n", "empty"),
])
def test_bad_traces_name_the_file_line_and_field(tmp_path, name, content, fragment):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(TraceError) as e:
        list(Trace(path))
    assert str(e.value).startswith(f"--trace {path}") and fragment in str(e.value)


def test_a_compressed_trace_reads_as_the_plain_one(tmp_path):
    import gzip

    packed = tmp_path / "azure.csv.gz"
    packed.write_bytes(gzip.compress(AZURE.read_bytes()))
    moon = tmp_path / "mooncake.jsonl.gz"
    moon.write_bytes(gzip.compress(MOONCAKE.read_bytes()))
    assert [r.row for r in rows(packed)] == [r.row for r in rows(AZURE)]
    assert Trace(moon).format == "mooncake" and len(rows(moon)) == 209


def test_a_missing_trace_or_a_folder_that_is_no_run(tmp_path):
    with pytest.raises(TraceError, match="cannot read it"):
        Trace(tmp_path / "missing.jsonl")
    with pytest.raises(TraceError, match="not a latlab run folder"):
        list(Trace(tmp_path))


def test_a_run_folder_is_its_requests_as_scheduled(tmp_path):
    run = RunFolder.create(tmp_path, "r")
    with run.record_writer() as w:  # written as they end: out of schedule order
        w.write(RequestTimeline(id="x-1", index=1, scheduled_ns=3_000_000_000,
                                prompt_tokens=90, completion_tokens=7, session=SessionStep(
                                    id="s", turn=2, turns=2),
                                trace=TraceStep(row=4, time_s=2.0, hash_ids=[3, 4])))
        w.write(RequestTimeline(id="x-0", index=0, scheduled_ns=1_000_000_000,
                                prompt_tokens_planned=50, max_tokens=9, outcome="timeout"))
    got = rows(run.path)
    assert Trace(run.path).format == "run"
    assert [(r.offset_s, r.row.prompt_tokens, r.row.output_tokens) for r in got] == [
        (0.0, 50, 9), (2.0, 90, 7)]  # a failed request: the output it asked for
    assert (got[1].row.session, got[1].row.turn, got[1].row.hash_ids) == ("s", 2, [3, 4])


def test_the_cursor_serves_requests_in_order_and_rereads_for_an_earlier_one():
    cursor = TraceCursor(ArrivalConfig(trace=MOONCAKE, trace_start_s=30.0))
    assert cursor.first.since_s == pytest.approx(30.163)  # read up to the window at once
    offsets = list(cursor.offsets())
    assert offsets[0] == 0.0 and len(offsets) == len(rows(MOONCAKE, start_s=30.0))
    assert cursor.get(len(offsets)) is None
    cursor.KEEP = 4
    cursor._open()
    assert cursor.get(50).row.row == cursor.get(50).row.row
    assert cursor.get(2).row == rows(MOONCAKE, start_s=30.0)[2].row  # read again


def test_survey_and_replay_window_by_duration_and_requests():
    a = ArrivalConfig(trace=MOONCAKE, trace_speed=2.0)
    s = survey(a, duration_s=10.0)
    assert s.format == "mooncake" and s.lengths and s.span_s < 10.0
    assert s.requests == sum(1 for r in rows(MOONCAKE) if r.offset_s < 20.0)
    assert survey(a, requests=7).requests == 7
    assert len(list(replay_window(a, requests=3)[1])) == 3


def test_a_million_row_trace_is_read_in_bounded_memory(tmp_path):
    """Memory does not grow with the trace: the same peak for 30,000 rows as for 12,000
    (both past the reorder buffer); benchmarks/trace_replay.py reads a million."""
    def peak(n: int) -> int:
        path = tmp_path / f"{n}.jsonl"
        with open(path, "wb") as f:
            for i in range(n):
                f.write(orjson.dumps({"timestamp": i, "input_length": 1000, "output_length": 9,
                                      "hash_ids": [i % 50, i, i + 1]}) + b"\n")
        tracemalloc.start()
        count = sum(1 for _ in window(Trace(path), speed=10.0))
        _, high = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert count == n
        return high

    small, big = peak(12_000), peak(30_000)
    assert big < 1.3 * small
