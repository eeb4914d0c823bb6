"""A run's requests with everything derived from them, as columns (`Requests`), and a
request at a time where a report or a test wants one (`Row`, `Rows`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Any, overload

import numpy as np

from latlab.analysis.decompose import Decomposition, Parts
from latlab.metrics.request import MetricColumns, RequestMetrics
from latlab.records.columns import Ragged, present, take
from latlab.records.request_columns import TOKENS
from latlab.records.spill import Spill
from latlab.records.table import RequestTable, as_table
from latlab.records.timeline import RequestTimeline

IN_FLIGHT_BLOCK = 65_536  # requests whose in-flight count is taken at a time


@dataclass(slots=True)
class Row:
    """One request with everything derived from it."""

    record: RequestTimeline
    metrics: RequestMetrics
    parts: Decomposition | None
    in_flight: int  # other requests in flight when it was sent


@dataclass(eq=False)
class Requests:
    """Every request's record, metrics, decomposition and in-flight count at send, as columns."""

    table: RequestTable
    metrics: MetricColumns
    parts: Parts
    in_flight: np.ndarray
    spill: Spill | None = None  # where every column is mapped from (`records.spill`)

    def give_back(self) -> None:
        """The pages the columns read since the last call given back (with a spill)."""
        if self.spill is not None:
            self.spill.give_back()

    def __len__(self) -> int:
        return len(self.table)

    def table_of(self, rows: np.ndarray) -> RequestTable:
        """The requests `rows` (indices) as a table of their own (not named `take`:
        `columns.take` would call it on a `Requests` and get a table back). With a spill, a
        column at a time, each one's pages given back before the next: rows spread over a run
        touch nearly every page of a mapped column (the kernel maps the pages around each
        one read), so the whole table's would be resident at once."""
        if self.spill is None:
            return self.table.take(rows)
        t, columns = self.table, {}
        for f in fields(t):
            if f.name not in TOKENS:
                columns[f.name] = {k: self._taken(v, rows) for k, v in getattr(t, f.name).items()
                                   } if isinstance(getattr(t, f.name), dict) \
                    else self._taken(getattr(t, f.name), rows)
        tokens = self._taken(Ragged(t.token_ns, t.token_offsets), rows)
        counts = self._taken(Ragged(t.token_counts, t.token_offsets), rows)
        return RequestTable(**columns, token_ns=tokens.values, token_counts=counts.values,
                            token_offsets=tokens.offsets)

    def _taken(self, column: Any, rows: np.ndarray) -> Any:
        taken = take(column, rows)
        self.give_back()
        return taken

    def row(self, i: int) -> Row:
        return Row(record=self.table.record(i), metrics=self.metrics.row(i),
                   parts=self.parts.row(i), in_flight=int(self.in_flight[i]))

    def rows(self, which: np.ndarray | None = None) -> Rows:
        """The requests where `which` (a mask) holds, one `Row` at a time (all when None)."""
        return Rows(self, np.arange(len(self)) if which is None else np.flatnonzero(which))

    @property
    def prompt_tokens(self) -> np.ndarray:
        """The server's prompt token count, else the workload's plan (NaN: neither)."""
        return self.prompt_tokens_of(slice(None))

    def prompt_tokens_of(self, rows: np.ndarray | slice) -> np.ndarray:
        """`prompt_tokens` of the requests `rows` only."""
        t = self.table
        counted = t.prompt_tokens[rows]
        return np.where(np.isnan(counted), t.prompt_tokens_planned[rows], counted)


class Rows(Sequence[Row]):
    """Some requests of a run as `Row`s, each built when it is read: cheap to hold for a
    million requests, meant for the few a report shows or a test inspects."""

    def __init__(self, requests: Requests, indices: np.ndarray) -> None:
        self.requests, self.indices = requests, indices

    def __len__(self) -> int:
        return len(self.indices)

    @overload
    def __getitem__(self, i: int) -> Row: ...

    @overload
    def __getitem__(self, i: slice) -> Rows: ...

    def __getitem__(self, i: int | slice) -> Row | Rows:
        if isinstance(i, slice):
            return Rows(self.requests, self.indices[i])
        return self.requests.row(int(self.indices[i]))

    def __iter__(self) -> Iterator[Row]:
        return (self.requests.row(int(i)) for i in self.indices)


def in_flight_at(starts: Sequence[int] | np.ndarray, ends: Sequence[int] | np.ndarray,
                 times: Sequence[int] | np.ndarray) -> np.ndarray:
    """For each time, how many of the intervals `[start, end)` contain it."""
    return (np.searchsorted(np.sort(np.asarray(starts, dtype=np.int64)), times, side="right")
            - np.searchsorted(np.sort(np.asarray(ends, dtype=np.int64)), times, side="right"))


def in_flight_at_send(records: Sequence[RequestTimeline] | RequestTable,
                      spill: Spill | None = None) -> np.ndarray:
    """For each request, how many other requests had been sent and were not finished when it
    was sent (0 for one never sent). With a `spill`, written to it a block of requests at a
    time and mapped back: what is held at once is the sorted send and end times (16 bytes a
    request) and one block."""
    t = as_table(records)
    sent = present(t.sent_ns)
    starts, ends = np.sort(t.sent_ns[sent]), np.sort(t.end_ns[sent])
    del sent
    blocks = []
    column = None if spill is None else spill.column(np.dtype(np.int64))
    for at in range(0, len(t), IN_FLIGHT_BLOCK):
        times = t.sent_ns[at:at + IN_FLIGHT_BLOCK]
        counts = np.searchsorted(starts, times, side="right") \
            - np.searchsorted(ends, times, side="right")
        counts = np.where(present(times), np.maximum(counts - 1, 0), 0)
        if column is None:
            blocks.append(counts)
        else:
            column.write(counts)
            spill.give_back()
    if column is None:
        return np.concatenate(blocks) if blocks else np.zeros(0, np.int64)
    return spill.mapped(column)
