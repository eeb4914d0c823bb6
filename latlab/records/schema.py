"""JSON Schemas of every file of a run folder, for other tools that read latlab's output.

    python -m latlab.records.schema docs/schema     # what `make schema` runs

`tests/test_records.py` fails when the committed schemas differ from the models.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from latlab.records import SCHEMA_VERSION
from latlab.records.ab import ABRecord
from latlab.records.calibration import Calibration
from latlab.records.coldstart import ColdstartRecord
from latlab.records.config import RunConfig
from latlab.records.observe import ObservedWindow, ObserveRecord
from latlab.records.steps import StepRecord
from latlab.records.summary import RunSummary
from latlab.records.sweep import SweepRecord
from latlab.records.timeline import RequestTimeline

FILES: dict[str, Any] = {
    "config": RunConfig,            # config.json
    "request": RequestTimeline,     # each line of requests.jsonl
    "summary": RunSummary,          # summary.json
    "sweep": SweepRecord,           # sweep.json
    "coldstart": ColdstartRecord,   # coldstart.json
    "calibration": Calibration,     # a calibration (`latlab calibrate`)
    "ab": ABRecord,                 # ab.json
    "step": StepRecord,             # each line of a `latlab serve --step-log` file
    "observe": ObserveRecord,       # observe.json (`latlab observe`)
    "window": ObservedWindow,       # each line of windows.jsonl (`latlab observe`)
}


def schemas() -> dict[str, dict[str, Any]]:
    """`{name: JSON Schema}` of each file, as it is written (serialization mode)."""
    out = {}
    for name, model in FILES.items():
        schema = TypeAdapter(model).json_schema(mode="serialization")
        schema["title"] = f"latlab {name} (schema version {SCHEMA_VERSION})"
        out[name] = schema
    return out


def export(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, schema in schemas().items():
        path = folder / f"{name}.schema.json"
        path.write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        written.append(path)
    return written


if __name__ == "__main__":
    for path in export(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/schema")):
        print(f"wrote {path}")
