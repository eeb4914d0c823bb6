"""A run folder: `config.json`, `requests.jsonl` (appended as requests finish), `summary.json`.

    runs/20261121-101500-demo/
        config.json       everything needed to rerun it, plus the clock anchor
        requests.jsonl    one RequestTimeline per line, written as each request finishes
        summary.json      the metrics, written at the end (recomputable from the two above)
        report.html       the self-contained report

Records are appended with one `write()` on an O_APPEND descriptor, so several worker
processes can share the file and a crash loses at most the requests still in flight.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import orjson
import pyarrow as pa

from latlab.records.cache import CACHED_FROM, COLUMNS, load_columns, save_columns, source_key
from latlab.records.config import RunConfig
from latlab.records.files import RunFolderError, read_json, write_json
from latlab.records.reader import read_requests, stream_requests
from latlab.records.scrape import METRICS, Scrape
from latlab.records.spans import SERVER_TIMINGS
from latlab.records.summary import RunSummary
from latlab.records.table import RequestTable
from latlab.records.timeline import RequestTimeline, ServerTiming

CONFIG = "config.json"
REQUESTS = "requests.jsonl"
SUMMARY = "summary.json"
REPORT = "report.html"
STREAMED_FROM = 16 << 20  # bytes of requests.jsonl: about 10,000 records (`CACHED_FROM`) or more


class UnwritableOut(ValueError):
    """`--out` names a place no run folder can be created in (a file, a read-only disk)."""


@dataclass(frozen=True)
class RunFolder:
    path: Path

    @classmethod
    def create(cls, root: Path | str, name: str = "run") -> RunFolder:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "run"
        base = Path(root) / f"{stamp}-{slug}"
        path, n = base, 1
        while True:
            try:
                path.mkdir(parents=True)
                return cls(path)
            except FileExistsError:
                n += 1
                path = base.with_name(f"{base.name}-{n}")
            except OSError as e:
                raise UnwritableOut(f"--out {root}: cannot create a run folder there "
                                    f"({e.strerror or e})") from None

    @classmethod
    def open(cls, path: Path | str) -> RunFolder:
        """The run folder at `path`, or the one holding `path` when it is one of a run's
        files (config.json, requests.jsonl, summary.json, report.html)."""
        path = Path(path)
        if path.is_file():
            if path.name not in (CONFIG, REQUESTS, SUMMARY, REPORT):
                raise RunFolderError(f"{path}: a file, not a run folder (give the folder that "
                                     f"holds {CONFIG} and {REQUESTS})")
            path = path.parent
        run = cls(path)
        if not run.path.is_dir():
            raise RunFolderError(f"{path}: no such run folder")
        if not (run.path / CONFIG).is_file() and not (run.path / REQUESTS).is_file():
            raise RunFolderError(f"{path}: not a latlab run folder (no {CONFIG} or {REQUESTS})")
        return run

    @property
    def config_path(self) -> Path:
        return self.path / CONFIG

    @property
    def requests_path(self) -> Path:
        return self.path / REQUESTS

    @property
    def summary_path(self) -> Path:
        return self.path / SUMMARY

    @property
    def report_path(self) -> Path:
        return self.path / REPORT

    def write_config(self, config: RunConfig) -> None:
        write_json(self.config_path, config)

    def read_config(self) -> RunConfig:
        """config.json; an empty `RunConfig` when the folder has none (records only)."""
        return read_json(self.config_path, RunConfig) if self.config_path.is_file() else RunConfig()

    def write_summary(self, summary: RunSummary) -> None:
        write_json(self.summary_path, summary)

    def read_summary(self) -> RunSummary | None:
        return read_json(self.summary_path, RunSummary) if self.summary_path.is_file() else None

    def record_writer(self) -> RecordWriter:
        return RecordWriter(self.requests_path)

    def torn_bytes(self) -> int:
        """The length of requests.jsonl's torn last line (a record cut off by a crash or a
        kill mid-write, which the readers leave out); 0 when the file ends whole."""
        try:
            with self.requests_path.open("rb") as f:
                size = f.seek(0, os.SEEK_END)
                f.seek(max(0, size - (1 << 20)))
                tail = f.read()
        except FileNotFoundError:
            return 0
        return len(tail) - tail.rfind(b"\n") - 1 if tail else 0

    def iter_records(self, raw: bool = False) -> Iterator[RequestTimeline]:
        """Every complete record; a torn last line (crash mid-write) is skipped. Unless
        `raw`, a request without in-band server timings gets those its spans gave
        (server_timings.jsonl, written by `latlab.load.telemetry.spans.join_run`); an application's
        spans win over the model server's in-band timings its answer relayed."""
        if not self.requests_path.is_file():
            return
        joined = {} if raw else self._joined()
        with self.requests_path.open("rb") as f:
            for number, line in enumerate(f, 1):
                if not line.endswith(b"\n"):
                    break
                try:
                    r = RequestTimeline.from_json(orjson.loads(line))
                except (orjson.JSONDecodeError, TypeError, ValueError) as e:
                    raise RunFolderError(f"{self.requests_path}: line {number}: unreadable "
                                         f"record: {e}") from e
                if r.id in joined:
                    timing, cached = joined[r.id]
                    r.server = (timing if timing is not None and timing.application
                                else r.server or timing)
                    r.cached_tokens = r.cached_tokens if r.cached_tokens is not None else cached
                yield r

    def read_records(self, raw: bool = False) -> list[RequestTimeline]:
        return list(self.iter_records(raw))

    def read_table(self, read_only: bool = False) -> RequestTable:
        """Every complete record as columns (`records.table`), with the server timings its
        spans gave: what the analysis reads, whatever the size of the run. A big run's
        columns are kept in the folder (`records.cache`) and mapped on the next read
        (`read_only`: shared and read-only, their pages given back by `records.spill`); a
        file of `STREAMED_FROM` bytes or more is parsed into them a batch at a time."""
        joined, copy = self.path / SERVER_TIMINGS, self.path / COLUMNS
        key = source_key(self.requests_path, joined)  # before the parse: lines may follow
        table = load_columns(copy, key, read_only)
        if table is not None:
            return table
        try:
            if (key[0][1] or 0) >= STREAMED_FROM:
                try:
                    return stream_requests(self.requests_path, joined, copy, key, read_only)
                except OSError:  # a folder that cannot be written: parsed in memory
                    pass
            table = read_requests(self.requests_path, joined)
        except ValueError as e:  # UnreadableRecords too
            raise RunFolderError(str(e)) from None
        if len(table) >= CACHED_FROM:
            save_columns(table, copy, key)
            # the mapped copy instead: the parse's memory goes back, a page is read when needed
            table = load_columns(copy, key, read_only) or table
            pa.default_memory_pool().release_unused()
        return table

    def read_scrapes(self) -> list[Scrape]:
        """The target's /metrics scrapes (metrics.jsonl), oldest first; [] without any."""
        path = self.path / METRICS
        if not path.is_file():
            return []
        return [Scrape.model_validate_json(line) for line in path.read_bytes().splitlines()
                if line.strip()]

    def _joined(self) -> dict[str, tuple[ServerTiming | None, int | None]]:
        path = self.path / SERVER_TIMINGS
        if not path.is_file():
            return {}
        joined = {}
        for line in path.read_bytes().splitlines():
            data = orjson.loads(line)
            joined[data["id"]] = (ServerTiming.from_json(data.get("server")),
                                  data.get("cached_tokens"))
        return joined


class RecordSink(Protocol):
    """Where a worker puts each record the moment its request ends (and, for a sink that
    must account for requests in flight, when it begins)."""

    def begin(self, record: RequestTimeline) -> None: ...

    def write(self, record: RequestTimeline) -> None: ...

    def close(self) -> None: ...


class RecordWriter:
    """Appends records to `requests.jsonl`, one atomic write per record."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def begin(self, record: RequestTimeline) -> None:
        pass  # a crash loses the requests in flight; the records on disk stay whole

    def write(self, record: RequestTimeline) -> None:
        os.write(self._fd, orjson.dumps(record.to_json(), option=orjson.OPT_APPEND_NEWLINE))

    def write_lines(self, lines: list[bytes]) -> None:
        """Records serialized elsewhere (each a JSON line ending in a newline), in one write."""
        if lines:
            os.write(self._fd, b"".join(lines))

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
