"""Every request of a run as columns (`RequestTable`): what the analysis works on.

One numpy array per field of `RequestTimeline`, in the order the records were written. A
missing client timestamp is `MISSING` (int64 columns, so that nanoseconds stay exact); a
missing count or duration is NaN. Each request's token events sit in one flat column,
`token_ns[token_offsets[i]:token_offsets[i + 1]]`, never one Python object per token.
Strings of few distinct values (node, api, tenant, outcome, the server timings' source) are
codes into their names (`Labels`); the free-form ones (id, error, ...) stay Arrow arrays.

`RunFolder.read_table()` reads a run folder into one (`records.reader`);
`as_table(records)` turns timelines held in memory into the same columns, so small runs and
big ones take one path.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from latlab.records import arrow
from latlab.records.columns import (
    MISSING,
    Labels,
    Ragged,
    concat,
    first_present,
    per_request,
    put,
    take,
    value_of,
)
from latlab.records.request_columns import (
    COUNTS,
    JOINED,
    PHASES,
    SCHEMA,
    STEP_TIMES,
    TEXT,
    TIMES,
    TOKENS,
)
from latlab.records.server_timing import GATEWAY_DURATIONS, SERVER_DURATIONS
from latlab.records.timeline import Outcome, RequestTimeline

OUTCOMES = tuple(str(o) for o in Outcome)  # outcome codes index this; 0 is "ok"

@dataclass(eq=False)
class RequestTable:
    """A run's requests as columns (see the module's docstring)."""

    index: np.ndarray
    worker: np.ndarray
    node: Labels  # the Ray node that sent it (`--ray`)
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
    # SERVER_DURATIONS and GATEWAY_DURATIONS → float64 ms, NaN where absent
    server: dict[str, np.ndarray]
    source: Labels
    has_application: np.ndarray
    application: dict[str, np.ndarray]  # an application's span names → ms, NaN where absent
    token_ns: np.ndarray
    token_counts: np.ndarray
    token_offsets: np.ndarray  # len(self) + 1
    text: dict[str, pa.Array]  # TEXT (a big run's mapped: a ChunkedArray, a chunk a batch)
    has_session: np.ndarray
    session: Labels  # the session's id
    step: dict[str, np.ndarray]  # turn, turns (float, NaN) and STEP_TIMES (int64 ns)
    step_kind: Labels
    tool_error: pa.Array

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
    def one_token_events(self) -> bool:
        """Whether every token event carried one token (the common case), or none."""
        return bool((self.token_counts <= 1).all())

    @cached_property
    def event_tokens(self) -> np.ndarray:
        """The tokens each request's events carried, summed."""
        if self.one_token_events and (self.token_counts == 1).all():
            return self.events
        return per_request(self.token_counts, self.token_offsets)

    @cached_property
    def output_tokens(self) -> np.ndarray:
        """The server's usage count, else the sum of per-event counts (NaN: neither)."""
        counted = np.where(self.events > 0, self.event_tokens, np.nan)
        return np.where(np.isnan(self.completion_tokens), counted, self.completion_tokens)

    def take(self, rows: np.ndarray) -> RequestTable:
        """The requests `rows` (indices), in that order."""
        tokens = Ragged(self.token_ns, self.token_offsets).take(rows)
        counts = Ragged(self.token_counts, self.token_offsets).take(rows)
        return RequestTable(**{f.name: take(getattr(self, f.name), rows) for f in fields(self)
                               if f.name not in TOKENS}, token_ns=tokens.values,
                            token_counts=counts.values, token_offsets=tokens.offsets)

    def block(self, start: int, stop: int) -> RequestTable:
        """The requests `start` to `stop` (exclusive) as views of these columns, not a copy
        (their token events' offsets counted from the block's first)."""
        def part(value: Any) -> Any:
            if isinstance(value, dict):
                return {k: part(v) for k, v in value.items()}
            if isinstance(value, Labels):
                return Labels(value.codes[start:stop], value.names)
            return value[start:stop]  # an array's view, an Arrow array's zero-copy slice

        first, last = self.token_offsets[start], self.token_offsets[stop]
        return RequestTable(**{f.name: part(getattr(self, f.name)) for f in fields(self)
                               if f.name not in TOKENS},
                            token_ns=self.token_ns[first:last],
                            token_counts=self.token_counts[first:last],
                            token_offsets=self.token_offsets[start:stop + 1] - first)

    @classmethod
    def concat(cls, tables: Sequence[RequestTable]) -> RequestTable:
        """Several runs' requests one after the other."""
        tokens = Ragged.concat([Ragged(t.token_ns, t.token_offsets) for t in tables])
        counts = np.concatenate([t.token_counts for t in tables])
        lengths = [len(t) for t in tables]
        return cls(**{f.name: concat([getattr(t, f.name) for t in tables], lengths)
                      for f in fields(cls) if f.name not in TOKENS},
                   token_ns=tokens.values, token_counts=counts, token_offsets=tokens.offsets)

    @classmethod
    def merge(cls, parts: Iterable[RequestTable], order: np.ndarray) -> RequestTable:
        """`concat(parts).take(order)` made a part at a time: each part's requests are
        written straight to their rows (row i takes the `order[i]`-th request of the parts),
        so only one part is held beside the result and `parts` may be read one by one; a
        column no request has takes no memory (a read-only view, `put`). The Arrow and token
        columns are joined at the end."""
        n = len(order)
        rows = np.empty(n, np.int64)
        rows[order] = np.arange(n)
        columns: dict[str, Any] = {}
        joined: dict[str, list[Any]] = {name: [] for name in (*JOINED, *TOKENS)}
        lengths, at = [], 0
        for part in parts:
            into, at = rows[at:at + len(part)], at + len(part)
            lengths.append(len(part))
            if at > n:
                break
            for f in fields(cls):
                value = getattr(part, f.name)
                if f.name in joined:
                    joined[f.name].append(value)
                else:
                    columns[f.name] = put(columns.get(f.name), value, into, n)
            del part, value  # let go before the next part is read
        if at != n or not lengths:
            raise ValueError(f"{n} rows in order, {at} requests in {len(lengths)} parts")
        tokens = Ragged.concat([Ragged(ns, offsets) for ns, offsets in
                                zip(joined.pop("token_ns"), joined.pop("token_offsets"))])
        counts = Ragged(np.concatenate(joined.pop("token_counts")), tokens.offsets)
        taken = tokens.take(order)
        texts = joined.pop("text")  # each part's {name: Arrow column}
        joined |= {name: [text.pop(name) for text in texts] for name in TEXT}
        by_size = sorted(joined, key=lambda name: -sum(c.nbytes for c in joined[name]))
        text = {}
        for name in by_size:  # the largest first, each one's parts let go before the next's
            text[name] = pa.concat_arrays(joined.pop(name)).take(order)
        columns |= {"tool_error": text.pop("tool_error"),
                    "text": {name: text[name] for name in TEXT}}
        return cls(**columns, token_ns=taken.values, token_offsets=taken.offsets,
                   token_counts=counts.take(order).values)

    def record(self, i: int) -> RequestTimeline:
        """Request `i` as a `RequestTimeline` (for the few a report shows one by one)."""
        data: dict[str, Any] = {name: value_of(column[i]) for name, column in
                                (*self.times.items(), *self.counts.items())}
        data |= {name: column[i].as_py() for name, column in self.text.items()}
        lo, hi = self.token_offsets[i], self.token_offsets[i + 1]
        data |= dict(index=int(self.index[i]), worker=int(self.worker[i]), node=self.node[i],
                     api=self.api[i], tenant=self.tenant[i], outcome=OUTCOMES[self.outcome[i]],
                     fitted=bool(self.fitted[i]), retries=int(self.retries[i]),
                     tokens_from_usage=bool(self.tokens_from_usage[i]),
                     token_ns=self.token_ns[lo:hi].tolist(),
                     token_counts=self.token_counts[lo:hi].tolist())
        if self.has_connection[i]:
            data["connection"] = {"new": bool(self.new_connection[i])} | {
                p: value_of(c[i]) for p, c in self.phases.items()}
        if self.has_server[i]:
            data["server"] = {d: value_of(c[i], float) for d, c in self.server.items()} | {
                "source": self.source[i]}
            if self.has_application[i]:
                data["server"]["application"] = {
                    name: float(c[i]) for name, c in self.application.items()
                    if not np.isnan(c[i])}
        if self.has_session[i]:
            data["session"] = {name: value_of(c[i]) for name, c in self.step.items()} | {
                "id": self.session[i], "kind": self.step_kind[i],
                "tool_error": self.tool_error[i].as_py()}
        return RequestTimeline.from_json(data)

    @classmethod
    def from_arrow(cls, table: pa.Table) -> RequestTable:
        """The columns of `table` (of `SCHEMA`'s fields; absent ones are missing)."""
        n = table.num_rows

        def col(name: str) -> pa.Array:
            return (table.column(name) if name in table.column_names
                    else pa.nulls(n, SCHEMA.field(name).type))

        connection, server = arrow.fields_of(col("connection")), arrow.fields_of(col("server"))
        session = arrow.fields_of(col("session"))
        durations = {d: arrow.floats(server[d])
                     for d in (*SERVER_DURATIONS, *GATEWAY_DURATIONS)}
        for values in durations.values():
            values[values < 0] = np.nan  # as ServerTiming.from_json: not a duration
        has_application = server["application"].is_valid().to_numpy(zero_copy_only=False)
        has_server = has_application.copy()
        for name in SERVER_DURATIONS:
            has_server |= ~np.isnan(durations[name])
        outcome = Labels.of(pc.fill_null(col("outcome"), "ok"))
        unknown = set(outcome.names) - set(OUTCOMES)
        if unknown:
            raise ValueError(f"unknown outcome {sorted(unknown)[0]!r}")
        remap = np.array([OUTCOMES.index(name) for name in outcome.names] or [0])
        token_ns, offsets = arrow.lists(col("token_ns"))
        token_counts, _ = arrow.lists(col("token_counts"), np.int32)
        source = Labels.of(server["source"])
        source.codes[~has_server] = -1
        return cls(
            index=arrow.ints(col("index"), 0), worker=arrow.ints(col("worker"), 0),
            node=Labels.of(col("node")), api=Labels.of(pc.fill_null(col("api"), "completions")),
            tenant=Labels.of(col("tenant")),
            outcome=remap[outcome.codes], fitted=arrow.flags(col("fitted")),
            tokens_from_usage=arrow.flags(col("tokens_from_usage")),
            retries=arrow.ints(col("retries"), 0),
            times={t: arrow.ints(col(t), MISSING) for t in TIMES},
            counts={c: arrow.floats(col(c)) for c in COUNTS},
            has_connection=col("connection").is_valid().to_numpy(zero_copy_only=False),
            new_connection=arrow.flags(connection["new"]),
            phases={p: arrow.floats(connection[p]) for p in PHASES},
            has_server=has_server, server=durations, source=source,
            token_ns=token_ns, token_counts=token_counts, token_offsets=offsets,
            text={t: col(t).combine_chunks() if isinstance(col(t), pa.ChunkedArray) else col(t)
                  for t in TEXT},
            has_application=has_application, application=arrow.spans(server["application"]),
            has_session=col("session").is_valid().to_numpy(zero_copy_only=False),
            session=Labels.of(session["id"]), step_kind=Labels.of(session["kind"]),
            step={"turn": arrow.floats(session["turn"]),
                  "turns": arrow.floats(session["turns"])}
            | {t: arrow.ints(session[t], MISSING) for t in STEP_TIMES},
            tool_error=session["tool_error"])


def as_table(records: Sequence[RequestTimeline] | RequestTable) -> RequestTable:
    """The columns of `records` (a table already is)."""
    if isinstance(records, RequestTable):
        return records
    return RequestTable.from_arrow(pa.Table.from_pylist([r.to_json() for r in records],
                                                         schema=SCHEMA))


