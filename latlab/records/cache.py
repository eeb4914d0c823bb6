"""A run's columns kept next to its records (`requests.columns/`), so that reading the run
again maps them from disk instead of parsing `requests.jsonl`.

`requests.jsonl` stays the record: this copy is written by a parse (`RunFolder.read_table`,
which `bench` and `observe` call at the end of every run; a big file's parse writes it a
batch of records at a time, `ColumnsWriter`, never holding the whole run) and read only while
the files it was made from are unchanged (their sizes and modification times) and its format
is this one's; else the records are parsed again. A run of fewer than `CACHED_FROM` records
keeps no copy. Each numpy column is one raw file, mapped copy-on-write (a column that the
analysis changes in place changes in memory only), except a column holding one value
throughout (a field no record has, a count every record shares): that is written as its
value and read back as a read-only view of it, no memory a request. Each Arrow column of
free-form strings is one Arrow IPC file, a batch per batch of records, mapped too. A folder
that cannot be written keeps no copy.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import shutil
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa

from latlab.records.columns import Labels, missing_value
from latlab.records.request_columns import SCHEMA, TOKENS
from latlab.records.table import RequestTable

COLUMNS = "requests.columns"
CACHED_FROM = 10_000  # records: a smaller run parses in a fraction of a second
VERSION = 3  # of the layout below and of `RequestTable`'s fields: a change makes a new copy
# A copy's layout: `VERSION` and the records' schema, whose new fields (`connection.rtt_ns`)
# add columns to the table without a change here (an older copy would lack them).
LAYOUT = hashlib.sha256(f"{VERSION}\n{SCHEMA}".encode()).hexdigest()[:16]
MANIFEST = "manifest.json"


def source_key(*paths: Path) -> list[Any]:
    """What a copy was made from: each file's name, size and modification time (None: none)."""
    key: list[Any] = []
    for path in paths:
        try:
            stat = path.stat()
            key.append([path.name, stat.st_size, stat.st_mtime_ns])
        except FileNotFoundError:
            key.append([path.name, None, None])
    return key


def load_columns(folder: Path, key: list[Any], read_only: bool = False) -> RequestTable | None:
    """The copy in `folder` if it was made from `key`'s files as they are now, else None.
    `read_only`: its columns mapped shared and read-only (a write is an error), so that their
    pages can be given back (`records.spill`); else copy-on-write."""
    try:
        manifest = orjson.loads((folder / MANIFEST).read_bytes())
        if manifest.get("layout") != LAYOUT or manifest.get("key") != key:
            return None
        return RequestTable(**{name: load_column(folder, spec, read_only)
                               for name, spec in manifest["fields"].items()})
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException):
        return None  # no copy, or a broken one: the records are parsed again


def save_columns(table: RequestTable, folder: Path, key: list[Any]) -> None:
    """Write `table` to `folder` (replacing an older copy); nothing where it cannot."""
    try:
        with ColumnsWriter(folder, key) as writer:
            writer.append(table)
            writer.finish()
    except OSError:
        pass


def drop_pages(*columns: np.ndarray) -> None:
    """Give back the memory of the pages that `columns`, mapped from a copy, have read: they
    are read again (from the page cache) when next needed. Only for columns no one writes,
    whose changes this would lose: a big run's token stamps, once passed over."""
    for column in columns:
        mapped = getattr(column.base, "_mmap", None)  # np.memmap's mapping of the file
        if isinstance(mapped, mmap.mmap):
            mapped.madvise(mmap.MADV_DONTNEED)


class ColumnsWriter:
    """A copy written a batch of records at a time (`append` each batch's table in order,
    then `finish`); on an error, or without `finish`, nothing is left in `folder`.

        with ColumnsWriter(folder, key) as writer:
            for batch in batches:
                writer.append(batch)
            writer.finish()
    """

    def __init__(self, folder: Path, key: list[Any]) -> None:
        self.folder, self.key = folder, key
        self.scratch = folder.with_name(f"{folder.name}.{os.getpid()}.tmp")
        self.rows = 0  # requests so far
        self._tokens = 0  # token events so far
        self._spec: dict[str, Any] = {}  # the manifest's fields, its leaves the writers below
        self._files: list[RawColumn | _Text] = []

    def __enter__(self) -> ColumnsWriter:
        shutil.rmtree(self.scratch, ignore_errors=True)
        self.scratch.mkdir()
        return self

    def __exit__(self, *exc: object) -> None:
        self._close()
        shutil.rmtree(self.scratch, ignore_errors=True)

    def append(self, table: RequestTable) -> None:
        """The next requests, after those appended before."""
        for f in fields(table):
            if f.name not in TOKENS:
                self._add(self._spec, f.name, getattr(table, f.name), len(table))
        self._add(self._spec, "token_ns", table.token_ns, None)
        self._add(self._spec, "token_counts", table.token_counts, None)
        ends = table.token_offsets[1:] + (self._tokens - table.token_offsets[0])
        if not self.rows:
            ends = np.concatenate([np.zeros(1, ends.dtype), ends])
        self._add(self._spec, "token_offsets", ends, None)
        self._tokens += len(table.token_ns)
        self.rows += len(table)

    def finish(self) -> None:
        """The copy complete: its manifest written, the scratch folder put in `folder`'s
        place (replacing an older copy)."""
        self._close()
        application = self._spec["application"]["dict"]  # span names, as `columns.spans` sorts
        self._spec["application"]["dict"] = {k: application[k] for k in sorted(application)}
        manifest = {"layout": LAYOUT, "key": self.key, "fields": _specs(self._spec)}
        (self.scratch / MANIFEST).write_bytes(orjson.dumps(manifest))
        shutil.rmtree(self.folder, ignore_errors=True)
        self.scratch.rename(self.folder)

    def _add(self, node: dict[str, Any], name: str, value: Any, rows: int | None) -> None:
        """`value` (of `rows` requests; None: per token) appended to the column `name` of
        `node`: a numpy array, a dict of them, `Labels` or Arrow strings."""
        if isinstance(value, dict):
            columns = node.setdefault(name, {"dict": {}})["dict"]
            for key, column in value.items():
                self._add(columns, key, column, rows)
            for key in columns.keys() - value.keys():  # a span name these requests lack
                column = columns[key]
                self._add(columns, key, np.full(rows, column.missing, column.dtype), rows)
        elif isinstance(value, Labels):
            labels = node.setdefault(name, {"labels": {}, "names": {}})
            names = labels["names"]
            remap = np.array([names.setdefault(x, len(names)) for x in value.names] + [-1],
                             dtype=value.codes.dtype)
            self._add(labels["labels"], "codes", remap[value.codes], rows)
        elif isinstance(value, np.ndarray):
            column = node.get(name)
            if column is None:
                column = node[name] = RawColumn(self.scratch / f"{len(self._files)}.raw",
                                              value.dtype)
                self._files.append(column)
                if rows is not None and self.rows:  # a span name first seen now
                    column.write(np.full(self.rows, column.missing, column.dtype))
            column.write(value)
        else:
            if name not in node:
                node[name] = _Text(self.scratch / f"{len(self._files)}.arrow", value.type)
                self._files.append(node[name])
            node[name].write(value)

    def _close(self) -> None:
        for file in self._files:
            file.close()


def _specs(node: dict[str, Any]) -> dict[str, Any]:
    """The manifest's fields of the writers in `node`."""
    specs: dict[str, Any] = {}
    for name, value in node.items():
        if isinstance(value, (RawColumn, _Text)):
            specs[name] = value.spec()
        elif "dict" in value:
            specs[name] = {"dict": _specs(value["dict"])}
        else:
            specs[name] = {"labels": value["labels"]["codes"].spec(),
                           "names": list(value["names"])}
    return specs


class _Text:
    """One Arrow column of free-form strings, a batch per batch of records."""

    def __init__(self, path: Path, type: pa.DataType) -> None:
        self.path = path
        self.sink = pa.OSFile(str(path), "wb")
        self.writer = pa.ipc.new_file(self.sink, pa.schema([("values", type)]))

    def write(self, values: pa.Array | pa.ChunkedArray) -> None:
        self.writer.write_table(pa.table({"values": values}))

    def close(self) -> None:
        if not self.sink.closed:
            self.writer.close()
            self.sink.close()

    def spec(self) -> dict[str, Any]:
        return {"arrow": self.path.name}


class RawColumn:
    """One numpy column being written a part at a time (`write` each, `close`, then its
    `spec` for `load_column`): held as its one value while every value written is that
    value; written out to its raw file from the first that is not."""

    def __init__(self, path: Path, dtype: np.dtype) -> None:
        self.path, self.dtype = path, np.dtype(dtype)
        self.missing = missing_value(self.dtype)  # what a request without it holds
        self.length, self.value, self.file = 0, None, None

    def write(self, values: np.ndarray) -> None:
        values = np.asarray(values, self.dtype)
        if self.file is None and len(values):
            first = values[:1]
            if (self.length == 0 or _same(first, np.asarray([self.value], self.dtype))) \
                    and _same(values, np.broadcast_to(first, values.shape)):
                self.value = first[0]
                self.length += len(values)
                return
            self.file = open(self.path, "wb")
            if self.length:
                self.file.write(np.full(self.length, self.value, self.dtype).tobytes())
        if self.file is not None:
            self.file.write(np.ascontiguousarray(values).data)
        self.length += len(values)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()

    def spec(self) -> dict[str, Any]:
        if self.file is None:
            value = None if self.value is None else self.value.item()
            if isinstance(value, float) and not np.isfinite(value):
                value = str(value)  # "nan", "inf", "-inf": JSON has no number for them
            return {"constant": value, "dtype": self.dtype.str, "length": self.length}
        return {"raw": self.path.name, "dtype": self.dtype.str, "length": self.length}


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether `a` and `b` hold the same values (NaN equal to NaN)."""
    return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))


def load_column(folder: Path, spec: dict[str, Any], read_only: bool = False) -> Any:
    """The column of a manifest's `spec` (see `load_columns` for `read_only`)."""
    if "constant" in spec:  # one value throughout: a read-only view of it
        value = spec["constant"]
        value = float(value) if isinstance(value, str) else value  # "nan", "inf", "-inf"
        dtype = np.dtype(spec["dtype"])
        return np.broadcast_to(np.array(0 if value is None else value, dtype),
                               (spec["length"],))
    if "raw" in spec:  # a plain array over the mapping: np.memmap's indexing costs per call
        if not spec["length"]:
            return np.empty(0, np.dtype(spec["dtype"]))
        return np.memmap(folder / spec["raw"], np.dtype(spec["dtype"]),
                         mode="r" if read_only else "c",
                         shape=(spec["length"],)).view(np.ndarray)
    if "labels" in spec:
        return Labels(load_column(folder, spec["labels"], read_only), tuple(spec["names"]))
    if "dict" in spec:
        return {k: load_column(folder, v, read_only) for k, v in spec["dict"].items()}
    column = pa.ipc.open_file(pa.memory_map(str(folder / spec["arrow"]))).read_all()["values"]
    return column.chunk(0) if column.num_chunks == 1 else column
