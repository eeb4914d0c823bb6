"""Traces of real traffic, read lazily: each request's time, prompt and output lengths, prompt
blocks (`hash_ids`), session and labels, whatever the file's format.

    for row in Trace(Path("conversation_trace.jsonl")):   # in time order, one row at a time
        row.time_s, row.prompt_tokens, row.hash_ids

The format is told by the file: a folder is a latlab run (its requests as they were
scheduled); a JSON-lines file whose first row has `input_length` is Mooncake's (FAST'25:
`timestamp` ms, `input_length`, `output_length`, `hash_ids`), else latlab's own (`timestamp`
s or `timestamp_ms`, optional `prompt_tokens`, `output_tokens`, `hash_ids`, `session`, `turn`,
`tenant`, `priority`); a CSV by its header: Azure's LLM inference traces (`TIMESTAMP`,
`ContextTokens`, `GeneratedTokens`) or BurstGPT's (`Timestamp`, `Request tokens`, `Response
tokens`, and `Session ID` in its v2 files). A row that cannot be read is an error naming the
file, the line and the field; a row asking for 0 tokens (BurstGPT's and Azure's failed
requests) is skipped and counted. Rows out of time order are sorted in passing, as far as
`REORDER` rows; further than that is an error.
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from latlab.load.workload import trace_formats as formats
from latlab.load.workload.trace_rows import BLOCK_TOKENS, TraceError, TraceRow, TraceSource, scaled
from latlab.load.workload.trace_runs import run_rows
from latlab.records.arrivals import ArrivalConfig

__all__ = ["BLOCK_TOKENS", "Trace", "TraceCursor", "TraceError", "TraceRow", "Replayed",
           "window", "replay_window", "scaled", "block_tokens", "survey"]
REORDER = 10_000  # rows out of time order sorted in passing
SNIFF_BYTES = 1 << 16


class Trace(TraceSource):
    """A trace file (or run folder): its format, and its rows in time order, read lazily.
    `skipped` counts the rows left out, by reason, as far as the rows have been read."""

    def __init__(self, path: Path | str) -> None:
        super().__init__(path)
        self.format, self._rows = _detect(self)

    def __iter__(self) -> Iterator[TraceRow]:
        pending: list[tuple[float, int, TraceRow]] = []
        last = None
        for row in self._rows(self):
            heapq.heappush(pending, (row.time_s, row.row, row))
            if len(pending) > REORDER:
                last = self._emit(heapq.heappop(pending)[2], last)
                yield last
        while pending:
            last = self._emit(heapq.heappop(pending)[2], last)
            yield last

    def _emit(self, row: TraceRow, last: TraceRow | None) -> TraceRow:
        if last is not None and row.time_s < last.time_s:
            raise self.error(row.line, "timestamp", f"is {last.time_s - row.time_s:g} s before "
                             f"line {last.line}'s, more than {REORDER:,} rows out of time "
                             "order: sort the trace by time")
        return row


def _detect(trace: Trace) -> tuple[str, formats.Rows]:
    path = trace.path
    if path.is_dir():
        return "run", run_rows
    try:
        with trace.open() as f:
            head = f.read(SNIFF_BYTES)
    except (OSError, EOFError) as e:
        raise TraceError(f"{trace.where}: cannot read it: "
                         f"{getattr(e, 'strerror', None) or e}") from None
    first = next((line for line in head.splitlines() if line.strip()), b"").strip()
    if not first:
        raise TraceError(f"{trace.where}: empty: no requests in it")
    if first.startswith(b"{"):
        return formats.jsonl_format(trace, first)
    return formats.csv_format(trace, first.decode("utf-8", "replace"))


@dataclass(slots=True)
class Replayed:
    """A trace's request in a replay's window: when it goes (seconds from the window's
    first request, at --trace-speed), and its row, `since` seconds after the trace's first
    request."""

    offset_s: float
    since_s: float
    row: TraceRow


def window(trace: Trace, start_s: float = 0.0, speed: float = 1.0) -> Iterator[Replayed]:
    """The rows from `start_s` seconds into the trace on, the first at offset 0, the gaps
    between them divided by `speed`."""
    first = origin = None
    for row in trace:
        if first is None:
            first = row.time_s
        since = row.time_s - first
        if since < start_s:
            continue
        if origin is None:
            origin = since
        yield Replayed((since - origin) / speed, since, row)


def replay_window(arrivals: ArrivalConfig, duration_s: float | None = None,
                  requests: int | None = None) -> tuple[Trace, Iterator[Replayed]]:
    """The trace of `arrivals` and its replay's window: from --trace-start, at --trace-speed,
    until `duration_s` (seconds of replay) or `requests`."""
    trace = Trace(arrivals.trace)

    def rows() -> Iterator[Replayed]:
        count = 0
        for replayed in window(trace, arrivals.trace_start_s, arrivals.trace_speed):
            if (requests is not None and count >= requests) or (
                    duration_s is not None and replayed.offset_s >= duration_s):
                return
            count += 1
            yield replayed

    return trace, rows()


def block_tokens(scale: float) -> int:
    """The tokens of one hash id's block under --length-scale."""
    return scaled(BLOCK_TOKENS, scale)


class TraceCursor:
    """One process's pass over a replay's window (`arrivals`: --trace and its shape): the
    requests' offsets in order, and request `i` on demand. The last `KEEP` requests read are
    kept; an earlier one reads the trace again. Opening it reads up to --trace-start, before
    the run's clock starts."""

    KEEP = 4096

    def __init__(self, arrivals: ArrivalConfig, duration_s: float | None = None) -> None:
        self.arrivals = arrivals
        self.duration_s = duration_s
        self._turns: dict[str, int] | None = None
        self._open()

    def _open(self) -> None:
        a = self.arrivals
        self.trace = Trace(a.trace)
        self._rows = window(self.trace, a.trace_start_s, a.trace_speed)
        self._kept: deque[Replayed] = deque(maxlen=self.KEEP)
        self._read = 0
        self.first = self._next()

    def _next(self) -> Replayed | None:
        replayed = next(self._rows, None)
        if replayed is not None:
            self._kept.append(replayed)
            self._read += 1
        return replayed

    def get(self, index: int) -> Replayed | None:
        """The window's request `index` (0: its first); None past the trace's end."""
        if index < self._read - len(self._kept):
            self._open()
        while self._read <= index:
            if self._next() is None:
                return None
        return self._kept[index - (self._read - len(self._kept))]

    def offsets(self) -> Iterator[float]:
        """Every request's offset (s) from the window's start, in order."""
        index = 0
        while (replayed := self.get(index)) is not None:
            yield replayed.offset_s
            index += 1

    def turns(self, session: str) -> int:
        """How many requests of `session` the window holds (one pass over the window, the
        first time a session is asked about)."""
        if self._turns is None:
            counts: Counter[str] = Counter()
            for replayed in replay_window(self.arrivals, self.duration_s)[1]:
                if replayed.row.session is not None:
                    counts[replayed.row.session] += 1
            self._turns = dict(counts)
        return self._turns.get(session, 1)


@dataclass
class Survey:
    """A replay's window read once through: its requests, the last one's offset, the
    trace's format, whether it gives lengths, and what it skipped."""

    requests: int
    span_s: float
    format: str
    lengths: bool
    skipped: str | None


def survey(arrivals: ArrivalConfig, duration_s: float | None = None,
           requests: int | None = None) -> Survey:
    """Read the window (--trace-start, then --duration or --requests) through, so that a bad
    row is an error before the run; what it holds."""
    trace, rows = replay_window(arrivals, duration_s, requests)
    count, span, lengths = 0, 0.0, False
    for replayed in rows:
        count, span = count + 1, replayed.offset_s
        lengths = lengths or replayed.row.prompt_tokens is not None
    return Survey(count, span, trace.format, lengths, trace.describe_skipped())
