"""What goes to disk: one typed, versioned schema for every file of a run folder.

    config.json       `config.RunConfig`          requests.jsonl   `timeline.RequestTimeline`
    summary.json      `summary.RunSummary`        sweep.json       `sweep.SweepRecord`
    coldstart.json    `coldstart.ColdstartRecord`  calibration.json `calibration.Calibration`

`folder.RunFolder` reads and writes them; `schema.export` writes their JSON Schemas to
docs/schema/ so other tools can read latlab's output. A file without `schema_version` was
written by latlab 0.1, whose shape is version 1.
"""

SCHEMA_VERSION = 1
