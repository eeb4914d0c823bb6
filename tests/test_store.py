from pathlib import Path

import pytest

from latlab.records.config import RunConfig
from latlab.records.folder import RunFolder, RunFolderError, write_json
from latlab.records.summary import Distribution, Percentile, RunSummary
from latlab.records.sweep import Point, SweepRecord, SweepStop
from latlab.store import RunStore, key_numbers, resolve_run


def make_run(root: Path, name: str, target: str, tags: list[str], ttft_p99: float) -> RunFolder:
    run = RunFolder.create(root, name)
    run.write_config(RunConfig.model_validate({"name": name, "tags": tags,
                                               "target": {"url": target, "model": "tiny"}}))
    p99 = Percentile(value=ttft_p99, ci_low=None, ci_high=None, reliable=False)
    run.write_summary(RunSummary(requests=10, in_window=10, ok=9,
                                 latency={"ttft": Distribution(n=10, percentiles={"p99": p99})}))
    return run


def test_register_list_filter_and_resolve(tmp_path):
    a = make_run(tmp_path, "a", "http://127.0.0.1:1", ["nightly"], 50.0)
    b = make_run(tmp_path, "b", "http://127.0.0.1:2", [], 70.0)
    with RunStore(tmp_path) as store:
        id_a = store.register(a.path, "bench", a.read_config(), key_numbers(a.read_summary()))
        id_b = store.register(b.path, "bench", b.read_config(), key_numbers(b.read_summary()))
        assert id_a != id_b
        assert store.register(a.path, "bench", a.read_config(), {}) == id_a  # refresh keeps id
        assert [r.name for r in store.list(tag="nightly")] == ["a"]
        assert [r.name for r in store.list(target=":2")] == ["b"]
        assert store.get(id_b).numbers["ttft_p99"] == 70.0
    assert resolve_run(str(id_b), tmp_path) == b.path.resolve()
    assert resolve_run(str(a.path), tmp_path) == a.path
    with pytest.raises(RunFolderError, match="no run with id 99"):
        resolve_run("99", tmp_path)


def test_rescan_finds_unregistered_runs(tmp_path):
    make_run(tmp_path, "x", "t", [], 1.0)
    make_run(tmp_path, "y", "t", [], 2.0)
    with RunStore(tmp_path) as store:
        assert store.rescan() == 2
        assert store.rescan() == 0
        assert len(store.list()) == 2


def test_runs_command_lists_and_filters(tmp_path):
    from typer.testing import CliRunner

    from latlab.cli import app

    make_run(tmp_path, "alpha", "http://127.0.0.1:1", ["nightly"], 50.0)
    make_run(tmp_path, "beta", "http://127.0.0.1:2", [], 70.0)
    cli = CliRunner()
    empty = cli.invoke(app, ["runs", "--runs-dir", str(tmp_path)])
    assert empty.exit_code == 0 and "no runs stored yet" in empty.output
    listed = cli.invoke(app, ["runs", "--runs-dir", str(tmp_path), "--rescan"])
    assert "alpha" in listed.output and "beta" in listed.output
    tagged = cli.invoke(app, ["runs", "--runs-dir", str(tmp_path), "--tag", "nightly"])
    assert "alpha" in tagged.output and "beta" not in tagged.output
    none = cli.invoke(app, ["runs", "--runs-dir", str(tmp_path), "--kind", "sweep"])
    assert none.exit_code == 0 and "no stored run matches" in none.output


def test_rescan_finds_sweeps_by_their_sweep_json(tmp_path):

    folder = tmp_path / "20261121-120000-sweep-x"
    folder.mkdir()
    points = [Point(label=str(n), mode="rate", load=n, achieved=n, error_rate=e, requests=n,
                    latency=None, median_latency=None, slo_values={}, output_tokens_per_s=0.0)
              for n, e in ((10, 0.0), (20, 0.5))]
    write_json(folder / "sweep.json", SweepRecord(
        created=1.0, target={"url": "http://127.0.0.1:1", "model": "m"},
        config={"bench": {"tags": ["t"]}}, percentile=99.0, points=points,
        stop=SweepStop(reason="all_points", message="")))
    with RunStore(tmp_path) as store:
        assert store.rescan() == 1
        (run,) = store.list(kind="sweep")
        assert run.numbers["requests"] == 30 and run.numbers["ok"] == 20 and run.tags == ["t"]


def test_a_store_from_before_the_status_column_is_migrated(tmp_path):
    import sqlite3

    from latlab.store import _SCHEMA

    old = _SCHEMA.replace(",\n    status TEXT", "")
    with sqlite3.connect(tmp_path / "latlab.db") as db:
        db.execute(old)
        db.execute("INSERT INTO runs (path, kind, name, requests, ok) VALUES ('x', 'bench', "
                   "'old', 4, 4)")
    run = make_run(tmp_path, "failed", "http://127.0.0.1:1", [], 1.0)
    with RunStore(tmp_path) as store:
        store.register(run.path, "bench", run.read_config(), {"requests": 5, "ok": 0})
        assert {r.name: r.status for r in store.list()} == {"old": "ok", "failed": "failed"}
