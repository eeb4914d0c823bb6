"""The per-request table (timeline + metrics + components) as CSV and Parquet.

One row per request, successful or not. Client times are ms since the run's first scheduled
request; durations are ms; missing values are empty (CSV) or null (Parquet), never 0.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import pyarrow as pa

from latlab.analysis.budget import Row
from latlab.analysis.decompose import APP, COMPONENTS
from latlab.metrics.sessions import tool_ms
from latlab.records.timeline import NS_PER_MS, SERVER_TIMING_STAGES

if TYPE_CHECKING:
    from latlab.analysis.analyze import RunAnalysis

EVENTS = ("scheduled", "sent", "headers", "first_token", "last_token", "usage", "done")

Column = tuple[str, pa.DataType, Callable[[Row], Any]]


def _columns(origin_ns: int, rows: list[Row]) -> list[Column]:
    def at(event: str) -> Callable[[Row], float | None]:
        def get(row: Row) -> float | None:
            t = getattr(row.record, f"{event}_ns")
            return None if t is None else (t - origin_ns) / NS_PER_MS
        return get

    def stage(name: str) -> Callable[[Row], float | None]:
        return lambda row: getattr(row.record.server, name) if row.record.server else None

    def part(name: str, quality: bool) -> Callable[[Row], Any]:
        def get(row: Row) -> Any:
            c = row.parts.components.get(name) if row.parts else None
            return None if c is None else (str(c.quality) if quality else c.ms)
        return get

    f64, i64, text, flag = pa.float64(), pa.int64(), pa.string(), pa.bool_()
    columns: list[Column] = [
        ("id", text, lambda row: row.record.id),
        ("index", i64, lambda row: row.record.index),
        ("worker", i64, lambda row: row.record.worker),
        ("api", text, lambda row: row.record.api),
        ("tenant", text, lambda row: row.record.tenant),
        ("priority", i64, lambda row: row.record.priority),
        ("outcome", text, lambda row: str(row.record.outcome)),
        ("status", i64, lambda row: row.record.status),
        ("error", text, lambda row: row.record.error),
        ("prompt_tokens", i64, lambda row: row.record.prompt_tokens),
        ("cached_tokens", i64, lambda row: row.record.cached_tokens),
        ("output_tokens", i64, lambda row: row.record.output_tokens),
        ("max_tokens", i64, lambda row: row.record.max_tokens),
        ("tokens_from_usage", flag, lambda row: row.record.tokens_from_usage),
        ("token_events", i64, lambda row: len(row.record.token_ns)),
        ("in_flight_at_send", i64, lambda row: row.in_flight),
        ("new_connection", flag, lambda row: row.record.connection and row.record.connection.new),
        ("pool_wait_ms", f64, _pool_wait),
        ("session", text, lambda row: row.record.session and row.record.session.id),
        ("turn", i64, lambda row: row.record.session and row.record.session.turn),
        ("tool_ms", f64, lambda row: tool_ms(row.record) if row.record.session else None),
        ("first_reasoning_ms", f64, at("first_reasoning")),
        ("first_answer_ms", f64, at("first_answer")),
    ]
    columns += [(f"{event}_ms", f64, at(event)) for event in EVENTS]
    columns += [(f"server_{name}_ms", f64, stage(name)) for name in SERVER_TIMING_STAGES]
    columns += [(name, f64, lambda row, n=name: getattr(row.metrics, n))
                for name in ("ttft", "ttft_sched", "e2e", "e2e_sched", "tpot", "lateness",
                             "itl_mean")]
    columns.append(("itl_max", f64, lambda row: row.metrics.itl_max))
    names = [*COMPONENTS, *sorted({c for row in rows if row.parts
                                   for c in row.parts.components if c.startswith(APP)})]
    for name in names:  # an application's components: app:retrieval_ms, ...
        columns += [(f"{name}_ms", f64, part(name, False)), (f"{name}_quality", text, part(name, True))]
    return columns


def _pool_wait(row: Row) -> float | None:
    c = row.record.connection
    return None if c is None or c.pool_wait_ns is None else c.pool_wait_ns / NS_PER_MS


def request_table(analysis: RunAnalysis) -> pa.Table:
    """Every request as one row of typed columns."""
    origins = [row.record.origin_ns for row in analysis.rows if row.record.origin_ns is not None]
    columns = _columns(min(origins, default=0), analysis.rows)
    return pa.table({name: pa.array([get(row) for row in analysis.rows], type=kind)
                     for name, kind, get in columns})


def write_csv(analysis: RunAnalysis, path: Path | None = None) -> Path:
    """Write the table as CSV (default: `requests.csv` in the run folder)."""
    from pyarrow import csv

    path = path or analysis.run.path / "requests.csv"
    csv.write_csv(request_table(analysis), path)
    return path


def write_parquet(analysis: RunAnalysis, path: Path | None = None) -> Path:
    """Write the table as Parquet (default: `requests.parquet` in the run folder)."""
    import pyarrow.parquet as pq

    path = path or analysis.run.path / "requests.parquet"
    pq.write_table(request_table(analysis), path)
    return path
