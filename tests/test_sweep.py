"""`run_sweep` and `latlab sweep` against fake servers with a capacity: the folder, the stop
rules, the SLO-max and its evidence, cost, the store, the CLI."""

import math
import signal

import orjson
import pytest
from capacity_server import capacity
from sse_server import Server
from typer.testing import CliRunner

from latlab.analysis.capacity import saturation
from latlab.cli import app
from latlab.records.bench import BenchConfig
from latlab.records.folder import RunFolder
from latlab.records.lengths import LengthDistribution
from latlab.records.sweep import SweepConfig
from latlab.records.workload import WorkloadConfig
from latlab.services.sweep import ESCALATION, run_sweep
from latlab.store import RunStore

SMALL = WorkloadConfig(prompt_tokens=LengthDistribution(kind="fixed", a=8),
                       output_tokens=LengthDistribution(kind="fixed", a=4))


def sweep(url: str, tmp_path, slos=None, duration=0.6, **kw):
    base = BenchConfig(url=url, workload=SMALL, duration_s=duration, out=tmp_path,
                       slos=slos or {})
    return run_sweep(SweepConfig(base=base, **kw))


def test_explicit_rates_make_a_curve_with_its_answers_and_evidence(tmp_path):
    with Server(capacity(1, 0.02)) as server:  # serves 50 req/s at most
        result = sweep(server.url, tmp_path, slos={"ttft": 250.0}, duration=1.0,
                       rates=[150, 5, 20], price_per_hour=3.6)
    data = orjson.loads((result.path / "sweep.json").read_bytes())
    assert data == result.record.model_dump(mode="json")
    # each point's load is what it offered (a rate's arrivals are drawn, not exact)
    assert [p["load"] for p in data["points"]] == [p["offered"] for p in data["points"]]
    assert [p["load"] for p in data["points"]] == pytest.approx([5, 20, 150], rel=0.5)
    assert [p["asked"] for p in data["points"]] == [5, 20, 150]
    for p in data["points"]:
        assert ("offered" in p["label"]) == (abs(p["offered"] - p["asked"]) > 0.05 * p["asked"])
    assert data["stop"]["reason"] in ("all_points", "saturated")
    low, mid, high = data["points"]
    assert high["achieved"] < 0.6 * 150  # far beyond the capacity
    assert high["fell_behind"] and not low["fell_behind"]

    best = data["slo_max"]
    ok, fail = best["passing"], best["failing"]
    assert fail["values"]["ttft"] == "inf" or fail["values"]["ttft"] > 250
    assert ok["values"]["ttft"] <= 250 and ok["load"] <= best["load"] <= fail["load"]
    if best["interpolated"]:
        a, b = ok["values"]["ttft"], fail["values"]["ttft"]
        assert best["load"] == pytest.approx(
            ok["load"] + (250 - a) / (b - a) * (fail["load"] - ok["load"]))
    for side in (ok, fail):
        assert RunFolder.open(side["run"]).read_summary().requests > 0

    knee = data["knee"]
    assert knee is not None and knee["label"].startswith(("5 req/s", "20 req/s"))
    assert knee["elasticity"] == "inf" or knee["elasticity"] > 1

    queue = [p["budget"]["mean"]["queue & overhead"] / sum(p["budget"]["mean"].values())
             for p in (low, high)]
    assert queue[1] > 0.8 and queue[1] > queue[0]  # the queue takes over past the knee

    for p in data["points"]:
        assert p["cost"]["per_million_output_tokens"] == pytest.approx(
            3.6 / (p["output_tokens_per_s"] * 3600) * 1e6)
        assert p["cost"]["per_thousand_requests"] == pytest.approx(3.6 / (p["achieved"] * 3.6))
    assert data["slo_max_cost"]["per_thousand_requests"] == pytest.approx(
        3.6 / (best["achieved"] * 3.6))

    folders = sorted(p.name for p in result.path.iterdir() if p.is_dir())
    assert len(folders) == 3
    assert all(RunFolder.open(result.path / f).read_summary() for f in folders)
    page = (result.path / "sweep.html").read_text()
    assert "SLO-max" in page and page.count('class="plotly-graph-div"') == 2  # curve, budgets
    with RunStore(tmp_path) as store:
        assert {r.path.name for r in store.list(kind="bench")} == set(folders)
        (entry,) = store.list(kind="sweep")
    assert entry.path == result.path.resolve() and entry.target == server.url
    assert entry.numbers["ok"] == sum(RunFolder.open(result.path / f).read_summary().ok
                                      for f in folders)


def test_a_saturated_server_stops_the_escalation(tmp_path):
    with Server(capacity(1, 0.05)) as server:  # 20 req/s at most
        result = sweep(server.url, tmp_path, duration=0.5, rates=[5, 40, 80, 160])
    assert result.stop_reason == "saturated"
    assert [p.asked for p in result.points] == [5, 40, 80]
    assert not any(p.name.endswith("rate-160") for p in result.path.iterdir())  # stamps hold digits
    before, last = result.points[-2:]  # 40 → 80 req/s asked: what they offered
    assert f"({100 * (last.load / before.load - 1):+.0f}%)" in result.record.stop.message


def test_errors_above_the_limit_stop_the_sweep(tmp_path):
    with Server(capacity(1, 0.05, max_waiting=4)) as server:  # beyond: 429
        result = sweep(server.url, tmp_path, slos={"ttft": 1000.0}, duration=1.0,
                       rates=[2, 100, 200], max_error_rate=0.1)
    assert result.stop_reason == "error_rate"
    assert [p.asked for p in result.points] == [2, 100]
    assert result.points[1].error_rate > 0.1 and math.isinf(result.points[1].slo_values["ttft"])
    best = result.record.slo_max
    assert best.load == result.points[0].load and not best.interpolated  # no interpolation


def test_the_automatic_plan_finds_sync_and_saturation_then_escalates(tmp_path):
    with Server(capacity(2, 0.04)) as server:  # 50 req/s at most, 2 at a time
        result = sweep(server.url, tmp_path, points=3, saturation_users=8)
    sync, probe, *rates = result.points
    assert sync.mode == "synchronous" and sync.load == sync.achieved > 0
    assert probe.mode == "throughput" and probe.load == 8
    assert all(p.mode == "rate" for p in rates)
    low = min(sync.achieved, probe.achieved / 2)
    planned = [low + (probe.achieved - low) * k / 3 for k in (1, 2, 3)]
    planned += [probe.achieved * ESCALATION ** k for k in (1, 2, 3)]
    assert [p.asked for p in rates] == pytest.approx(planned[:len(rates)])
    assert result.stop_reason == "saturated"  # wherever it happened, it stopped the plan
    assert saturation(rates[-2] if len(rates) > 1 else sync, rates[-1])
    # sync and probe beside it; by the load each point offered, which need not follow the plan
    assert result.record.curve == [p.label for p in sorted(rates, key=lambda p: p.load)]


def test_sweep_cli(tmp_path):
    runner = CliRunner()
    with Server(capacity(4, 0.02)) as server:
        result = runner.invoke(app, ["sweep", "--url", server.url, "--concurrencies", "4,1",
                                     "--duration", "0.5", "--prompt-tokens", "8",
                                     "--output-tokens", "4", "--slo", "ttft=2s",
                                     "--price-per-hour", "2", "--out", str(tmp_path), "--json",
                                     "--no-progress"])
    assert result.exit_code == 0, result.output
    data = orjson.loads(result.stdout)
    assert [(p["mode"], p["load"]) for p in data["points"]] == [("concurrency", 1),
                                                                ("concurrency", 4)]
    assert data["slo_max"]["load"] == 4 and "users" in data["slo_max"]["statement"]
    assert data["slos"] == {"ttft": 2000.0} and data["price_per_hour"] == 2


@pytest.mark.parametrize("args, message", [
    (["--rates", "1,x"], "--rates"),
    (["--rates", "1", "--concurrencies", "2"], "exclude each other"),
    (["--percentile", "120"], "--percentile"),
    (["--rates", "0,1"], "--rates"),
    (["--arrival", "burst"], "--arrival"),
])
def test_bad_sweep_options_are_named(tmp_path, args, message):
    result = CliRunner().invoke(app, ["sweep", "--url", "http://127.0.0.1:9", *args,
                                      "--out", str(tmp_path)])
    assert result.exit_code == 2 and message in result.output
    assert not list(tmp_path.iterdir())


def test_a_point_hands_back_the_signal_handlers_it_borrowed(tmp_path):
    from latlab.load.target.interrupts import interrupt_on_sigterm

    before = signal.getsignal(signal.SIGTERM)
    try:
        interrupt_on_sigterm()
        armed = signal.getsignal(signal.SIGTERM)
        with Server(capacity(1, 0.01)) as server:
            sweep(server.url, tmp_path, duration=0.3, rates=[5])
        assert signal.getsignal(signal.SIGTERM) is armed  # still stops the engine on SIGTERM
    finally:
        signal.signal(signal.SIGTERM, before)
