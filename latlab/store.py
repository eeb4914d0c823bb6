"""The run store: a small SQLite index of every run and sweep under a runs folder.

`latlab runs` lists it; `latlab compare` resolves run ids through it. The run folders stay
the source of truth: the store only keeps where they are and their key numbers, and can be
rebuilt from them with `RunStore.rescan()`.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from latlab.records.config import RunConfig
from latlab.records.folder import RunFolder, RunFolderError, read_json
from latlab.records.summary import RunSummary
from latlab.records.sweep import SWEEP_JSON, SweepRecord

DB_NAME = "latlab.db"
KINDS = ("bench", "sweep", "coldstart", "predict", "observed")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    path TEXT UNIQUE NOT NULL,
    kind TEXT NOT NULL,
    name TEXT,
    created REAL,
    target TEXT,
    model TEXT,
    tags TEXT,
    requests INTEGER,
    ok INTEGER,
    ttft_p50 REAL,
    ttft_p99 REAL,
    tpot_p50 REAL,
    e2e_p99 REAL,
    output_tokens_per_s REAL,
    achieved_rate REAL,
    offered_rate REAL,
    status TEXT
)
"""
ADDED_COLUMNS = {"status": "TEXT"}  # columns newer than the oldest stores: added on open

KEY_NUMBERS = ("requests", "ok", "ttft_p50", "ttft_p99", "tpot_p50", "e2e_p99",
               "output_tokens_per_s", "achieved_rate", "offered_rate")


@dataclass(frozen=True)
class StoredRun:
    id: int
    path: Path
    kind: str
    name: str | None
    created: float | None
    target: str | None
    model: str | None
    tags: list[str]
    numbers: dict[str, float | None]
    status: str = "ok"  # ok, failed (no request succeeded), interrupted, did not start


class RunStore:
    """The index of runs kept in `<runs folder>/latlab.db`."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.root / DB_NAME)
        with self._db:
            self._db.execute(_SCHEMA)
            have = {row[1] for row in self._db.execute("PRAGMA table_info(runs)")}
            for column, kind in ADDED_COLUMNS.items():
                if column not in have:
                    self._db.execute(f"ALTER TABLE runs ADD COLUMN {column} {kind}")

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def register(self, path: Path | str, kind: str, config: RunConfig,
                 numbers: dict[str, float | None], summary: RunSummary | None = None) -> int:
        """Add or refresh one run folder with its key numbers; returns its id."""
        path = Path(path).resolve()
        target = config.target
        bench = config.bench
        row = {
            "path": str(path),
            "kind": kind,
            "name": config.name or (bench.name if bench else None) or path.name,
            "created": config.clock.unix_time or time.time(),
            "target": "embedded" if target.embedded else target.url,
            "model": target.model,
            "tags": json.dumps(list(config.tags or (bench.tags if bench else []))),
            **{k: numbers.get(k) for k in KEY_NUMBERS},
            "status": run_status(config, numbers, summary),
        }
        columns = ", ".join(row)
        placeholders = ", ".join("?" for _ in row)
        updates = ", ".join(f"{k}=excluded.{k}" for k in row if k != "path")
        with self._db:
            self._db.execute(
                f"INSERT INTO runs ({columns}) VALUES ({placeholders}) "
                f"ON CONFLICT(path) DO UPDATE SET {updates}",
                tuple(row.values()),
            )
        return self._db.execute("SELECT id FROM runs WHERE path=?", (str(path),)).fetchone()[0]

    def list(self, target: str | None = None, model: str | None = None,
             tag: str | None = None, kind: str | None = None, limit: int = 50) -> list[StoredRun]:
        query, args = "SELECT * FROM runs WHERE 1=1", []
        for column, value in (("target", target), ("model", model), ("kind", kind)):
            if value:
                query += f" AND {column} LIKE ?"
                args.append(f"%{value}%")
        query += " ORDER BY created DESC, id DESC"
        rows = [self._row(r) for r in self._db.execute(query, args)]
        if tag:
            rows = [r for r in rows if tag in r.tags]
        return rows[:limit]

    def get(self, id: int) -> StoredRun | None:
        row = self._db.execute("SELECT * FROM runs WHERE id=?", (id,)).fetchone()
        return self._row(row) if row else None

    def register_sweep(self, folder: Path | str) -> int:
        """Add or refresh a sweep folder from its sweep.json; returns its id."""
        sweep = read_json(Path(folder) / SWEEP_JSON, SweepRecord)
        requests = sum(p.requests for p in sweep.points)
        ok = sum(round(p.requests * (1 - p.error_rate)) for p in sweep.points)
        config = RunConfig.model_validate({
            "name": Path(folder).name, "target": sweep.target.model_dump(exclude_defaults=True),
            "tags": (sweep.config.get("bench") or {}).get("tags") or [],
            "clock": {"unix_time": sweep.created}})
        return self.register(folder, "sweep", config, {"requests": requests, "ok": ok})

    def rescan(self) -> int:
        """Register every run and sweep folder under the root that is missing; returns how many."""
        known = {r[0] for r in self._db.execute("SELECT path FROM runs")}
        added = 0
        for sweep_path in sorted(self.root.glob(f"**/{SWEEP_JSON}")):
            if str(sweep_path.parent.resolve()) not in known:
                self.register_sweep(sweep_path.parent)
                added += 1
        for config_path in sorted(self.root.glob("**/config.json")):
            folder = config_path.parent.resolve()
            if str(folder) in known:
                continue
            try:
                run = RunFolder.open(folder)
                config = run.read_config()
                summary = run.read_summary()
                self.register(folder, config.kind, config, key_numbers(summary) if summary
                              else _counts(run), summary)
                added += 1
            except RunFolderError:
                continue
        return added

    def _row(self, row: tuple) -> StoredRun:
        names = [d[0] for d in self._db.execute("SELECT * FROM runs LIMIT 0").description]
        data = dict(zip(names, row))
        return StoredRun(
            id=data["id"], path=Path(data["path"]), kind=data["kind"], name=data["name"],
            created=data["created"], target=data["target"], model=data["model"],
            tags=json.loads(data["tags"] or "[]"),
            numbers={k: data[k] for k in KEY_NUMBERS}, status=data["status"] or "ok",
        )


def run_status(config: RunConfig, numbers: dict[str, float | None],
               summary: RunSummary | None) -> str:
    """How a run ended, in the words `latlab runs` shows."""
    if config.failed is not None:
        return "did not start"
    if summary is not None and summary.stop_reason == "interrupted":
        return "interrupted"
    return "ok" if numbers.get("ok") else "failed"


def key_numbers(summary: RunSummary) -> dict[str, float | None]:
    """The headline numbers of a run's summary, flat."""
    t = summary.throughput
    return {
        "requests": summary.in_window,
        "ok": summary.ok,
        "ttft_p50": summary.percentile("ttft", "p50"),
        "ttft_p99": summary.percentile("ttft", "p99"),
        "tpot_p50": summary.percentile("tpot", "p50"),
        "e2e_p99": summary.percentile("e2e", "p99"),
        "output_tokens_per_s": t.output_tokens_per_s if t else None,
        "achieved_rate": t.achieved_rate if t else None,
        "offered_rate": t.offered_rate if t else None,
    }


def _counts(run: RunFolder) -> dict[str, float | None]:
    records = run.read_records()
    return {"requests": len(records), "ok": sum(r.ok for r in records)}


def resolve_run(ref: str, root: Path | str = "runs") -> Path:
    """A run given as a folder path, or as an id in the store under `root`."""
    path = Path(ref)
    if path.is_dir():
        return path
    if ref.isdigit() and (Path(root) / DB_NAME).is_file():
        with RunStore(root) as store:
            run = store.get(int(ref))
        if run:
            return run.path
        raise RunFolderError(f"no run with id {ref} in {Path(root) / DB_NAME} (see `latlab runs`)")
    raise RunFolderError(f"{ref}: neither a run folder nor a run id in {Path(root) / DB_NAME}")
