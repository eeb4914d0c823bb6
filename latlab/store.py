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
from typing import Any

import orjson

from latlab.records.folder import RunFolder, RunFolderError

DB_NAME = "latlab.db"
SWEEP_JSON = "sweep.json"

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
    offered_rate REAL
)
"""

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


class RunStore:
    """The index of runs kept in `<runs folder>/latlab.db`."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.root / DB_NAME)
        self._db.execute(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def register(self, path: Path | str, kind: str = "bench",
                 config: dict[str, Any] | None = None,
                 summary: dict[str, Any] | None = None) -> int:
        """Add or refresh one run folder; returns its id."""
        path = Path(path).resolve()
        config = config or {}
        target = config.get("target") or {}
        bench = config.get("bench") or {}
        row = {
            "path": str(path),
            "kind": kind,
            "name": config.get("name") or bench.get("name") or path.name,
            "created": (config.get("clock") or {}).get("unix_time") or time.time(),
            "target": "embedded" if target.get("embedded") else target.get("url"),
            "model": target.get("model"),
            "tags": json.dumps(list(config.get("tags") or bench.get("tags") or [])),
            **key_numbers(summary or {}),
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
        try:
            data = orjson.loads((Path(folder) / SWEEP_JSON).read_bytes())
        except (OSError, orjson.JSONDecodeError) as e:
            raise RunFolderError(f"{folder}: no readable {SWEEP_JSON}: {e}") from None
        points = data.get("points") or []
        requests = sum(p.get("requests") or 0 for p in points)
        ok = sum(round((p.get("requests") or 0) * (1 - (p.get("error_rate") or 0.0)))
                 for p in points)
        config = {"name": Path(folder).name, "target": data.get("target"),
                  "tags": ((data.get("config") or {}).get("bench") or {}).get("tags"),
                  "clock": {"unix_time": data.get("created")}}
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
                self.register(folder, config.get("kind", "bench"), config, run.read_summary())
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
            numbers={k: data[k] for k in KEY_NUMBERS},
        )


def key_numbers(summary: dict[str, Any]) -> dict[str, float | None]:
    """The headline numbers of a summary.json, flat."""
    latency = summary.get("latency") or {}
    throughput = summary.get("throughput") or {}

    def pct(metric: str, name: str) -> float | None:
        value = ((latency.get(metric) or {}).get("percentiles") or {}).get(name, {}).get("value")
        return value if isinstance(value, (int, float)) else None

    return {
        "requests": summary.get("in_window", summary.get("requests")),
        "ok": summary.get("ok"),
        "ttft_p50": pct("ttft", "p50"),
        "ttft_p99": pct("ttft", "p99"),
        "tpot_p50": pct("tpot", "p50"),
        "e2e_p99": pct("e2e", "p99"),
        "output_tokens_per_s": throughput.get("output_tokens_per_s"),
        "achieved_rate": throughput.get("achieved_rate"),
        "offered_rate": throughput.get("offered_rate"),
    }


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
