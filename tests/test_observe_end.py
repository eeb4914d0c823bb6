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


def _columns(value, name=""):
    """Every numpy column in `value` (a dataclass, a dict, `Labels`, `Ragged`), by its path."""
    from dataclasses import fields, is_dataclass

    import numpy as np

    from latlab.records.columns import Labels, Ragged

    if isinstance(value, np.ndarray):
        yield name, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _columns(v, f"{name}.{k}")
    elif isinstance(value, Labels):
        yield from _columns(value.codes, name)
    elif isinstance(value, Ragged):
        yield from _columns(value.values, f"{name}.values")
        yield from _columns(value.offsets, f"{name}.offsets")
    elif is_dataclass(value):
        for f in fields(value):
            yield from _columns(getattr(value, f.name), f"{name}.{f.name}")


def test_the_end_holds_no_column_of_every_call_in_memory(tmp_path, monkeypatch):
    """Each per-call column the end's analysis keeps (the run's, its metrics, decomposition,
    in-flight counts, the table's derived columns) is a file's read-only mapping, whose pages
    are given back, or a view of one value: none is a copy in memory. Counted, not timed."""
    import numpy as np

    from latlab.records.spill import _mapping

    monkeypatch.setattr("latlab.records.folder.STREAMED_FROM", 0)  # its kept columns, mapped
    monkeypatch.setattr("latlab.records.cache.CACHED_FROM", 0)
    monkeypatch.setattr("latlab.metrics.request.BLOCK_ROWS", 9)
    monkeypatch.setattr("latlab.analysis.decompose.BLOCK_ROWS", 5)
    result = run_observe(ObserveConfig(out=tmp_path, from_file=FIXTURE, window_s=2))
    a = result.analysis
    calls = len(a.table)
    kept = [*_columns(a.requests.table), *_columns(a.requests.metrics),
            *_columns(a.requests.parts), ("in_flight", a.requests.in_flight),
            ("inside", a.inside)]
    kept += [(name, a.table.__dict__[name]) for name in ("ok", "origin_ns", "end_ns", "events")]
    per_call = [(name, c) for name, c in kept if len(c) in (calls, calls + 1)]
    assert len(per_call) > 60
    in_memory = [name for name, c in per_call
                 if c.strides != (0,) and _mapping(c) is None and len(c)]
    assert in_memory == []
    assert any(_mapping(c) is not None for _, c in per_call)  # some do vary
    with np.testing.assert_raises(ValueError):  # read-only: no write can be lost
        a.requests.metrics.e2e[0] = 0.0
    assert not (result.run.path / "end.scratch").exists()  # the spill's files are gone


def test_the_spilled_end_equals_the_analysis_in_memory(tmp_path, monkeypatch):
    """The same folder through the end (spilled, mapped, a block at a time) and through the
    analysis held in memory (as `latlab report` runs it, and the end did before): the same
    summary, budgets, breakdowns and findings."""
    from latlab.analysis import analyze
    from latlab.metrics.summary import RunContext, summarize
    from latlab.records.window import run_window

    monkeypatch.setattr("latlab.records.folder.STREAMED_FROM", 0)
    monkeypatch.setattr("latlab.records.cache.CACHED_FROM", 0)
    monkeypatch.setattr("latlab.metrics.request.BLOCK_ROWS", 9)
    monkeypatch.setattr("latlab.analysis.decompose.BLOCK_ROWS", 5)
    spilled = run_observe(ObserveConfig(out=tmp_path, from_file=FIXTURE, window_s=2))
    run = spilled.run
    table = run.read_table()
    settings = run.read_config()
    whole = summarize(table, run_window(settings, table), settings.slos or None,
                      context=RunContext(stop_reason="end of file",
                                         notes=spilled.record.notes))
    assert whole.latency == spilled.summary.latency
    assert whole.failure_adjusted == spilled.summary.failure_adjusted
    assert whole.throughput == spilled.summary.throughput
    a, b = spilled.analysis, analyze(run)
    assert a.requests.parts.ms.keys() == b.requests.parts.ms.keys()
    assert a.mean == b.mean and a.tail == b.tail and a.over_time == b.over_time
    assert a.by_prompt == b.by_prompt and a.by_tenant == b.by_tenant
    assert a.findings == b.findings and a.unevaluated == b.unevaluated and a.notes == b.notes


def test_the_trace_rows_made_a_block_at_a_time_are_those_of_each_call_in_start_order(tmp_path):
    """trace.jsonl's rows taken a few calls at a time (across blocks, calls out of start
    order and calls without lengths among them) equal those made a call at a time from the
    calls sorted by start."""
    import numpy as np

    from latlab.records.columns import present
    from latlab.records.observe import trace_rows

    result = run_observe(ObserveConfig(out=tmp_path, from_file=FIXTURE, window_s=2))
    t = result.run.read_table()
    t.prompt_tokens[::5] = np.nan  # some calls without a prompt length: left out
    expected = []
    usable = [i for i in np.argsort(t.origin_ns, kind="stable").tolist()
              if present(t.origin_ns[i]) and t.prompt_tokens[i] > 0
              and (t.completion_tokens[i] if t.ok[i] else t.max_tokens[i]) > 0]
    for i in usable:
        row = {"timestamp": round((int(t.origin_ns[i]) - int(t.origin_ns[usable[0]])) / 1e9, 6),
               "prompt_tokens": int(t.prompt_tokens[i]),
               "output_tokens": int(t.completion_tokens[i] if t.ok[i] else t.max_tokens[i])}
        if t.api[i] is not None:
            row["api"] = t.api[i]
        if t.tenant[i] is not None:
            row["tenant"] = t.tenant[i]
        expected.append(row)
    assert np.any(np.diff(t.origin_ns) < 0)  # the records are not in start order
    assert 20 < len(expected) < len(t)
    assert list(trace_rows(t, block=7)) == expected == list(trace_rows(t))
