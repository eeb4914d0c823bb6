"""Predicted run folders and the `latlab predict` / `latlab calibrate` commands (with a
calibration file: no engine is timed here, except the small grid test at the end)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import orjson
import pytest
from sim_helpers import calibration, open_loop
from typer.testing import CliRunner

from latlab.analysis import analyze
from latlab.cli import app
from latlab.metrics.summary import summarize
from latlab.records.bench import BenchConfig
from latlab.records.config import RunConfig
from latlab.records.folder import RunFolder
from latlab.records.simulation import Simulation
from latlab.sim import calibration as calibrations
from latlab.sim.fleet import simulate
from latlab.sim.folder import write_run
from latlab.sim.stepcost import StepCostModel
from latlab.store import RunStore


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture
def cal_file(tmp_path):
    return calibrations.save(calibration(), tmp_path / "cal.json")


def config(workload) -> RunConfig:
    return RunConfig(kind="predict", bench=BenchConfig(workload=workload.config,
                                                       arrivals=workload.arrivals,
                                                       requests=workload.requests,
                                                       duration_s=None),
                     simulation=Simulation(calibration="test"))


def test_a_predicted_run_folder_is_a_run_folder_marked_simulated(tmp_path):
    workload = open_loop(5.0, 300)
    result = simulate(workload, calibration())
    run, summary = write_run(result, workload, config(workload), tmp_path, "p")
    assert run.read_config().kind == "predict" and run.read_config().simulated
    records = run.read_records()
    assert len(records) == 300 and summary.requests == 300 and summary.ok == 300
    again = summarize(records, None)
    assert again.percentile("ttft", "p99") == pytest.approx(summary.percentile("ttft", "p99"))
    r = records[10]
    assert r.server.source == "simulated" and len(r.token_ns) == r.completion_tokens
    parts = [r.server.preprocess, r.server.queue, r.server.prefill, r.server.decode,
             r.server.postprocess]
    assert sum(parts) == pytest.approx(r.server.total, rel=1e-6)
    assert (r.done_ns - r.sent_ns) / 1e6 == pytest.approx(r.server.total + 1.0, rel=1e-6)
    analysis = analyze(run)
    assert analysis.has_server_timings and analysis.mean is not None
    assert any("PREDICTED" in w for w in analysis.summary.warnings)
    import pyarrow.parquet as pq
    table = pq.read_table(run.path / "all_requests.parquet")
    assert table.num_rows == 300
    ttft = np.sort(table.column("ttft_ms").to_numpy())
    assert np.percentile(ttft, 50) == pytest.approx(summary.percentile("ttft", "p50"), rel=1e-6)


def test_a_sample_of_records_keeps_the_summary_of_every_request(tmp_path):
    workload = open_loop(5.0, 1200)
    result = simulate(workload, calibration())
    _, full = write_run(result, workload, config(workload), tmp_path, "full")
    run, sampled = write_run(result, workload, config(workload), tmp_path, "sampled",
                             records=200)
    assert len(run.read_records()) == 200
    assert run.read_config().simulation.records_total == 1200
    assert sampled.requests == full.requests == 1200
    for metric in ("ttft", "tpot", "e2e", "e2e_sched"):
        for q in ("p50", "p99"):
            assert sampled.percentile(metric, q) == pytest.approx(full.percentile(metric, q))
    assert sampled.throughput.output_tokens_per_s == pytest.approx(
        full.throughput.output_tokens_per_s, rel=1e-9)
    assert sampled.throughput.total_tokens_per_s == pytest.approx(
        full.throughput.total_tokens_per_s, rel=1e-9)
    assert sampled.percentile("itl", "p50") == pytest.approx(full.percentile("itl", "p50"),
                                                             rel=0.1)
    assert any("sample" in w for w in sampled.warnings)


def test_predict_with_a_calibration_file_prints_and_writes_a_predicted_run(tmp_path, cal_file):
    r = invoke("predict", "--calibration", cal_file, "--rate", 4, "--requests", 400,
               "--out", tmp_path, "--slo", "ttft=500ms", "--draws", 0)
    assert r.exit_code == 0, r.output
    assert "calibration of test server" in r.output and "fit error 2.0%" in r.output
    assert "PREDICTED" in r.output and "Where the time goes" in r.output
    assert "measure it: latlab ab" in r.output  # its findings' advice, tested
    with RunStore(tmp_path) as store:
        (stored,) = store.list(kind="predict")
    run = RunFolder.open(stored.path)
    assert run.read_summary().goodput is not None
    report = invoke("report", stored.path)
    assert report.exit_code == 0 and "PREDICTED" in report.output
    other = invoke("predict", "--calibration", cal_file, "--rate", 4, "--requests", 400,
                   "--out", tmp_path, "--slo", "ttft=500ms", "--replicas", 2, "--draws", 0,
                   "--no-test-advice")
    runs = sorted(p.path for p in RunStore(tmp_path).list(kind="predict"))
    compared = invoke("compare", *runs)
    assert other.exit_code == 0 and compared.exit_code == 0, compared.output


def test_predict_replays_a_run_and_sizes_a_fleet(tmp_path, cal_file):
    first = invoke("predict", "--calibration", cal_file, "--rate", 6, "--requests", 300,
                   "--out", tmp_path, "--name", "orig", "--draws", 0, "--no-test-advice")
    (orig,) = [p for p in tmp_path.iterdir() if p.name.endswith("orig")]
    # a predicted run is a bench-shaped run folder: replay its requests
    again = invoke("predict", "--calibration", cal_file, "--replay", orig, "--out", tmp_path,
                   "--name", "again", "--draws", 0, "--no-test-advice")
    (copy,) = [p for p in tmp_path.iterdir() if p.name.endswith("again")]
    a, b = RunFolder(orig).read_summary(), RunFolder(copy).read_summary()
    assert first.exit_code == 0 and again.exit_code == 0, again.output
    assert b.percentile("e2e", "p50") == pytest.approx(a.percentile("e2e", "p50"), rel=1e-6)
    compared = invoke("compare", orig, copy)  # the same workload: a run and its prediction
    assert compared.exit_code == 0, compared.output

    sized = invoke("predict", "--calibration", cal_file, "--replicas-for",
                   "p99_e2e<1500ms@40rps", "--requests", 1500, "--draws", 6, "--out", tmp_path,
                   "--json")
    assert sized.exit_code == 0, sized.output
    answer = orjson.loads(sized.stdout[sized.stdout.index("{"):])
    counts = {int(n): c for n, c in answer["counts"].items()}
    n, low, high = answer["point_estimate"], answer["low"], answer["high"]
    assert counts[n]["value"] < 1500 and (n == 1 or counts[n - 1]["value"] >= 1500)
    assert low <= n <= high == answer["recommended"]
    assert counts[high]["met"] >= 0.95  # the interval's upper end meets the goal
    assert high == n or counts[high - 1]["met"] < 0.95
    assert low == 1 or counts[low - 1]["met"] < 0.05


def test_predict_without_draws_tests_its_advice_on_point_estimates_alone(tmp_path, cal_file,
                                                                         monkeypatch):
    """`--draws 0` asks for no drawn worlds: each advised setting's effect is simulated once a
    side, as the calibration fitted it, and says it has no interval."""
    from latlab.services import predict_intervals

    worlds = []
    simulate_once = predict_intervals.simulate

    def counted(workload, cal, fleet=None, draw=None):
        worlds.append(draw)
        return simulate_once(workload, cal, fleet, draw)

    monkeypatch.setattr(predict_intervals, "simulate", counted)
    r = invoke("predict", "--calibration", cal_file, "--rate", 4, "--requests", 400,
               "--out", tmp_path, "--slo", "ttft=500ms", "--draws", 0)
    assert r.exit_code == 0, r.output
    predicted = r.output.count("predicted for `") - r.output.count("not predicted for `")
    assert predicted and "a point estimate, no interval" in r.output
    assert "paired draws" not in r.output
    assert len(worlds) == 2 * predicted and not any(worlds)  # two sides, no drawn world
    worlds.clear()
    r = invoke("predict", "--calibration", cal_file, "--rate", 4, "--requests", 400,
               "--out", tmp_path, "--slo", "ttft=500ms", "--draws", 2)
    assert r.exit_code == 0, r.output
    assert "8 paired draws" in r.output and all(worlds)  # the advice's own 8 worlds


def test_predict_sweep_draws_the_curve_and_the_slo_max(tmp_path, cal_file):
    r = invoke("predict", "--calibration", cal_file, "--sweep", "--rates", "2,8,16,40",
               "--requests", 600, "--slo", "ttft=400ms", "--out", tmp_path, "--draws", 0)
    assert r.exit_code == 0, r.output
    (folder,) = [p for p in tmp_path.iterdir() if "sweep" in p.name]
    data = orjson.loads((folder / "sweep.json").read_bytes())
    assert data["target"]["simulated"] and len(data["points"]) >= 3
    assert (folder / "sweep.html").is_file()
    best = data["slo_max"]
    assert best is not None and "ttft" in best["statement"]
    # without draws, no interval: a simulated sample's CIs say nothing of the calibration's
    assert best["level"] is None and "interval" not in r.output
    for p in data["points"]:
        assert RunFolder.open(p["run"]).read_config().kind == "predict"
        assert p["slo_intervals"] == {}


def test_an_interrupted_predicted_sweep_keeps_its_points(tmp_path, cal_file, monkeypatch):
    """Ctrl-C during a predicted sweep ends it as latlab sweep's does: the points so far in
    sweep.json, stopped as interrupted, the folder registered, exit 130."""
    from latlab.services import predict_plans

    simulated = predict_plans.predict_point
    calls = []

    def second_interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return simulated(*args, **kwargs)

    monkeypatch.setattr(predict_plans, "predict_point", second_interrupted)
    r = invoke("predict", "--calibration", cal_file, "--sweep", "--rates", "2,8,16",
               "--requests", 300, "--out", tmp_path, "--draws", 0)
    assert r.exit_code == 130, r.output
    (folder,) = [p for p in tmp_path.iterdir() if "sweep" in p.name]
    data = orjson.loads((folder / "sweep.json").read_bytes())
    assert data["stop"]["reason"] == "interrupted" and len(data["points"]) == 1
    with RunStore(tmp_path) as store:
        assert [Path(s.path).name for s in store.list(kind="sweep")] == [folder.name]


@pytest.mark.parametrize("args, message", [
    (["--rate", "5", "--router", "fastest"], "--router 'fastest'"),
    (["--rate", "5", "--calibration", "missing.json"], "missing.json"),
    (["--rate", "5", "--calibration", "c.json", "--from", "runs"], "give one"),
    (["--replicas-for", "p99_e2e<2s"], "expected pQ_METRIC<LIMIT@RATE"),
    (["--replicas-for", "p99_itl<2s@4rps"], "the metric is one of"),
    (["--requests", "10"], "give the load"),
    (["--rate", "5", "--autoscale", "cpu"], "--autoscale 'cpu'"),
    (["--rate", "5", "--autoscale", "queue", "--min-replicas", "4", "--max-replicas", "2"],
     "--max-replicas 2 is below"),
    (["--rate", "5", "--autoscale", "queue", "--cold-start", "nowhere"],
     "--cold-start 'nowhere'"),
    (["--rate", "5", "--cold-start", "5"], "--cold-start goes with --autoscale"),
    (["--rate", "5", "--idle-unload", "30"], "--idle-unload needs --reload-time"),
    (["--rate", "5", "--speculative-tokens", "4"], "--speculative-tokens needs --acceptance"),
    (["--rate", "5", "--acceptance", "fixed:0.5"], "--acceptance goes with"),
    (["--rate", "5", "--interval-level", "1.5"], "--interval-level"),
    (["--sweep", "--check", "x"], "--sweep and --check are different questions"),
    (["--rate", "5", "--turns", "3", "--max-concurrency", "2"],
     "--max-concurrency with sessions is not simulated"),
])
def test_bad_input_is_one_line(tmp_path, cal_file, args, message):
    args = [str(cal_file) if a == "c.json" else a for a in args]
    if "--calibration" not in args and "--from" not in args:
        args += ["--calibration", str(cal_file)]
    r = invoke("predict", *args, "--out", tmp_path, "--draws", 0)
    assert r.exit_code == 2, r.output
    assert message in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1, r.output


def test_calibrate_from_a_run_folder_recovers_the_server(tmp_path, cal_file):
    """Round trip: a simulated server's run folders fitted back into a calibration that
    predicts another load of it."""
    folders = []
    for rate in (1.0, 6.0, 12.0):
        r = invoke("predict", "--calibration", cal_file, "--rate", rate, "--requests", 500,
                   "--out", tmp_path, "--name", f"m{rate:g}", "--draws", 0, "--no-test-advice")
        assert r.exit_code == 0, r.output
        folders += [p for p in tmp_path.iterdir() if p.name.endswith(f"m{rate:g}")]
    out = tmp_path / "fitted.json"
    r = invoke("calibrate", *sum((["--from", f] for f in folders), []), "--out", out,
               "--max-num-seqs", 32, "--max-num-batched-tokens", 512)
    assert r.exit_code == 0, r.output
    fitted = calibrations.load(out)
    assert fitted.source == "run" and fitted.fit.mape < 0.2
    assert fitted.request.network == pytest.approx(1.0, rel=0.01)
    truth = simulate(open_loop(9.0, 2000), calibration())
    guess = simulate(open_loop(9.0, 2000), fitted)
    for result in (truth, guess):
        result.e2e = np.median(result.columns.done - result.columns.sent)
    assert guess.e2e == pytest.approx(truth.e2e, rel=0.15)
    bad = invoke("calibrate", "--from", tmp_path / "nothing")
    assert bad.exit_code == 2 and "neither a run folder" in bad.output


def test_calibrating_the_engine_times_a_grid_and_fits(monkeypatch):
    from latlab.records.engine import EngineConfig
    from latlab.sim import calibrate_engine

    monkeypatch.setattr(calibrate_engine, "CONTEXTS", (16, 48))
    monkeypatch.setattr(calibrate_engine, "BATCHES", (1, 2, 4))
    monkeypatch.setattr(calibrate_engine, "PREFILLS", (8, 32))
    cal = calibrations.engine_calibration(EngineConfig(model="tiny", max_model_len=256,
                                                       max_num_seqs=4, warmup=False))
    assert cal.source == "engine" and cal.engine.max_num_seqs == 4
    assert cal.fit.samples > 20 and math.isfinite(cal.fit.mape)
    assert cal.step.coefficients["step"] >= 0 and "fit error" in cal.headline()
    # the fixed cost may fit to 0 on a noisy host (BVLS lands on the bound; the per-sequence
    # terms then carry it), but a one-sequence decode step is never charged nothing
    one_decode = StepCostModel(cal.step).linear(tokens=1, decodes=1, prefills=0, sampled=1,
                                                groups=1, decode_context=16,
                                                prefill_attention=0)
    assert one_decode > 1e-6


@pytest.mark.parametrize("max_num_seqs", [2, 4])
def test_the_grid_joins_every_prompt_length_into_a_decoding_batch(monkeypatch, max_num_seqs):
    """Half the lengths join at one batch size and half at the next; with one size only
    that has room to join (`--max-num-seqs 2`: batch 1), all of them join there."""
    from latlab.records.engine import EngineConfig
    from latlab.sim import calibrate_engine

    monkeypatch.setattr(calibrate_engine, "CONTEXTS", (16,))
    monkeypatch.setattr(calibrate_engine, "BATCHES", (1, 2, 4))
    monkeypatch.setattr(calibrate_engine, "PREFILLS", (8, 24, 40, 56))
    x, *_ = calibrate_engine.time_engine(EngineConfig(model="tiny", max_model_len=256,
                                                      max_num_seqs=max_num_seqs, warmup=False))
    tokens, decodes, prefills = x[:, 1], x[:, 2], x[:, 3]
    joined = {int(t - d) for t, d, p in zip(tokens, decodes, prefills) if p == 1 and d >= 1}
    assert {8, 24, 40, 56} <= joined


def test_the_probes_server_starts_beside_the_grid_and_is_stopped(monkeypatch):
    """First-use calibration: latlab serve for the probes starts before the in-process grid,
    which waits for it to be ready before it times a step; the probes run through it, and it
    is stopped (by PID) when the calibration ends."""
    import io

    from rich.console import Console

    from latlab.commands.options import parse_args
    from latlab.records.engine import ServeConfig
    from latlab.services import calibrate as service
    from latlab.sim import calibrate_engine

    monkeypatch.setattr(calibrate_engine, "CONTEXTS", (16, 48))
    monkeypatch.setattr(calibrate_engine, "BATCHES", (1, 2, 4))
    monkeypatch.setattr(calibrate_engine, "PREFILLS", (8, 32))
    monkeypatch.setattr(service, "PROBE_REQUESTS", 3)
    monkeypatch.setattr(service, "BATCH_OUTPUT", 4)
    monkeypatch.setattr(service, "PROBE_OPEN_S", 2.0)
    started = []
    spawn = service.spawn_server
    monkeypatch.setattr(service, "spawn_server",
                        lambda *a, **k: started.append(spawn(*a, **k)) or started[-1])
    serve = ["--model", "tiny", "--max-num-seqs", "4"]
    err = io.StringIO()
    cal = service.calibrate_engine(parse_args(ServeConfig, serve, "--serve-args").engine,
                                   serve, Console(file=err, width=200))
    lines = err.getvalue().splitlines()
    ready = next(i for i, line in enumerate(lines) if "latlab serve for the probes ready" in line)
    first_shape = next(i for i, line in enumerate(lines) if "batch 1 at context" in line)
    assert ready < first_shape < lines.index("probing latlab serve…")
    assert len(started) == 1 and not started[0].alive
    assert sum(note.startswith("probe replayed") for note in cal.notes) == 3
    assert any("steps served through latlab serve" in note for note in cal.notes)
    assert cal.request.network > 0 and cal.spread.runs == 3


def test_an_unsteady_engine_calibration_is_flagged_where_it_is_used(tmp_path):
    steady = calibration()
    assert calibrations.fit_warning(steady) is None
    noisy = steady.model_copy(update={"fit": steady.fit.model_copy(update={"mape": 0.3})})
    assert "reproduces these runs' timings loosely" in calibrations.fit_warning(
        noisy.model_copy(update={"source": "run"}))
    path = calibrations.save(noisy, tmp_path / "noisy.json")
    r = invoke("predict", "--calibration", path, "--rate", 4, "--requests", 100,
               "--out", tmp_path, "--draws", 0, "--no-test-advice")
    assert r.exit_code == 0, r.output
    assert "warning: the fit error is 30%" in r.output


def test_run_time_techniques_are_simulated_not_calibrated():
    from latlab.services.calibrate import calibration_args

    serve = ["--max-num-seqs", "8", "--max-queue-delay", "2", "--speculative-method=ngram",
             "--idle-unload", "30", "--enable-prefix-caching"]
    assert calibration_args(serve) == ["--max-num-seqs", "8", "--enable-prefix-caching"]
    assert calibrations.cache_path(calibration_args(serve)) == calibrations.cache_path(
        ["--max-num-seqs", "8", "--enable-prefix-caching"])
    r = invoke("predict", "--rate", 1, "--serve-args", "--speculative-method ngram",
               "--no-probe", "--draws", 0)
    assert r.exit_code == 2 and "give --acceptance" in r.output, r.output


def test_predict_takes_no_options_that_would_do_nothing_there():
    for flag in ("--prompts", "--progress"):
        result = CliRunner().invoke(app, ["predict", flag, "x"])
        assert result.exit_code == 2 and "No such option" in result.output, result.output
    assert "--prompts" in CliRunner().invoke(app, ["bench", "--help"]).output


def test_replicas_for_a_goal_below_the_latency_floor_stops_at_the_plateau(tmp_path, cal_file):
    """More replicas, the same latency: a goal under one request's own time is out of reach,
    said after a few counts (not one replica at a time up to thousands), and one that only
    some of the drawn worlds meet, whatever the count, is a plateau, explained."""
    floor = invoke("predict", "--calibration", cal_file, "--replicas-for", "p99_e2e<1ms@2rps",
                   "--requests", 200, "--draws", 0, "--out", tmp_path)
    assert floor.exit_code != 0 and "latency floor" in floor.output
    assert "not capacity" in floor.output
    wide = invoke("predict", "--calibration", cal_file, "--replicas-for",
                  "p99_e2e<100000ms@0.2rps", "--requests", 200, "--draws", 8, "--out", tmp_path,
                  "--json")
    assert wide.exit_code == 0, wide.output
    drawn = orjson.loads(wide.stdout[wide.stdout.index("{"):])["counts"]["1"]["draws"]
    limit = float(np.median(drawn))  # about half of the worlds meet it, with any count
    sized = invoke("predict", "--calibration", cal_file, "--replicas-for",
                   f"p99_e2e<{limit:.3f}ms@0.2rps", "--requests", 200, "--draws", 8,
                   "--out", tmp_path, "--json")
    assert sized.exit_code == 0, sized.output
    answer = orjson.loads(sized.stdout[sized.stdout.index("{"):])
    plateau = answer["plateau"]
    assert plateau is not None and plateau["met"] < 0.95 and answer["high"] == plateau["replicas"]
    assert plateau["limit_needed_ms"] > limit and len(answer["counts"]) <= 4
    # a count's worlds are drawn until its answer is decided: the plateau's are all drawn
    assert len(answer["counts"][str(plateau["replicas"])]["worlds"]) == answer["worlds"] == 8
