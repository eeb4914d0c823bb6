"""The per-request table (timeline + metrics + components) as CSV and Parquet.

One row per request, successful or not. Client times are ms since the run's first scheduled
request; durations are ms; missing values are empty (CSV) or null (Parquet), never 0.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from latlab.analysis.decompose import QUALITIES
from latlab.metrics.sessions import tool_ms
from latlab.records.columns import Labels, present
from latlab.records.server_timing import SERVER_TIMING_STAGES
from latlab.records.table import OUTCOMES
from latlab.records.timeline import NS_PER_MS

if TYPE_CHECKING:
    from latlab.analysis.run_analysis import RunAnalysis

EVENTS = ("scheduled", "sent", "headers", "first_token", "last_token", "usage", "done")


def request_table(analysis: RunAnalysis) -> pa.Table:
    """Every request as one row of typed columns."""
    requests = analysis.requests
    t, m, parts = requests.table, requests.metrics, requests.parts
    origins = t.origin_ns[present(t.origin_ns)]
    origin = int(origins.min()) if len(origins) else 0
    i64, f64, text = pa.int64(), pa.float64(), pa.string()

    def numbers(values: np.ndarray, kind: pa.DataType = f64) -> pa.Array:
        missing = np.isnan(values)
        return pa.array(np.where(missing, 0, values), mask=missing).cast(kind)

    def since(event: str) -> pa.Array:  # ms since the run's first scheduled request
        times = t.times[f"{event}_ns"]
        return numbers(np.where(present(times), times - origin, np.nan) / NS_PER_MS)

    def labels(column: Labels) -> pa.Array:
        names = pa.array(list(column.names) or [""], text)
        return names.take(pa.array(column.codes, mask=column.codes < 0))

    outcomes = pa.array(OUTCOMES, text).take(pa.array(t.outcome))
    columns: dict[str, pa.Array] = {
        "id": t.text["id"], "index": pa.array(t.index), "worker": pa.array(t.worker),
        "api": labels(t.api), "tenant": labels(t.tenant),
        "priority": numbers(t.priority, i64), "outcome": outcomes,
        "status": numbers(t.status, i64), "error": t.text["error"],
        "prompt_tokens": numbers(t.prompt_tokens, i64),
        "cached_tokens": numbers(t.cached_tokens, i64),
        "output_tokens": numbers(t.output_tokens, i64),
        "max_tokens": numbers(t.max_tokens, i64),
        "tokens_from_usage": pa.array(t.tokens_from_usage),
        "token_events": pa.array(t.events), "in_flight_at_send": pa.array(requests.in_flight),
        "new_connection": pa.array(t.new_connection, mask=~t.has_connection),
        "pool_wait_ms": numbers(t.phases["pool_wait_ns"] / NS_PER_MS),
        "session": labels(t.session), "turn": numbers(t.step["turn"], i64),
        "tool_ms": numbers(tool_ms(t)), "first_reasoning_ms": since("first_reasoning"),
        "first_answer_ms": since("first_answer"),
    }
    for event in EVENTS:
        columns[f"{event}_ms"] = since(event)
    for name in SERVER_TIMING_STAGES:
        columns[f"server_{name}_ms"] = numbers(np.where(t.has_server, t.server[name], np.nan))
    for name in ("ttft", "ttft_sched", "e2e", "e2e_sched", "tpot", "lateness", "itl_mean",
                 "itl_max"):
        columns[name] = numbers(getattr(m, name))
    qualities = pa.array([str(q) for q in QUALITIES], text)
    for name in parts.ms:  # an application's components too: app:retrieval_ms, ...
        codes = parts.quality[name]
        columns[f"{name}_ms"] = numbers(parts.ms[name])
        columns[f"{name}_quality"] = qualities.take(pa.array(codes.astype(np.int64),
                                                             mask=codes < 0))
    return pa.table(columns)


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
