"""Where `latlab observe` keeps its open windows' calls until they close: on disk, in the run
folder's `.open-windows/`, so that memory does not grow with the calls a window holds.

Each window's calls (their JSON lines, requests.jsonl's) are appended to segment files of at
most `SEGMENT_CALLS` calls, their start times kept (8 bytes a call); a closing window is read
back a segment at a time (by the run's own reader, DuckDB), each segment's calls written
straight to their rows of the window's columns in start order (`RequestTable.merge`), so that
a close holds the window's columns and one segment; its files are removed. The directory goes
when observe ends (the duration, Ctrl-C, SIGTERM, an error). A process killed outright
(SIGKILL, out of memory) leaves it, and the end's `end.scratch/` (`observe_end`): the next
observe with the same --out removes what a dead observe left (`clear_stale`; neither holds a
call that is not in its run's requests.jsonl). A live observe holds a lock on each
(`records.scratch`), which the system releases when its process dies, so only a dead one's
is removed.

    with Scratch(run.path) as scratch:
        scratch.append(key, lines, starts)  # the calls of window `key`, as they come
        table = scratch.take(key)           # its calls as columns in start order; files removed
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import numpy as np
import pyarrow as pa

from latlab.records.columns import one_valued
from latlab.records.reader import read_requests
from latlab.records.request_columns import SCHEMA
from latlab.records.scratch import OwnedFolder
from latlab.records.scratch import clear_stale as clear_folders
from latlab.records.table import RequestTable

DIRECTORY = ".open-windows"
END_SCRATCH = "end.scratch"  # the end's derived columns (`observe_end`)
SEGMENT_CALLS = 10_000  # calls per file: what one parse holds (about 9 MB of JSON lines)
# What a window's analysis never reads (a report's rows do: the end reads the whole run),
# left out of its columns (missing): the bulk of their strings.
UNREAD = ("id", "server_request_id", "trace_id")
READ = pa.schema([f for f in SCHEMA if f.name not in UNREAD])


@dataclass(slots=True)
class _Segments:
    files: list[Path] = field(default_factory=list)
    in_last: int = 0  # calls in the last file
    starts: list[np.ndarray] = field(default_factory=list)  # each call's start (ns), in order


class Scratch:
    def __init__(self, run_path: Path) -> None:
        self.path = run_path / DIRECTORY
        self._windows: dict[int, _Segments] = {}
        self._folder = OwnedFolder(self.path)

    def __enter__(self) -> Scratch:
        self._folder.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._folder.__exit__(*exc)
        self._windows.clear()

    def append(self, key: int, lines: list[bytes], starts: list[int]) -> None:
        """The calls `lines` (JSON lines) of window `key`, and when each started
        (`origin_ns`)."""
        segments = self._windows.setdefault(key, _Segments())
        segments.starts.append(np.array(starts, np.int64))
        while lines:
            if not segments.files or segments.in_last >= SEGMENT_CALLS:
                segments.files.append(self.path / f"{key}-{len(segments.files)}.jsonl")
                segments.in_last = 0
            room = SEGMENT_CALLS - segments.in_last
            with open(segments.files[-1], "ab") as f:
                f.write(b"".join(lines[:room]))
            segments.in_last += len(lines[:room])
            lines = lines[room:]

    def take(self, key: int) -> RequestTable:
        """Window `key`'s calls as columns (but `UNREAD`), in start order (the window is the
        same whatever order its calls arrived in), a column of one value throughout (a field
        every call shares: its worker, outcome, API, ...) a view of it; its files removed."""
        segments = self._windows.pop(key)
        order = np.argsort(np.concatenate(segments.starts), kind="stable")
        try:
            table = RequestTable.merge((read_requests(path, schema=READ)
                                        for path in segments.files), order)
        finally:
            for path in segments.files:
                path.unlink(missing_ok=True)
        return replace(table, **{f.name: one_valued(getattr(table, f.name))
                                 for f in fields(table)})


def clear_stale(out: Path) -> list[Path]:
    """Remove the open windows' and the end's scratch folders that observes no longer running
    left in the run folders of `out`; the run folders they were in."""
    left = sorted([*out.glob(f"*/{DIRECTORY}"), *out.glob(f"*/{END_SCRATCH}")])
    return sorted({folder.parent for folder in clear_folders(left)})
