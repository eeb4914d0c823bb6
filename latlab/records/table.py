"""Every request of a run as columns (`RequestTable`): what the analysis works on.

One numpy array per field of `RequestTimeline`, in the order the records were written. A
missing client timestamp is `MISSING` (int64 columns, so that nanoseconds stay exact); a
missing count or duration is NaN. Each request's token events sit in one flat column,
`token_ns[token_offsets[i]:token_offsets[i + 1]]`, never one Python object per token.
Strings of few distinct values (api, tenant, outcome, the server timings' source) are codes
into their names (`Labels`); the free-form ones (id, error, ...) stay Arrow arrays.

`RunFolder.read_table()` reads a run folder into one (`records.reader`);
`as_table(records)` turns timelines held in memory into the same columns, so small runs and
big ones take one path.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from latlab.records.timeline import SERVER_DURATIONS, Outcome, RequestTimeline

MISSING = np.iinfo(np.int64).min
TIMES = ("scheduled_ns", "sent_ns", "headers_ns", "first_token_ns", "last_token_ns", "usage_ns",
         "done_ns")
COUNTS = ("prompt_tokens_planned", "max_tokens", "priority", "status", "prompt_tokens",
          "cached_tokens", "completion_tokens")
PHASES = ("pool_wait_ns", "dns_ns", "connect_ns", "tls_ns")
TEXT = ("id", "error", "server_request_id", "trace_id")
OUTCOMES = tuple(str(o) for o in Outcome)  # outcome codes index this; 0 is "ok"

_i64, _f64, _str, _bool = pa.int64(), pa.float64(), pa.string(), pa.bool_()
SCHEMA = pa.schema(
    [("id", _str), ("index", _i64), ("worker", _i64), ("api", _str),
     ("prompt_tokens_planned", _i64), ("max_tokens", _i64), ("fitted", _bool),
     ("tenant", _str), ("priority", _i64), *((t, _i64) for t in TIMES),
     ("connection", pa.struct([("new", _bool), *((p, _i64) for p in PHASES)])),
     ("token_ns", pa.list_(_i64)), ("token_counts", pa.list_(_i64)), ("outcome", _str),
     ("status", _i64), ("error", _str), ("prompt_tokens", _i64), ("cached_tokens", _i64),
     ("completion_tokens", _i64), ("tokens_from_usage", _bool),
     ("server", pa.struct([*((d, _f64) for d in SERVER_DURATIONS), ("source", _str)])),
     ("server_request_id", _str), ("trace_id", _str), ("retries", _i64)])


@dataclass(eq=False)
class Labels:
    """A string column of few distinct values: `codes` index `names`, −1 where missing."""

    codes: np.ndarray
    names: tuple[str, ...]

    def __getitem__(self, i: int) -> str | None:
        code = int(self.codes[i])
        return None if code < 0 else self.names[code]

    def mask(self, name: str) -> np.ndarray:
        """Where the column holds `name`."""
        code = self.names.index(name) if name in self.names else -2
        return self.codes == code

    @classmethod
    def of(cls, column: pa.ChunkedArray | pa.Array) -> Labels:
        encoded = pc.dictionary_encode(column)
        if isinstance(encoded, pa.ChunkedArray):
            encoded = encoded.unify_dictionaries().combine_chunks() if encoded.num_chunks \
                else pa.DictionaryArray.from_arrays(pa.array([], pa.int32()), pa.array([], _str))
        codes = encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int32)
        return cls(codes, tuple(encoded.dictionary.to_pylist()))


@dataclass(eq=False)
class RequestTable:
    """A run's requests as columns (see the module's docstring)."""

    index: np.ndarray
    worker: np.ndarray
    api: Labels
    tenant: Labels
    outcome: np.ndarray  # codes into OUTCOMES
    fitted: np.ndarray
    tokens_from_usage: np.ndarray
    retries: np.ndarray
    times: dict[str, np.ndarray]  # TIMES → int64 ns, MISSING where absent
    counts: dict[str, np.ndarray]  # COUNTS → float64, NaN where absent
    has_connection: np.ndarray
    new_connection: np.ndarray
    phases: dict[str, np.ndarray]  # PHASES → float64 ns, NaN where absent
    has_server: np.ndarray
    server: dict[str, np.ndarray]  # SERVER_DURATIONS → float64 ms, NaN where absent
    source: Labels
    token_ns: np.ndarray
    token_counts: np.ndarray
    token_offsets: np.ndarray  # len(self) + 1
    text: dict[str, pa.Array]  # TEXT

    def __len__(self) -> int:
        return len(self.index)

    def __getattr__(self, name: str) -> np.ndarray:
        """A timestamp or count column by its record field's name (`sent_ns`, `prompt_tokens`)."""
        for group in ("times", "counts"):
            columns = self.__dict__.get(group, {})
            if name in columns:
                return columns[name]
        raise AttributeError(name)

    @cached_property
    def ok(self) -> np.ndarray:
        return self.outcome == 0

    @cached_property
    def origin_ns(self) -> np.ndarray:
        """When each request's clock starts: its scheduled time, else its send time."""
        return first_present(self.scheduled_ns, self.sent_ns)

    @cached_property
    def end_ns(self) -> np.ndarray:
        """`RequestTimeline.end_ns`: its end, else its last sign of life (MISSING: never sent)."""
        return first_present(self.done_ns, self.last_token_ns, self.headers_ns, self.sent_ns)

    @cached_property
    def events(self) -> np.ndarray:
        """The number of token events of each request."""
        return np.diff(self.token_offsets)

    @cached_property
    def event_tokens(self) -> np.ndarray:
        """The tokens each request's events carried, summed."""
        return per_request(self.token_counts, self.token_offsets)

    @cached_property
    def output_tokens(self) -> np.ndarray:
        """The server's usage count, else the sum of per-event counts (NaN: neither)."""
        counted = np.where(self.events > 0, self.event_tokens, np.nan)
        return np.where(np.isnan(self.completion_tokens), counted, self.completion_tokens)

    def tokens(self, i: int) -> np.ndarray:
        return self.token_ns[self.token_offsets[i]:self.token_offsets[i + 1]]

    def record(self, i: int) -> RequestTimeline:
        """Request `i` as a `RequestTimeline` (for the few a report shows one by one)."""
        data: dict[str, Any] = {name: _value(column[i]) for name, column in
                                (*self.times.items(), *self.counts.items())}
        data |= {name: column[i].as_py() for name, column in self.text.items()}
        lo, hi = self.token_offsets[i], self.token_offsets[i + 1]
        data |= dict(index=int(self.index[i]), worker=int(self.worker[i]), api=self.api[i],
                     tenant=self.tenant[i], outcome=OUTCOMES[self.outcome[i]],
                     fitted=bool(self.fitted[i]), retries=int(self.retries[i]),
                     tokens_from_usage=bool(self.tokens_from_usage[i]),
                     token_ns=self.token_ns[lo:hi].tolist(),
                     token_counts=self.token_counts[lo:hi].tolist())
        if self.has_connection[i]:
            data["connection"] = {"new": bool(self.new_connection[i])} | {
                p: _value(c[i]) for p, c in self.phases.items()}
        if self.has_server[i]:
            data["server"] = {d: _value(c[i], float) for d, c in self.server.items()} | {
                "source": self.source[i]}
        return RequestTimeline.from_json(data)

    @classmethod
    def from_arrow(cls, table: pa.Table) -> RequestTable:
        """The columns of `table` (of `SCHEMA`'s fields; absent ones are missing)."""
        n = table.num_rows
        col = (lambda name: table.column(name) if name in table.column_names
               else pa.nulls(n, SCHEMA.field(name).type))
        connection, server = _struct(col("connection")), _struct(col("server"))
        durations = {d: _floats(server[d]) for d in SERVER_DURATIONS}
        for values in durations.values():
            values[values < 0] = np.nan  # as ServerTiming.from_json: not a duration
        has_server = np.zeros(n, bool)
        for values in durations.values():
            has_server |= ~np.isnan(values)
        outcome = Labels.of(pc.fill_null(col("outcome"), "ok"))
        unknown = set(outcome.names) - set(OUTCOMES)
        if unknown:
            raise ValueError(f"unknown outcome {sorted(unknown)[0]!r}")
        remap = np.array([OUTCOMES.index(name) for name in outcome.names] or [0])
        token_ns, offsets = _lists(col("token_ns"))
        token_counts, _ = _lists(col("token_counts"), np.int32)
        source = Labels.of(server["source"])
        source.codes[~has_server] = -1
        return cls(
            index=_ints(col("index"), 0), worker=_ints(col("worker"), 0),
            api=Labels.of(pc.fill_null(col("api"), "completions")), tenant=Labels.of(col("tenant")),
            outcome=remap[outcome.codes], fitted=_flags(col("fitted")),
            tokens_from_usage=_flags(col("tokens_from_usage")), retries=_ints(col("retries"), 0),
            times={t: _ints(col(t), MISSING) for t in TIMES},
            counts={c: _floats(col(c)) for c in COUNTS},
            has_connection=col("connection").is_valid().to_numpy(zero_copy_only=False),
            new_connection=_flags(connection["new"]),
            phases={p: _floats(connection[p]) for p in PHASES},
            has_server=has_server, server=durations, source=source,
            token_ns=token_ns, token_counts=token_counts, token_offsets=offsets,
            text={t: col(t).combine_chunks() if isinstance(col(t), pa.ChunkedArray) else col(t)
                  for t in TEXT})


def as_table(records: Sequence[RequestTimeline] | RequestTable) -> RequestTable:
    """The columns of `records` (a table already is)."""
    if isinstance(records, RequestTable):
        return records
    return RequestTable.from_arrow(pa.Table.from_pylist([r.to_json() for r in records],
                                                         schema=SCHEMA))


def present(values: np.ndarray) -> np.ndarray:
    """Where an int64 timestamp column holds a time."""
    return values != MISSING


def first_present(*columns: np.ndarray) -> np.ndarray:
    """Per row, the first of `columns` that holds a time (MISSING when none does)."""
    out = columns[-1].copy()
    for column in reversed(columns[:-1]):
        out = np.where(present(column), column, out)
    return out


def ms_between(later: np.ndarray, earlier: np.ndarray) -> np.ndarray:
    """Milliseconds from `earlier` to `later` per row; NaN where either is missing."""
    both = present(later) & present(earlier)
    return np.where(both, (np.where(both, later, 0) - np.where(both, earlier, 0)) / 1e6, np.nan)


def per_request(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """The sum of each request's slice of a flat per-token column (0 for an empty one)."""
    out = np.zeros(len(offsets) - 1, np.int64 if values.dtype.kind in "iub" else float)
    filled = offsets[1:] > offsets[:-1]
    if filled.any():
        out[filled] = np.add.reduceat(values, offsets[:-1][filled], dtype=out.dtype)
    return out


def _value(v: Any, kind: type = int) -> Any:
    if isinstance(v, np.floating):
        return None if np.isnan(v) else kind(v)
    return None if v == MISSING else int(v)


def _struct(column: pa.ChunkedArray | pa.Array) -> dict[str, pa.Array]:
    """A struct column's fields, missing where the struct is."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    return {field.name: values for field, values in zip(array.type, array.flatten())}


def _ints(column: pa.ChunkedArray | pa.Array, missing: int) -> np.ndarray:
    return np.asarray(pc.fill_null(column, missing).to_numpy(), dtype=np.int64)


def _floats(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return np.array(pc.cast(column, _f64).to_numpy(zero_copy_only=False), dtype=float)


def _flags(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return np.asarray(pc.fill_null(column, False).to_numpy(zero_copy_only=False), dtype=bool)


def _lists(column: pa.ChunkedArray | pa.Array, dtype: type = np.int64
           ) -> tuple[np.ndarray, np.ndarray]:
    """A list column as its flat values and offsets (a missing list is empty), copied once."""
    lengths = _ints(pc.list_value_length(column), 0)
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.empty(offsets[-1], dtype)
    at = 0
    for chunk in column.chunks if isinstance(column, pa.ChunkedArray) else [column]:
        values = chunk.flatten().to_numpy(zero_copy_only=False)
        flat[at:at + len(values)] = values
        at += len(values)
    return flat, offsets
