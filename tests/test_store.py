from pathlib import Path

import pytest

from latlab.records.folder import RunFolder, RunFolderError
from latlab.store import RunStore, resolve_run


def make_run(root: Path, name: str, target: str, tags: list[str], ttft_p99: float) -> RunFolder:
    run = RunFolder.create(root, name)
    run.write_config({"bench": {"name": name, "tags": tags},
                      "target": {"url": target, "model": "tiny"}})
    run.write_summary({"in_window": 10, "ok": 9,
                       "latency": {"ttft": {"percentiles": {"p99": {"value": ttft_p99}}}},
                       "throughput": {"output_tokens_per_s": 123.0}})
    return run


def test_register_list_filter_and_resolve(tmp_path):
    a = make_run(tmp_path, "a", "http://127.0.0.1:1", ["nightly"], 50.0)
    b = make_run(tmp_path, "b", "http://127.0.0.1:2", [], 70.0)
    with RunStore(tmp_path) as store:
        id_a = store.register(a.path, config=a.read_config(), summary=a.read_summary())
        id_b = store.register(b.path, config=b.read_config(), summary=b.read_summary())
        assert id_a != id_b
        assert store.register(a.path, config=a.read_config()) == id_a  # refresh keeps the id
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


def test_rescan_finds_sweeps_by_their_sweep_json(tmp_path):
    import orjson

    folder = tmp_path / "20261121-120000-sweep-x"
    folder.mkdir()
    (folder / "sweep.json").write_bytes(orjson.dumps({
        "created": 1.0, "target": {"url": "http://127.0.0.1:1", "model": "m"},
        "config": {"bench": {"tags": ["t"]}},
        "points": [{"requests": 10, "error_rate": 0.0}, {"requests": 20, "error_rate": 0.5}]}))
    with RunStore(tmp_path) as store:
        assert store.rescan() == 1
        (run,) = store.list(kind="sweep")
        assert run.numbers["requests"] == 30 and run.numbers["ok"] == 20 and run.tags == ["t"]
