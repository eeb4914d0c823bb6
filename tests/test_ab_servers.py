"""latlab ab's own servers: fresh processes for every A/B pair (the default), so a lasting
difference between two server processes is noise between pairs, not the setting's; or one
process a side for every round (`--fresh-servers never`), where it is taken for the setting's.

The fake server (tests/coldstart_server.py `--speeds`) is slow or fast for its whole life by
the order of its first request among all its starts (1st, 4th, 5th, 8th, ... slow): kept
processes make A always slow and B always fast, though both sides have the same setting; fresh
starts give each side both, A slow in pairs 1 and 3, B in pairs 2 and 4."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import orjson
from typer.testing import CliRunner

from latlab.cli import app

SERVER = Path(__file__).with_name("coldstart_server.py")
TEMPLATE = f"{shlex.quote(sys.executable)} {SERVER} --port {{port}} {{args}}"
CALLED = ("better", "worse")


def a_a(tmp_path: Path, fresh: str) -> tuple[dict, list[tuple[int, int]]]:
    """An A/A of the fake server, 4 pairs; ab.json and each process's (pid, servers alive)."""
    speeds = tmp_path / "speeds"
    setting = f"--speeds {speeds} --slow-ms 60"
    r = CliRunner().invoke(app, [
        "ab", "--launch", TEMPLATE, "--a", setting, "--b", setting, "--fresh-servers", fresh,
        "--requests", "12", "--users", "2", "--rounds", "4", "--max-rounds", "4",
        "--warmup-rounds", "0", "--prompt-tokens", "16", "--output-tokens", "3",
        "--decide-on", "p50_ttft", "--out", str(tmp_path), "--json"])
    assert r.exit_code in (0, 1), r.output
    record = orjson.loads(r.stdout[r.stdout.index("{"):])
    processes = [tuple(map(int, line.split())) for line in speeds.read_text().splitlines()]
    return record, processes


def test_kept_processes_take_a_process_difference_for_the_settings(tmp_path):
    record, processes = a_a(tmp_path, "never")
    ttft = next(c for c in record["changes"] if c["key"] == "p50_ttft")
    assert ttft["verdict"] == "better" and ttft["b"] < 0.5 * ttft["a"], ttft  # the false call
    assert len(processes) == 2 and {r["server_start"] for r in record["rounds"]} == {1}
    assert "a lasting difference between the two processes" in record["looks"][0]
    assert sorted(p.name for p in Path(record["folder"]).glob("server-*.log")) == [
        "server-A-1.log", "server-B-1.log"]


def test_fresh_servers_every_pair_make_a_process_difference_noise(tmp_path):
    record, processes = a_a(tmp_path, "every")
    called = [(c["key"], c["a"], c["b"]) for c in record["changes"] if c["verdict"] in CALLED]
    assert not called
    assert [(r["side"], r["round"], r["server_start"]) for r in record["rounds"]] == [
        ("A", 1, 1), ("B", 1, 1), ("B", 2, 2), ("A", 2, 2), ("A", 3, 3), ("B", 3, 3),
        ("B", 4, 4), ("A", 4, 4)]
    # a start a side a pair; the previous pair's stopped first: never more than two alive
    assert len(processes) == 8 and max(alive for _, alive in processes) == 2
    assert not any("lasting difference" in look for look in record["looks"])
    logs = {p.name for p in Path(record["folder"]).glob("server-*.log")}
    assert logs == {f"server-{side}-{k}.log" for side in "AB" for k in range(1, 5)}
