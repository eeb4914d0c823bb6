"""A latlab run folder read as a trace: its requests as they were scheduled, each with the
prompt it sent (the server's count, else the one planned), the output it got (or asked for
when it failed), its session, labels and — a replayed trace's request — its prompt blocks.

The records are read as a few columns (DuckDB), sorted by schedule, and given one row at a
time; a run holds one record per request it sent, so the columns are what the run was."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from latlab.load.workload.trace_rows import TraceError, TraceRow, TraceSource
from latlab.records.files import RunFolderError
from latlab.records.folder import REQUESTS, RunFolder
from latlab.records.reader import UnreadableRecords, read_jsonl

_i64, _str = pa.int64(), pa.string()
COLUMNS = pa.schema([
    ("index", _i64), ("scheduled_ns", _i64), ("sent_ns", _i64), ("outcome", _str),
    ("prompt_tokens", _i64), ("prompt_tokens_planned", _i64), ("completion_tokens", _i64),
    ("max_tokens", _i64), ("tenant", _str), ("priority", _i64), ("api", _str),
    ("session", pa.struct([("id", _str), ("turn", _i64)])),
    ("trace", pa.struct([("hash_ids", pa.list_(_i64))]))])


def run_rows(src: TraceSource) -> Iterator[TraceRow]:
    """The requests of the run folder `src.path`, in the order they were scheduled."""
    try:
        RunFolder.open(src.path)
        table = read_jsonl(src.path / REQUESTS, COLUMNS)
    except (RunFolderError, UnreadableRecords, OSError) as e:
        raise TraceError(f"{src.where}: {e}") from None
    if not table.num_rows:
        raise TraceError(f"{src.where}: the run holds no requests")
    col = {name: table.column(name).to_pylist() for name in COLUMNS.names}
    origin = [s if s is not None else t for s, t in zip(col["scheduled_ns"], col["sent_ns"])]
    timed = [i for i, t in enumerate(origin) if t is not None]
    order = np.asarray(timed)[np.argsort([origin[i] for i in timed], kind="stable")]
    for i in order.tolist():
        ok = col["outcome"][i] in (None, "ok")
        prompt = col["prompt_tokens"][i] or col["prompt_tokens_planned"][i]
        output = (col["completion_tokens"][i] if ok else None) or col["max_tokens"][i]
        if not prompt or not output:
            src.skip("requests without a prompt or output length")
            continue
        session, trace = col["session"][i] or {}, col["trace"][i] or {}
        # the server's count is the model's whole input: `api` says so (TraceRow.api)
        api = (col["api"][i] or "completions") if col["prompt_tokens"][i] else None
        yield TraceRow(col["index"][i] if col["index"][i] is not None else i, i + 1,
                       origin[i] / 1e9, prompt, output, trace.get("hash_ids") or None,
                       session.get("id"), session.get("turn"), col["tenant"][i],
                       col["priority"][i], api)
