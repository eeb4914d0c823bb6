"""A run's columns kept next to its records (`requests.columns/`), so that reading the run
again maps them from disk instead of parsing `requests.jsonl`.

`requests.jsonl` stays the record: this copy is written after a parse (`RunFolder.read_table`,
which `bench` calls at the end of every run) and read only while the files it was made from
are unchanged (their sizes and modification times) and its format is this one's; else the
records are parsed again. A run of fewer than `CACHED_FROM` records keeps no copy. Each
numpy column is one `.npy` file, mapped copy-on-write (a column that the analysis changes in
place changes in memory only); each Arrow column of free-form strings is one Arrow IPC file,
mapped too. A folder that cannot be written keeps no copy.
"""

from __future__ import annotations

import itertools
import mmap
import os
import shutil
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa

from latlab.records.columns import Labels
from latlab.records.table import RequestTable

COLUMNS = "requests.columns"
CACHED_FROM = 10_000  # records: a smaller run parses in a fraction of a second
VERSION = 2  # of the layout below and of `RequestTable`'s fields: a change makes a new copy
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


def load_columns(folder: Path, key: list[Any]) -> RequestTable | None:
    """The copy in `folder` if it was made from `key`'s files as they are now, else None."""
    try:
        manifest = orjson.loads((folder / MANIFEST).read_bytes())
        if manifest.get("version") != VERSION or manifest.get("key") != key:
            return None
        return RequestTable(**{name: _load(folder, spec)
                               for name, spec in manifest["fields"].items()})
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException):
        return None  # no copy, or a broken one: the records are parsed again


def save_columns(table: RequestTable, folder: Path, key: list[Any]) -> None:
    """Write `table` to `folder` (replacing an older copy); nothing where it cannot."""
    scratch = folder.with_name(f"{folder.name}.{os.getpid()}.tmp")
    try:
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir()
        files = itertools.count()
        specs = {f.name: _save(scratch, getattr(table, f.name), files) for f in fields(table)}
        (scratch / MANIFEST).write_bytes(orjson.dumps({"version": VERSION, "key": key,
                                                       "fields": specs}))
        shutil.rmtree(folder, ignore_errors=True)
        scratch.rename(folder)
    except OSError:
        shutil.rmtree(scratch, ignore_errors=True)


def drop_pages(*columns: np.ndarray) -> None:
    """Give back the memory of the pages that `columns`, mapped from a copy, have read: they
    are read again (from the page cache) when next needed. Only for columns no one writes,
    whose changes this would lose: a big run's token stamps, once passed over."""
    for column in columns:
        mapped = getattr(column.base, "_mmap", None)  # np.memmap's mapping of the file
        if isinstance(mapped, mmap.mmap):
            mapped.madvise(mmap.MADV_DONTNEED)


def _save(folder: Path, value: Any, files: Iterator[int]) -> dict[str, Any]:
    if isinstance(value, np.ndarray):
        name = f"{next(files)}.npy"
        np.save(folder / name, value, allow_pickle=False)
        return {"npy": name}
    if isinstance(value, Labels):
        return {"labels": _save(folder, value.codes, files), "names": list(value.names)}
    if isinstance(value, dict):
        return {"dict": {k: _save(folder, v, files) for k, v in value.items()}}
    name = f"{next(files)}.arrow"
    with pa.OSFile(str(folder / name), "wb") as sink, \
            pa.ipc.new_file(sink, pa.schema([("values", value.type)])) as writer:
        writer.write_table(pa.table({"values": value}))
    return {"arrow": name}


def _load(folder: Path, spec: dict[str, Any]) -> Any:
    if "npy" in spec:  # a plain array over the mapping: np.memmap's indexing costs per call
        return np.load(folder / spec["npy"], mmap_mode="c", allow_pickle=False).view(np.ndarray)
    if "labels" in spec:
        return Labels(_load(folder, spec["labels"]), tuple(spec["names"]))
    if "dict" in spec:
        return {k: _load(folder, v) for k, v in spec["dict"].items()}
    column = pa.ipc.open_file(pa.memory_map(str(folder / spec["arrow"]))).read_all()["values"]
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
