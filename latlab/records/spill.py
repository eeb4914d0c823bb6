"""A big run's per-request columns kept in files and mapped, their pages given back between
the steps that read them (`Spill`): what lets the end of `latlab observe` work over every
call of a run of any length, exactly, with what is resident at once bounded by one step's
columns rather than by all of them.

A column mapped from a file is read a page at a time as it is used, and those pages stay
resident (counted in the process's memory) until they are given back: `give_back` does so
for every column the spill holds, and the next read reads them again from the page cache.
The run's own columns come from its kept copy (`records.cache`), mapped read-only
(`RunFolder.read_table(read_only=True)`, so no write can be lost); the columns derived from
them (metrics, decomposition, ...) are written here, a block at a time where they are made
so (`column`), else whole (`keep`), and mapped back read-only. A column of one value
throughout stays a read-only view of that value (no file, no memory a request).

    with Spill(folder) as spill:
        spill.adopt(table)              # the run's mapped columns, given back with the rest
        ttft = spill.keep(ttft)         # a derived column, now a read-only mapping
        spill.give_back()               # between two steps
"""

from __future__ import annotations

import ctypes
import mmap
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from latlab.records.cache import RawColumn, load_column
from latlab.records.columns import Labels
from latlab.records.scratch import OwnedFolder

ARROW_SUFFIX = ".arrow"  # a kept copy's string columns (`records.cache`)
_libc = ctypes.CDLL(None, use_errno=True)


class Spill:
    """Columns in files of `folder` (made on entry, removed on exit; one a killed process
    left is removed by the next that clears its stale folders: `records.scratch`), and the
    mappings of every column to give back (see the module's docstring)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._owned = OwnedFolder(folder)
        self._mappings: list[mmap.mmap] = []
        self._ranges: list[tuple[int, int]] = []  # Arrow files' mappings: address ranges
        self._held: list[pa.Array | pa.ChunkedArray] = []  # ... kept mapped while given back
        self._files = 0

    def __enter__(self) -> Spill:
        self._owned.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._mappings.clear()
        self._ranges.clear()
        self._held.clear()
        self._owned.__exit__(*exc)  # removed: a mapping outlives its file's name

    def adopt(self, value: Any) -> None:
        """Give back, with the spill's own, the pages of every column of `value` (a table, a
        dataclass, a dict or an array) that is mapped read-only from a file; one in memory,
        or mapped copy-on-write (its changes would be lost), is left alone."""
        if isinstance(value, dict):
            for v in value.values():
                self.adopt(v)
        elif isinstance(value, Labels):
            self.adopt(value.codes)
        elif isinstance(value, (pa.Array, pa.ChunkedArray)):
            self._adopt_arrow(value)
        elif isinstance(value, np.ndarray):
            mapping = _mapping(value)
            if mapping is not None and all(m is not mapping for m in self._mappings):
                self._mappings.append(mapping)
        elif hasattr(value, "__dataclass_fields__"):
            for f in fields(value):
                self.adopt(getattr(value, f.name))

    def _adopt_arrow(self, column: pa.Array | pa.ChunkedArray) -> None:
        """An Arrow column's file mappings (a kept copy's strings, `records.cache`): each
        one its buffers lie in, held (so that it stays mapped while given back) and given
        back whole; a column in memory is left alone."""
        files = _file_mappings()
        for chunk in column.chunks if isinstance(column, pa.ChunkedArray) else [column]:
            for buffer in chunk.buffers():
                if buffer is None or not buffer.size:
                    continue
                found = next((m for m in files if m[0] <= buffer.address < m[1]), None)
                if found is not None and found not in self._ranges:
                    self._ranges.append(found)
        self._held.append(column)

    def keep(self, column: np.ndarray) -> np.ndarray:
        """`column` (one request's value each) written to a file and mapped back read-only;
        a view of one value, an empty column, or one mapped read-only already, as it is."""
        if column.ndim != 1 or not len(column) or column.strides == (0,) \
                or _mapping(column) is not None:
            self.adopt(column)
            return column
        writer = self.column(column.dtype)
        writer.write(column)
        return self.mapped(writer)

    def column(self, dtype: np.dtype) -> RawColumn:
        """A column to write a block at a time (`write`), then map (`mapped`)."""
        self._files += 1
        return RawColumn(self.folder / f"{self._files}.raw", dtype)

    def mapped(self, column: RawColumn) -> np.ndarray:
        """The column written, mapped read-only (a read-only view of its one value when it
        holds only that)."""
        column.close()
        values = load_column(self.folder, column.spec(), read_only=True)
        self.adopt(values)
        return values

    def give_back(self) -> None:
        """Every mapped column's resident pages let go of (read again when next used)."""
        for mapping in self._mappings:
            if not mapping.closed:
                mapping.madvise(mmap.MADV_DONTNEED)
        for start, end in self._ranges:
            _libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start),
                          mmap.MADV_DONTNEED)


def _file_mappings() -> list[tuple[int, int]]:
    """The address ranges of this process's read-only mappings of Arrow IPC files."""
    ranges = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields_ = line.split(maxsplit=5)
        if len(fields_) == 6 and fields_[1].startswith("r-") \
                and fields_[5].endswith(ARROW_SUFFIX):
            start, end = fields_[0].split("-")
            ranges.append((int(start, 16), int(end, 16)))
    return ranges


def _mapping(column: np.ndarray) -> mmap.mmap | None:
    """The read-only shared mapping `column` is a view of, if any."""
    base: Any = column
    while base is not None:
        mapping = getattr(base, "_mmap", None)  # np.memmap's mapping of its file
        if isinstance(mapping, mmap.mmap):
            return mapping if getattr(base, "mode", None) == "r" else None
        base = getattr(base, "base", None)
    return None
