"""The end of `latlab observe`: a run's calls read a batch at a time (as a big run's are, into
its kept columns) give the summary, the windows' check, the trace, the report's analysis and
its findings that reading them in one piece gives, over every call."""

from pathlib import Path

import orjson

from latlab.records.cache import COLUMNS
from latlab.records.observe import OBSERVE_JSON, TRACE_JSONL, WINDOWS, ObserveConfig
from latlab.services.observe import run_observe

FIXTURE = Path(__file__).parent / "fixtures" / "observe" / "genai_spans.jsonl"


def test_a_run_read_a_batch_at_a_time_ends_as_one_read_in_one_piece(tmp_path, monkeypatch):
    config = {"from_file": FIXTURE, "window_s": 2}
    whole = run_observe(ObserveConfig(out=tmp_path / "whole", **config))
    monkeypatch.setattr("latlab.records.folder.STREAMED_FROM", 0)  # every file streamed
    monkeypatch.setattr("latlab.records.reader.BATCH", 7)
    monkeypatch.setattr("latlab.analysis.decompose.BLOCK_ROWS", 5)
    streamed = run_observe(ObserveConfig(out=tmp_path / "streamed", **config))

    assert (streamed.run.path / COLUMNS).is_dir()  # read through its kept columns
    assert not (whole.run.path / COLUMNS).exists()  # a small run: read in one piece
    assert whole.record.calls > 50
    assert streamed.summary.to_json() == whole.summary.to_json()
    for name in (TRACE_JSONL, WINDOWS):
        assert (streamed.run.path / name).read_bytes() == (whole.run.path / name).read_bytes()
    assert orjson.loads((streamed.run.path / OBSERVE_JSON).read_bytes()) == \
        orjson.loads((whole.run.path / OBSERVE_JSON).read_bytes())
    a, b = streamed.analysis, whole.analysis
    assert a.mean == b.mean and a.tail == b.tail and a.over_time == b.over_time
    assert a.findings == b.findings
    assert a.unevaluated == b.unevaluated and a.notes == b.notes
    assert streamed.peak == whole.peak
