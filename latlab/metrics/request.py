"""The per-request metrics, exactly as the catalog (`records.catalog`) defines them, computed
for every request of a `RequestTable` at once (`metric_columns`); `request_metrics` gives one
request's as a `RequestMetrics`."""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from latlab.records.catalog import metrics
from latlab.records.columns import BLOCK, Ragged, ms_between, one_value, per_request
from latlab.records.spill import Spill
from latlab.records.table import RequestTable, as_table
from latlab.records.timeline import RequestTimeline

METRICS = metrics(per_request=True)
BLOCK_ROWS = 1 << 16  # requests whose metrics a spilled pass makes at a time
RAGGED = ("itl", "chunk_gaps")


@dataclass(slots=True)
class RequestMetrics:
    """TTFT, E2E (from send and from schedule), TPOT, the longest ITL, ITL and gaps; `None`
    where undefined."""

    ttft: float | None
    ttft_sched: float | None
    e2e: float | None
    e2e_sched: float | None
    tpot: float | None
    itl_max: float | None
    lateness: float | None
    itl: list[float]
    chunk_gaps: list[float]
    output_tokens: int | None

    @property
    def itl_mean(self) -> float | None:
        return sum(self.itl) / len(self.itl) if self.itl else None


@dataclass(eq=False)
class MetricColumns:
    """Every request's metrics (NaN where undefined), ITL and inter-chunk gaps per request."""

    ttft: np.ndarray
    ttft_sched: np.ndarray
    e2e: np.ndarray
    e2e_sched: np.ndarray
    tpot: np.ndarray
    lateness: np.ndarray
    output_tokens: np.ndarray
    itl: Ragged
    chunk_gaps: Ragged

    def __len__(self) -> int:
        return len(self.ttft)

    @property
    def itl_mean(self) -> np.ndarray:
        counts = self.itl.lengths
        return np.where(counts > 0, self.itl.sums() / np.maximum(counts, 1), np.nan)

    @property
    def itl_max(self) -> np.ndarray:
        return self.itl.maxima()

    def row(self, i: int) -> RequestMetrics:
        def value(column: np.ndarray) -> float | None:
            return None if np.isnan(column[i]) else float(column[i])

        tokens = value(self.output_tokens)
        return RequestMetrics(**{m: value(getattr(self, m)) for m in METRICS},
                              itl=self.itl[i].tolist(), chunk_gaps=self.chunk_gaps[i].tolist(),
                              output_tokens=None if tokens is None else int(tokens))


def metric_columns(t: RequestTable, spill: Spill | None = None) -> MetricColumns:
    """The metrics of every request of `t`; with a `spill`, made a block of requests at a
    time, each column written to it (`records.spill`): a block's intermediate columns, not
    the run's, and no column in memory."""
    if spill is not None:
        return _spilled(t, spill)
    ok = t.ok
    tokens = t.output_tokens
    # one event carrying every token (a non-streamed answer) times no token after the first
    tpot = np.where(ok & (tokens >= 2) & (t.events != 1),
                    ms_between(t.last_token_ns, t.first_token_ns)
                    / np.maximum(tokens - 1, 1), np.nan)
    gaps, itl = _gaps(t)
    ttft = ms_between(t.first_token_ns, t.sent_ns)
    e2e = np.where(ok, ms_between(t.done_ns, t.sent_ns), np.nan)
    # sent when scheduled (an observed call, whose start is both): from schedule is from send
    on_time = np.array_equal(t.sent_ns, t.scheduled_ns)
    return MetricColumns(
        ttft=ttft, ttft_sched=ttft if on_time else ms_between(t.first_token_ns, t.scheduled_ns),
        e2e=e2e, e2e_sched=e2e if on_time else
        np.where(ok, ms_between(t.done_ns, t.scheduled_ns), np.nan),
        tpot=tpot, lateness=one_value(ms_between(t.sent_ns, t.scheduled_ns)),
        output_tokens=tokens, itl=itl, chunk_gaps=gaps)


def _spilled(t: RequestTable, spill: Spill) -> MetricColumns:
    names = [f.name for f in fields(MetricColumns) if f.name not in RAGGED]
    columns = {name: spill.column(np.float64) for name in names}
    itl, gaps = [], []
    for lo in range(0, max(len(t), 1), BLOCK_ROWS):
        block = metric_columns(t.block(lo, min(lo + BLOCK_ROWS, len(t))))
        for name in names:
            columns[name].write(getattr(block, name))
        itl.append(block.itl)
        gaps.append(block.chunk_gaps)
        del block
        spill.give_back()  # the block's pages of the run's columns
    shared = all(i is g for i, g in zip(itl, gaps))  # one token an event: the gaps are the ITL
    chunk_gaps = _kept(Ragged.concat(gaps), spill)
    return MetricColumns(**{name: spill.mapped(column) for name, column in columns.items()},
                         chunk_gaps=chunk_gaps,
                         itl=chunk_gaps if shared else _kept(Ragged.concat(itl), spill))


def _kept(column: Ragged, spill: Spill) -> Ragged:
    return Ragged(spill.keep(column.values), spill.keep(column.offsets))


def _gaps(t: RequestTable) -> tuple[Ragged, Ragged]:
    """The gaps between each request's token events (ms), and its ITL: the gap before an
    event carrying k tokens gives k samples of gap/k."""
    offsets = t.token_offsets
    inside = np.ones(max(len(t.token_ns) - 1, 0), bool)  # gaps within one request
    starts = offsets[1:-1]
    inside[starts[(starts > 0) & (starts < len(t.token_ns))] - 1] = False
    gaps = _within(t.token_ns, inside)
    gap_offsets = np.zeros(len(offsets), np.int64)
    np.cumsum(np.maximum(np.diff(offsets) - 1, 0), out=gap_offsets[1:])
    chunk_gaps = Ragged(gaps, gap_offsets)
    if t.one_token_events:  # the gaps are the ITL samples
        return chunk_gaps, chunk_gaps
    k = np.maximum(t.token_counts[1:][inside], 1)
    itl_offsets = np.zeros(len(offsets), np.int64)
    np.cumsum(per_request(k, gap_offsets), out=itl_offsets[1:])
    return chunk_gaps, Ragged(np.repeat(gaps / k, k), itl_offsets)


def _within(token_ns: np.ndarray, inside: np.ndarray) -> np.ndarray:
    """`np.diff(token_ns)[inside] / 1e6`, a block at a time (a big run has 10⁸ stamps)."""
    gaps = np.empty(np.count_nonzero(inside))
    kept = 0
    for start in range(0, len(inside), BLOCK):
        block = np.diff(token_ns[start:start + BLOCK + 1])[inside[start:start + BLOCK]] / 1e6
        gaps[kept:kept + len(block)] = block
        kept += len(block)
    return gaps


def request_metrics(r: RequestTimeline) -> RequestMetrics:
    """One request's metrics (the same columns, of one row)."""
    return metric_columns(as_table([r])).row(0)
