"""Read a run folder's `requests.jsonl` into a `RequestTable`, columnar from the start.

DuckDB parses the JSON lines straight into Arrow columns (of `request_columns.SCHEMA`;
unknown fields are ignored), about 1.5× faster than pyarrow.json on this project's records
and never one Python object per record or token (benchmarks/big_run.py). A torn last line (a
crash mid-write) is left out; any other unreadable line is an error naming the file.
Server timings joined from spans (`server_timings.jsonl`) fill the requests that carried
none in-band, as `RunFolder.iter_records` does. A big file is parsed a batch of records at a
time straight into the run's kept columns (`stream_requests`, `records.cache`), so that its
parse never holds the whole run.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from latlab.records.cache import ColumnsWriter, load_columns
from latlab.records.columns import Labels
from latlab.records.request_columns import SCHEMA
from latlab.records.server_timing import GATEWAY_DURATIONS, SERVER_DURATIONS
from latlab.records.table import RequestTable

if TYPE_CHECKING:
    import duckdb

BATCH = 10_000  # records a streamed parse takes at a time (`stream_requests`)
# DuckDB's threads for a streamed parse: each holds buffers of its own, and one keeps up with
# the conversion of the batches it gives (benchmarks/observe_end.py: the read's peak)
STREAM_THREADS = 1
JOINED = pa.schema([("id", pa.string()), ("server", SCHEMA.field("server").type),
                    ("cached_tokens", pa.int64())])


class UnreadableRecords(ValueError):
    """A line of a JSON-lines file that is not a record."""


def read_requests(path: Path, joined: Path | None = None, schema: pa.Schema = SCHEMA
                  ) -> RequestTable:
    """The records of `path` (requests.jsonl) with the server timings of `joined`; only the
    fields of `schema` (some of `SCHEMA`'s) are read, the others are missing."""
    table = RequestTable.from_arrow(read_jsonl(path, schema) if path.is_file()
                                    else schema.empty_table())
    if joined is not None and joined.is_file():
        _join(table, read_jsonl(joined, JOINED))
    return table


def read_jsonl(path: Path, schema: pa.Schema) -> pa.Table:
    """Every complete line of `path` as a row of `schema`'s columns."""
    with _parsed(path, schema) as result:
        table = schema.empty_table() if result is None else result.to_arrow_table()
    return table.cast(schema) if table.schema != schema else table


def iter_jsonl(path: Path, schema: pa.Schema, rows: int) -> Iterator[pa.RecordBatch]:
    """`read_jsonl` as batches of at most `rows` rows, in the file's order: DuckDB's buffers
    are all a batch holds, whatever the file's size."""
    with _parsed(path, schema, STREAM_THREADS) as result:
        if result is None:
            return
        for batch in result.to_arrow_reader(rows):
            yield batch.cast(schema) if batch.schema != schema else batch


def stream_requests(path: Path, joined: Path | None, folder: Path, key: list[Any],
                    read_only: bool = False) -> RequestTable:
    """`read_requests`, its columns written to `folder` (`records.cache`) a batch of records
    at a time and mapped back: a big run's parse holds a batch, not the run."""
    spans = read_jsonl(joined, JOINED) if joined is not None and joined.is_file() else None
    with ColumnsWriter(folder, key) as writer:
        for batch in iter_jsonl(path, SCHEMA, BATCH):
            table = RequestTable.from_arrow(pa.Table.from_batches([batch]))
            if spans is not None:
                _join(table, spans)
            writer.append(table)
        if not writer.rows:
            writer.append(RequestTable.from_arrow(SCHEMA.empty_table()))
        writer.finish()
    table = load_columns(folder, key, read_only)
    if table is None:
        raise OSError(f"{folder}: the columns just written do not read back")
    return table


@contextmanager
def _parsed(path: Path, schema: pa.Schema, threads: int | None = None
            ) -> Iterator[duckdb.DuckDBPyRelation | None]:
    """DuckDB's parse of the complete lines of `path` (None: an empty file), unread, with
    `threads` (None: DuckDB's default, one a core): the caller takes its rows while the
    connection is open. An unreadable line is an error naming the file and the line."""
    import duckdb

    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        torn = size > 0 and (f.seek(size - 1), f.read(1))[1] != b"\n"
    if size == 0:
        yield None
        return
    source, scratch = path, None
    if torn:  # read the complete lines only
        scratch = tempfile.NamedTemporaryFile(suffix=".jsonl", delete=False)
        with open(path, "rb") as f, scratch:
            _copy_complete_lines(f, scratch, size)
        source = Path(scratch.name)
    columns = "{" + ", ".join(f"'{field.name}': '{_duckdb_type(field.type)}'"
                              for field in schema) + "}"
    try:
        with duckdb.connect() as db:
            db.execute("SET preserve_insertion_order = true")
            if threads is not None:
                db.execute(f"SET threads = {int(threads)}")
            yield db.sql(f"SELECT * FROM read_json(?, format = 'newline_delimited', "
                         f"columns = {columns})", params=[str(source)])
    except duckdb.Error as e:
        message = _not_json(source) or str(e).splitlines()[0].replace(str(source), str(path))
        raise UnreadableRecords(f"{path}: unreadable record: {message}") from None
    finally:
        if scratch is not None:
            os.unlink(scratch.name)


def _not_json(path: Path) -> str | None:
    """Which line of `path` is not a JSON object, and why (DuckDB names the line where it
    gave up, the one after a record cut short); None when every line is one."""
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            try:
                if isinstance(orjson.loads(line), dict):
                    continue
                why = "not a JSON object"
            except orjson.JSONDecodeError as e:
                why = f"not JSON ({e.msg} at character {e.pos + 1})"
            return f"line {number}: {why}"
    return None


def _copy_complete_lines(src, dst, size: int) -> None:
    """Copy `src` up to and including its last newline."""
    end = size
    while end > 0:
        start = max(0, end - (1 << 20))
        src.seek(start)
        cut = src.read(end - start).rfind(b"\n")
        if cut >= 0:
            end = start + cut + 1
            break
        end = start
    src.seek(0)
    remaining = end
    while remaining > 0:
        block = src.read(min(remaining, 1 << 24))
        dst.write(block)
        remaining -= len(block)


def _duckdb_type(t: pa.DataType) -> str:
    if pa.types.is_struct(t):
        return "STRUCT(" + ", ".join(f'"{f.name}" {_duckdb_type(f.type)}' for f in t) + ")"
    if pa.types.is_map(t):
        return f"MAP({_duckdb_type(t.key_type)}, {_duckdb_type(t.item_type)})"
    if pa.types.is_list(t):
        return _duckdb_type(t.value_type) + "[]"
    return {pa.int64(): "BIGINT", pa.int32(): "INTEGER", pa.float64(): "DOUBLE",
            pa.string(): "VARCHAR", pa.bool_(): "BOOLEAN"}[t]


def _join(table: RequestTable, joined: pa.Table) -> None:
    """Fill `table`'s requests without server timings (and cached-token counts) from the
    joined ones; an application's spans win over the model server's in-band timings its
    answer relayed; a gateway's hop is taken whatever the timings; a later line for the same
    request wins."""
    if not joined.num_rows:
        return
    joined = joined.take(pa.array(np.arange(joined.num_rows - 1, -1, -1)))  # last wins
    where = pc.index_in(table.text["id"], value_set=joined.column("id").combine_chunks())
    where = pc.fill_null(where, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    found = where >= 0
    other = RequestTable.from_arrow(joined.select(["server", "cached_tokens"]))
    fill = np.zeros(len(table), bool)
    fill[found] = other.has_server[where[found]]
    spans = np.zeros(len(table), bool)
    spans[found] = other.has_application[where[found]]
    fill &= ~table.has_server | spans
    at = where[fill]
    for name in SERVER_DURATIONS:
        table.server[name][fill] = other.server[name][at]
    for name in GATEWAY_DURATIONS:
        hop = np.zeros(len(table), bool)
        hop[found] = ~np.isnan(other.server[name][where[found]])
        table.server[name][hop] = other.server[name][where[hop]]
    for name in other.application.keys() - table.application.keys():
        table.application[name] = np.full(len(table), np.nan)
    table.application = dict(sorted(table.application.items()))  # as `columns.spans` gives them
    for name, values in table.application.items():
        values[fill] = other.application[name][at] if name in other.application else np.nan
    table.has_application[fill] = other.has_application[at]
    names = tuple(dict.fromkeys((*table.source.names, *other.source.names)))
    remap = np.array([names.index(s) for s in other.source.names] + [-1])
    codes = table.source.codes.copy()
    codes[fill] = remap[other.source.codes[at]]
    table.source = Labels(codes, names)
    table.has_server |= fill
    cached = table.counts["cached_tokens"]
    missing = found & np.isnan(cached)
    cached[missing] = other.counts["cached_tokens"][where[missing]]
