"""The one schema of a run folder: files written before it still load, what is written
reads back the same, and docs/schema/ matches the models."""

import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from latlab.analysis import analyze
from latlab.analysis.compare import compare
from latlab.cli import app
from latlab.records.coldstart import COLDSTART_JSON, ColdstartRecord
from latlab.records.folder import RunFolder, read_json, write_json
from latlab.records.schema import schemas
from latlab.records.sweep import SWEEP_JSON, SweepRecord
from latlab.store import RunStore

LEGACY = Path(__file__).parent / "fixtures" / "legacy-0.1.0"  # written by latlab 0.1.0
DOCS = Path(__file__).parent.parent / "docs" / "schema"


def test_a_run_written_before_the_schema_still_loads_and_reports(tmp_path):
    run = RunFolder.open(shutil.copytree(LEGACY / "bench", tmp_path / "bench"))
    config, summary = run.read_config(), run.read_summary()
    assert config.kind == "bench" and config.bench.requests == 24
    assert config.target.model == "tiny" and config.slos == {"ttft": 500.0}
    assert summary.ok == 24 and summary.client.workers == 1
    assert summary.percentile("ttft", "p99") > 0 and summary.goodput.good == 24
    table = run.read_table()  # what the analysis reads: the same records, as columns
    assert [table.record(i) for i in range(len(table))] == run.read_records()
    a = analyze(run)
    assert not a.summary_recomputed and a.mean.n == 24 and a.has_server_timings
    assert compare(a, analyze(run)).workload_differences == []
    result = CliRunner().invoke(app, ["report", str(run.path)])
    assert result.exit_code == 0, result.output
    assert "Where the time goes" in result.output and run.report_path.is_file()


def test_a_sweep_and_a_coldstart_written_before_the_schema_still_load(tmp_path):
    sweep = read_json(LEGACY / "sweep" / SWEEP_JSON, SweepRecord)
    assert [p.load for p in sweep.points] == [2.0, 4.0] and sweep.slo_max is not None
    cold = read_json(LEGACY / "coldstart" / COLDSTART_JSON, ColdstartRecord)
    assert cold.runs[0].warm.n == 2 and cold.summary["excess_ttft"].n == 1
    shutil.copytree(LEGACY, tmp_path / "runs")
    with RunStore(tmp_path / "runs") as store:
        assert store.rescan() == 5  # the bench, the sweep, its two points, the coldstart
        kinds = sorted(r.kind for r in store.list())
    assert kinds == ["bench", "bench", "bench", "coldstart", "sweep"]


def test_every_file_reads_back_as_written(tmp_path):
    for name in ("sweep/sweep.json", "coldstart/coldstart.json", "bench/summary.json",
                 "bench/config.json"):
        model = {"sweep.json": SweepRecord, "coldstart.json": ColdstartRecord}.get(
            Path(name).name)
        run = RunFolder(LEGACY / Path(name).parent)
        record = (read_json(LEGACY / name, model) if model else
                  run.read_summary() if name.endswith("summary.json") else run.read_config())
        write_json(tmp_path / "x.json", record)
        assert read_json(tmp_path / "x.json", type(record)) == record


def test_the_published_json_schemas_match_the_models():
    for name, schema in schemas().items():
        published = json.loads((DOCS / f"{name}.schema.json").read_text())
        assert published == json.loads(json.dumps(schema)), (
            f"docs/schema/{name}.schema.json is stale: run python -m latlab.records.schema")
