"""The trace files latlab reads, one reader per format, each streaming its rows in the file's
order (`traces.Trace` sorts and windows them).

    Mooncake (FAST'25)  {"timestamp": ms, "input_length": N, "output_length": N, "hash_ids": [...]}
                        (and latlab's optional labels below, as `latlab trace --export` writes)
    latlab              {"timestamp": s | "timestamp_ms": ms, "prompt_tokens": N,
                         "output_tokens": N, "hash_ids": [...], "session": ID, "turn": N,
                         "tenant": NAME, "priority": N, "api": API}
                        (all but the time optional; with `api` the prompt's count is the
                        server's, the model's whole input: a replay through a chat API does
                        not add its chat template to it again)
    Azure LLM (2023/24) TIMESTAMP,ContextTokens,GeneratedTokens   (dates; extra columns ignored)
    BurstGPT            Timestamp,[Session ID,Elapsed time,]Model,Request tokens,
                        Response tokens,Total tokens,Log Type     (seconds)
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any, get_args

import orjson

from latlab.load.workload.trace_rows import TraceRow, TraceSource
from latlab.records.workload import Api

Rows = Callable[[TraceSource], Iterator[TraceRow]]
ZERO = "rows asking for 0 tokens (failed requests in the source)"
APIS = get_args(Api)
AZURE = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT = ("Timestamp", "Request tokens", "Response tokens")
SESSION_ID = "Session ID"  # BurstGPT v2: empty on its API logs


def jsonl_format(src: TraceSource, first: bytes) -> tuple[str, Rows]:
    """Mooncake's JSONL when the first row has `input_length`, else latlab's."""
    try:
        row = orjson.loads(first)
    except orjson.JSONDecodeError as e:
        raise src.error(1, "(line)", f"is not JSON ({e})") from None
    if isinstance(row, dict) and "input_length" in row:
        return "mooncake", _mooncake
    if isinstance(row, dict) and ("timestamp" in row or "timestamp_ms" in row):
        return "latlab", _latlab
    raise src.error(1, "timestamp", "is missing: expected Mooncake's JSONL (`timestamp` ms, "
                    "`input_length`, `output_length`, `hash_ids`) or latlab's (`timestamp` s "
                    "or `timestamp_ms`, with optional `prompt_tokens` and `output_tokens`)")


def csv_format(src: TraceSource, header: str) -> tuple[str, Rows]:
    """Azure's or BurstGPT's CSV, told by its header."""
    names = [n.strip().lstrip("\ufeff") for n in next(csv.reader([header]))]
    if all(n in names for n in AZURE):
        return "azure", _azure
    if all(n in names for n in BURSTGPT):
        return "burstgpt", _burstgpt
    raise src.error(1, "(header)", f"is {','.join(names)[:120]!r}: not a trace latlab reads "
                    f"(Mooncake or latlab JSONL; Azure's CSV: {','.join(AZURE)}; BurstGPT's: "
                    f"{','.join(BURSTGPT)})")


def _json_rows(src: TraceSource) -> Iterator[tuple[int, dict[str, Any]]]:
    with src.open() as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError as e:
                raise src.error(n, "(line)", f"is not JSON ({e})") from None
            if not isinstance(row, dict):
                raise src.error(n, "(line)", "is not a JSON object")
            yield n, row


def _mooncake(src: TraceSource) -> Iterator[TraceRow]:
    """Mooncake's rows; latlab's optional labels too (`latlab trace --export` writes them)."""
    turns: dict[str, int] = {}
    for i, (n, row) in enumerate(_json_rows(src)):
        prompt = _count(src, n, "input_length", row.get("input_length"), required=True)
        output = _count(src, n, "output_length", row.get("output_length"), required=True)
        time = _number(src, n, "timestamp", row.get("timestamp"), "ms") / 1e3
        if prompt and output:
            yield _labelled(src, n, row, turns,
                            TraceRow(i, n, time, prompt, output, _ids(src, n, row.get("hash_ids"))))
        else:
            src.skip(ZERO)


def _latlab(src: TraceSource) -> Iterator[TraceRow]:
    turns: dict[str, int] = {}
    for i, (n, row) in enumerate(_json_rows(src)):
        if "timestamp" in row:
            time = _number(src, n, "timestamp", row["timestamp"], "seconds")
        else:
            time = _number(src, n, "timestamp_ms", row.get("timestamp_ms"), "ms") / 1e3
        prompt = _count(src, n, "prompt_tokens", row.get("prompt_tokens"))
        output = _count(src, n, "output_tokens", row.get("output_tokens"))
        if prompt == 0 or output == 0:
            src.skip(ZERO)
            continue
        yield _labelled(src, n, row, turns,
                        TraceRow(i, n, time, prompt, output, _ids(src, n, row.get("hash_ids"))))


def _labelled(src: TraceSource, n: int, row: dict[str, Any], turns: dict[str, int],
              out: TraceRow) -> TraceRow:
    """`out` with the row's session (its turn counted when not given), tenant, priority and
    API."""
    session = row.get("session")
    if session is not None:
        out.session = str(session)
        turn = row.get("turn")
        if turn is not None and (not _is_int(turn) or turn < 1):
            raise src.error(n, "turn", f"must be a positive integer (got {turn!r})")
        out.turn = turns[out.session] = turn or turns.get(out.session, 0) + 1
    if row.get("tenant") is not None:
        out.tenant = str(row["tenant"])
    priority = row.get("priority")
    if priority is not None and not _is_int(priority):
        raise src.error(n, "priority", f"must be an integer (got {priority!r})")
    out.priority = priority
    api = row.get("api")
    if api is not None and api not in APIS:
        raise src.error(n, "api", f"must be one of {', '.join(APIS)} (got {api!r})")
    out.api = api
    return out


def _csv_rows(src: TraceSource) -> Iterator[tuple[int, dict[str, str]]]:
    with src.open(text=True) as f:
        reader = csv.reader(f)
        names = [n.strip() for n in next(reader)]
        for values in reader:
            if not values or not any(v.strip() for v in values):
                continue
            if len(values) < len(names):
                raise src.error(reader.line_num, names[len(values)], "is missing: the row has "
                                f"{len(values)} of the header's {len(names)} columns")
            yield reader.line_num, dict(zip(names, values))


def _azure(src: TraceSource) -> Iterator[TraceRow]:
    for i, (n, row) in enumerate(_csv_rows(src)):
        prompt = _count(src, n, "ContextTokens", _int_text(row["ContextTokens"]), required=True)
        output = _count(src, n, "GeneratedTokens", _int_text(row["GeneratedTokens"]),
                        required=True)
        time = _date(src, n, "TIMESTAMP", row["TIMESTAMP"])
        if prompt and output:
            yield TraceRow(i, n, time, prompt, output)
        else:
            src.skip(ZERO)


def _burstgpt(src: TraceSource) -> Iterator[TraceRow]:
    turns: dict[str, int] = {}
    for i, (n, row) in enumerate(_csv_rows(src)):
        prompt = _count(src, n, "Request tokens", _int_text(row["Request tokens"]),
                        required=True)
        output = _count(src, n, "Response tokens", _int_text(row["Response tokens"]),
                        required=True)
        time = _number(src, n, "Timestamp", _float_text(row["Timestamp"]), "seconds")
        if not (prompt and output):
            src.skip(ZERO)
            continue
        out = TraceRow(i, n, time, prompt, output)
        session = (row.get(SESSION_ID) or "").strip()
        if session:
            out.session = session
            out.turn = turns[session] = turns.get(session, 0) + 1
        yield out


def _count(src: TraceSource, line: int, field: str, value: Any, required: bool = False
           ) -> int | None:
    """A token count: an integer, 0 or more (0: the row is skipped)."""
    if value is None and not required:
        return None
    if not _is_int(value) or value < 0:
        shown = "missing" if value is None else f"{value!r}"
        raise src.error(line, field, f"must be a token count, 0 or more (got {shown})")
    return value


def _number(src: TraceSource, line: int, field: str, value: Any, unit: str) -> float:
    if (not isinstance(value, (int, float)) or isinstance(value, bool)
            or not math.isfinite(value)):
        shown = "missing" if value is None else f"{value!r}"
        raise src.error(line, field, f"must be a number of {unit} (got {shown})")
    return float(value)


def _date(src: TraceSource, line: int, field: str, text: str) -> float:
    """Seconds since the epoch of an ISO date; one without a zone is UTC."""
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise src.error(line, field, f"must be a date like 2023-11-16 18:15:46.68 (got "
                        f"{text!r})") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def _ids(src: TraceSource, line: int, value: Any) -> list[int] | None:
    if value is None:
        return None
    if (not isinstance(value, list) or not all(type(h) is int for h in value)
            or (value and min(value) < 0)):
        raise src.error(line, "hash_ids", "must be a list of block ids (integers, 0 or more)")
    return value or None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_text(text: str) -> Any:
    """A CSV cell as an integer (`512` or `512.0`), else the text (for the error)."""
    try:
        number = float(text)
    except ValueError:
        return text
    return int(number) if number.is_integer() else text


def _float_text(text: str) -> Any:
    try:
        return float(text)
    except ValueError:
        return text
