"""The columnar records (`RunFolder.read_table`): every field of every record survives, a
torn last line is left out, a bad line is named, server timings joined from spans fill in, a
big file parsed a batch at a time gives the same columns as one parse; and the statistics
computed on columns read the same order statistics a full sort would."""

import math
import weakref
from dataclasses import fields

import numpy as np
import orjson
import pytest
from timelines import steady, timeline, write_run

from latlab.metrics.request import metric_columns
from latlab.metrics.stats import PERCENTILES, distribution, percentile, percentile_ci
from latlab.records.cache import COLUMNS, drop_pages, load_columns, save_columns
from latlab.records.columns import Labels
from latlab.records.folder import RunFolder, RunFolderError
from latlab.records.reader import read_requests
from latlab.records.spans import SERVER_TIMINGS
from latlab.records.table import RequestTable, as_table
from latlab.records.timeline import Outcome, SessionStep


def mixed():
    """Requests of every shape: with and without server timings, failed, new connections,
    tenants and priorities, and events carrying several tokens."""
    records = [timeline(i, i * 30.0, connect=1.5 if i % 4 == 0 else None, tenant="ab"[i % 2],
                        priority=i % 3, server=i % 5 != 0, tokens=3 + i % 4)
               for i in range(20)]
    records += [timeline(20, 700.0, outcome=Outcome.TIMEOUT),
                timeline(21, 720.0, outcome=Outcome.HTTP_429)]
    records[3].token_counts[2] = 3  # an event carrying three tokens
    records[3].server.source = "otel"
    records[4].server.application = {"retrieval": 3.0, "other": 0.5}
    records[6].session = SessionStep(id="s1", turn=2, turns=3, kind="agent", after_ns=5,
                                     tool_start_ns=6, tool_end_ns=9, tool_error="boom")
    records[7].first_reasoning_ns = records[7].first_token_ns
    records[8].node = "10.0.0.2"  # sent by a Ray node
    return records


def test_the_columns_give_back_every_record(tmp_path):
    records = mixed()
    run = write_run(tmp_path, records)
    table = run.read_table()
    assert len(table) == len(records)
    assert [table.record(i) for i in range(len(table))] == run.read_records() == records
    assert table.tenant.names == ("a", "b") and table.source.names == ("otel",)
    assert table.ok.tolist() == [r.ok for r in records]
    assert as_table(records).record(7) == records[7]


def test_tables_merged_in_an_order_are_their_concatenation_taken_in_it():
    records = mixed()
    cuts = [(0, 9), (9, 15), (15, len(records))]
    alive = []  # the parts handed out: each is let go before the next is read

    def parts():
        for lo, hi in cuts:
            assert all(part() is None for part in alive)
            part = as_table(records[lo:hi])
            alive.append(weakref.ref(part))
            yield part
            del part

    order = np.random.default_rng(3).permutation(len(records))
    merged = RequestTable.merge(parts(), order)
    assert len(alive) == len(cuts)
    assert [merged.record(i) for i in range(len(merged))] == [records[i] for i in order]
    assert merged.tenant.names and merged.session.names == ("s1",)
    # a column no request has takes no memory; one that some have is one
    assert merged.phases["tls_ns"].strides == (0,) and np.isnan(merged.phases["tls_ns"]).all()
    assert merged.phases["connect_ns"].strides == (8,)
    with pytest.raises(ValueError, match="20 rows in order, 22 requests"):
        RequestTable.merge([as_table(records)], np.arange(20))


def test_a_torn_last_line_is_left_out_and_a_bad_line_is_an_error(tmp_path):
    run = write_run(tmp_path, steady(5))
    with open(run.requests_path, "ab") as f:
        f.write(b'{"id": "r5", "index": 5, "sent_ns"')  # a crash mid-write
    assert len(run.read_table()) == 5 == len(run.read_records())

    lines = run.requests_path.read_bytes().splitlines(keepends=True)
    run.requests_path.write_bytes(b"".join(lines[:2] + [b'{"id": "x", "index": "two"}\n']
                                           + lines[2:]))
    with pytest.raises(RunFolderError, match="requests.jsonl: unreadable record"):
        run.read_table()


def test_an_empty_or_missing_requests_file_is_no_requests(tmp_path):
    run = write_run(tmp_path, [])
    assert len(run.read_table()) == 0
    run.requests_path.unlink()
    assert len(RunFolder.open(run.path).read_table()) == 0


def test_server_timings_joined_from_spans_fill_only_the_requests_without(tmp_path):
    records = steady(4, server=False)
    records[1] = timeline(1, 100.0, prefill=10.0)
    records[2] = timeline(2, 200.0, prefill=10.0)
    run = write_run(tmp_path, records)
    lines = [{"id": r.id, "server": {"prefill": 42.0, "total": 50.0, "source": "otel"},
              "cached_tokens": 7} for r in records[:3]]
    lines[2]["server"]["application"] = {"retrieval": 2.0}
    (run.path / SERVER_TIMINGS).write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    table = run.read_table()
    assert table.record(0).server.prefill == 42.0 and table.record(0).server.source == "otel"
    assert table.record(1).server.prefill == 10.0  # its own, in-band, stays
    assert table.record(2).server.application == {"retrieval": 2.0}  # an application's wins
    assert table.record(3).server is None
    assert table.cached_tokens.tolist()[:2] == [7, 7]  # neither had a count of its own
    assert [table.record(i) for i in range(4)] == run.read_records()


def test_a_big_runs_columns_are_kept_and_mapped_until_its_records_change(tmp_path,
                                                                        monkeypatch):
    monkeypatch.setattr("latlab.records.folder.CACHED_FROM", 1)
    records = mixed()
    run = write_run(tmp_path, records)
    first = run.read_table()
    assert (run.path / COLUMNS / "manifest.json").is_file()
    assert isinstance(first.token_ns.base, np.memmap)  # the parse's copy, mapped back
    parses = []
    monkeypatch.setattr("latlab.records.folder.read_requests",
                        lambda *a: parses.append(a) or read_requests(*a))
    again = RunFolder.open(run.path).read_table()
    assert not parses and isinstance(again.token_ns.base, np.memmap)
    assert [again.record(i) for i in range(len(again))] == records
    drop_pages(again.token_ns, again.token_counts)  # read again when needed
    assert [again.record(i) for i in range(len(again))] == records
    again.token_ns[0] = -1  # copy-on-write: the copy on disk stays
    assert RunFolder.open(run.path).read_table().token_ns[0] == first.token_ns[0]

    with open(run.requests_path, "ab") as f:  # the run goes on: the copy is stale
        f.write(orjson.dumps(timeline(30, 900.0).to_json()) + b"\n")
    assert len(run.read_table()) == len(records) + 1 and len(parses) == 1
    (run.path / SERVER_TIMINGS).write_bytes(orjson.dumps(
        {"id": records[0].id, "server": {"prefill": 1.0, "source": "otel"}}) + b"\n")
    assert run.read_table().record(0).server.prefill == 1.0 and len(parses) == 2
    (run.path / COLUMNS / "manifest.json").write_bytes(b"{")  # broken: parsed again
    assert len(run.read_table()) == len(records) + 1 and len(parses) == 3


def columns_of(table: RequestTable) -> dict[str, object]:
    """Every column of `table` as plain values, to compare two tables."""
    def plain(value):
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, np.ndarray):  # NaN as None: NaN equals nothing
            return [None if x != x else x for x in value.tolist()]
        if isinstance(value, Labels):
            return [value[i] for i in range(len(value.codes))]
        return value.to_pylist()

    return {f.name: plain(getattr(table, f.name)) for f in fields(table)}


def test_a_big_file_parsed_a_batch_at_a_time_gives_the_columns_of_one_parse(tmp_path,
                                                                          monkeypatch):
    records = mixed() + steady(12, tenant="c")  # new span names, labels and tokens later on
    records[25].server.application = {"embed": 1.0}
    run = write_run(tmp_path, records)
    (run.path / SERVER_TIMINGS).write_bytes(orjson.dumps(
        {"id": records[0].id, "server": {"prefill": 1.0, "source": "otel",
                                         "application": {"rerank": 2.0}}}) + b"\n")
    whole = read_requests(run.requests_path, run.path / SERVER_TIMINGS)
    monkeypatch.setattr("latlab.records.folder.STREAMED_FROM", 0)
    monkeypatch.setattr("latlab.records.reader.BATCH", 5)
    monkeypatch.setattr("latlab.records.folder.read_requests", None)  # not parsed at once
    streamed = run.read_table()
    assert columns_of(streamed) == columns_of(whole)
    assert list(streamed.application) == sorted(whole.application)
    assert [streamed.record(i) for i in range(len(streamed))] == [
        whole.record(i) for i in range(len(whole))]
    # a field no record has is one value, held once, read-only
    assert streamed.phases["tls_ns"].strides == (0,)
    assert not streamed.phases["tls_ns"].flags.writeable
    again = RunFolder.open(run.path).read_table()  # mapped, not parsed again
    assert columns_of(again) == columns_of(whole)
    both = RequestTable.concat([streamed.take(np.arange(3)), whole])  # its strings in chunks
    assert [both.record(i) for i in range(len(both))] == [
        whole.record(i) for i in (0, 1, 2, *range(len(whole)))]


def test_a_kept_column_of_one_value_reads_back_that_value_infinite_or_nan(tmp_path):
    table = as_table(mixed())
    n = len(table)
    table.counts["max_tokens"] = np.full(n, np.inf)
    table.counts["priority"] = np.full(n, -np.inf)
    table.phases["tls_ns"] = np.full(n, np.nan)
    key = [["requests.jsonl", 1, 1]]
    save_columns(table, tmp_path / COLUMNS, key)
    kept = load_columns(tmp_path / COLUMNS, key)
    assert kept.counts["max_tokens"].strides == (0,)  # held as its one value
    assert kept.counts["max_tokens"].tolist() == [np.inf] * n
    assert kept.counts["priority"].tolist() == [-np.inf] * n
    assert np.isnan(kept.phases["tls_ns"]).all()


def test_itl_spreads_an_event_of_k_tokens_over_k_samples():
    records = mixed()
    m = metric_columns(as_table(records))
    gaps = np.diff(np.asarray(records[3].token_ns)) / 1e6
    assert m.chunk_gaps[3].tolist() == pytest.approx(gaps.tolist())
    assert m.itl[3].tolist() == pytest.approx([gaps[0], *[gaps[1] / 3] * 3, *gaps[2:]])
    assert m.itl[0].tolist() == pytest.approx(m.chunk_gaps[0].tolist())


@pytest.mark.parametrize("n", [1, 7, 100, 5001])
def test_a_distribution_reads_the_order_statistics_a_full_sort_would(n):
    rng = np.random.default_rng(n)
    values = rng.lognormal(3, 1, n)
    values[rng.random(n) < 0.02] = math.inf  # failures in the failure-adjusted ones
    d = distribution(values)
    ordered = np.sort(values)
    for name, q in PERCENTILES.items():
        p = d.percentiles[name]
        assert p.value == percentile(ordered, q)
        assert (p.ci_low, p.ci_high) == percentile_ci(ordered, q)
    assert d.min == ordered[0] and d.max == ordered[-1] and d.n == n


def test_a_chunked_string_column_is_taken_a_chunk_at_a_time_as_arrow_takes_it():
    """`columns.take` of a chunked Arrow column (a big run's mapped ids) gives what Arrow's
    own `take` gives (which joins every chunk first): any order, repeats, negative indices,
    masks, none."""
    import pyarrow as pa

    from latlab.records.columns import take

    column = pa.chunked_array([["a", "b", None], [], ["c"], ["d", "e", "f", "g"]])
    rows = np.array([6, 0, 3, 3, 2, -1, 4])
    assert take(column, rows).to_pylist() == column.take(pa.array([6, 0, 3, 3, 2, 7, 4])
                                                         ).to_pylist()
    mask = np.array([True, False, False, True, False, False, True, True])
    assert take(column, mask).to_pylist() == ["a", "c", "f", "g"]
    assert take(column, np.array([], np.int64)).to_pylist() == []


def test_a_runs_requests_taken_column_by_column_are_requests_of_every_column(tmp_path):
    """`columns.take` of a `Requests` (what ab pooled a side's rounds with) gives a
    `Requests` again, every column taken, not the table alone."""
    from latlab.analysis import analyze
    from latlab.analysis.requests import Requests
    from latlab.records.columns import take

    a = analyze(write_run(tmp_path, steady(6)))
    rows = np.array([4, 1])
    taken = take(a.requests, rows)
    assert isinstance(taken, Requests) and len(taken) == 2
    assert taken.metrics.ttft.tolist() == a.requests.metrics.ttft[rows].tolist()
    assert taken.table.index.tolist() == a.requests.table.index[rows].tolist()


def test_a_copy_made_before_a_new_column_is_parsed_again(tmp_path, monkeypatch):
    """A copy an older latlab kept, before `connection.rtt_ns` was a column (its manifest
    as that version wrote it), is not read as this one's: the run is parsed again."""
    monkeypatch.setattr("latlab.records.folder.CACHED_FROM", 1)
    run = write_run(tmp_path, mixed())
    run.read_table()
    manifest_path = run.path / COLUMNS / "manifest.json"
    manifest = orjson.loads(manifest_path.read_bytes())
    older = {"version": 3, "key": manifest["key"], "fields": manifest["fields"]}
    del older["fields"]["phases"]["dict"]["rtt_ns"]
    manifest_path.write_bytes(orjson.dumps(older))
    assert "rtt_ns" in RunFolder.open(run.path).read_table().phases
