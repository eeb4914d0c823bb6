"""How far to trust a prediction: intervals on every percentile (summary.json, --json, the
tables), the SLO-max's and the replica range's, `--check` against measured runs, the
calibration's spread, the machine probe and the fit-error warning."""

from __future__ import annotations

import math

import numpy as np
import orjson
import pytest
from rich.console import Console
from sim_helpers import calibration
from typer.testing import CliRunner

from latlab.cli import app
from latlab.records.calibration import Reference
from latlab.records.engine import EngineConfig
from latlab.records.folder import RunFolder
from latlab.records.predict import CalibrationSource
from latlab.services.errors import InputError
from latlab.services.predict import resolve_calibration
from latlab.sim import calibration as calibrations
from latlab.sim import machine
from latlab.sim.calibrate_engine import reference_ms


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def json_of(result) -> dict:
    return orjson.loads(result.stdout[result.stdout.index("{"):])


@pytest.fixture
def cal_file(tmp_path):
    return calibrations.save(calibration(), tmp_path / "cal.json")


def percentiles(summary: dict):
    for group in ("latency", "failure_adjusted"):
        for name, dist in summary[group].items():
            for q, p in dist["percentiles"].items():
                yield name, q, p


def test_every_predicted_percentile_has_an_interval_around_it(tmp_path, cal_file):
    r = invoke("predict", "--calibration", cal_file, "--rate", 4, "--requests", 300,
               "--draws", 5, "--out", tmp_path, "--json", "--no-test-advice")
    assert r.exit_code == 0, r.output
    summary = json_of(r)
    checked = 0
    for name, q, p in percentiles(summary):
        if p["value"] is not None and name != "lateness":
            assert p["lo"] <= p["value"] <= p["hi"], (name, q, p)
            checked += 1
    assert checked > 30
    prediction = summary["prediction"]
    assert prediction["draws"] == 5 and prediction["level"] == 0.9
    assert prediction["requests"] == 300 and not prediction["point_fell_behind"]
    assert "fit error" in prediction["notes"][0]  # the helper's calibration has no spread
    stored = RunFolder.open(summary["run"]).read_summary()
    assert stored.latency["e2e"].percentiles["p99"].hi == summary["latency"]["e2e"][
        "percentiles"]["p99"]["hi"]
    page = (RunFolder.open(summary["run"]).path / "report.html").read_text()
    assert "the 90% interval of 5 draws" in page and "predicted " in page
    table = invoke("predict", "--calibration", cal_file, "--rate", 4, "--requests", 300,
                   "--draws", 5, "--out", tmp_path, "--no-test-advice")
    e2e = stored.latency["e2e"].percentiles["p50"]
    assert "below: the 90% interval" in table.output
    assert (f"intervals   90%: where a run of {stored.in_window:,} requests will measure each "
            "percentile, its own luck included") in table.output
    assert "5 draws of 300 requests" in table.output
    assert f"{e2e.lo:.0f}–{e2e.hi:.0f}" in table.output
    # the finding's advice is given, untested (--no-test-advice): no predicted effect
    assert "--max-num-batched-tokens" in table.output and "measure it" not in table.output


def test_past_capacity_the_interval_says_the_queue_grows(tmp_path, cal_file):
    r = invoke("predict", "--calibration", cal_file, "--rate", 80, "--requests", 500,
               "--draws", 4, "--max-waiting", 100000, "--out", tmp_path, "--json",
               "--no-test-advice")
    assert r.exit_code == 0, r.output
    summary = json_of(r)
    for metric in ("ttft", "e2e", "e2e_sched"):
        assert summary["latency"][metric]["percentiles"]["p99"]["hi"] == "inf"
    assert summary["latency"]["tpot"]["percentiles"]["p99"]["hi"] != "inf"  # bounded
    assert summary["prediction"]["point_fell_behind"]
    assert any("queue may grow" in n for n in summary["prediction"]["notes"])
    stored = RunFolder.open(summary["run"]).read_summary()
    assert math.isinf(stored.latency["ttft"].percentiles["p50"].hi)


def test_the_predicted_sweeps_slo_max_comes_with_an_interval(tmp_path, cal_file):
    r = invoke("predict", "--calibration", cal_file, "--sweep", "--rates", "2,4,6,8,12",
               "--requests", 500, "--draws", 4, "--slo", "e2e=2500ms", "--out", tmp_path)
    assert r.exit_code == 0, r.output
    (folder,) = [p for p in tmp_path.iterdir() if "sweep" in p.name]
    data = orjson.loads((folder / "sweep.json").read_bytes())
    best = data["slo_max"]
    assert best["level"] == 0.9 and best["lo"] <= best["load"] <= best["hi"]
    for point in data["points"]:
        lo, hi = point["slo_intervals"]["e2e"]
        assert lo <= point["slo_values"]["e2e"] and (hi == "inf" or point["slo_values"]["e2e"]
                                                     <= hi)
        assert set(point["latency_intervals"]["e2e"]) == {"p50", "p99"}
        if point["fell_behind"]:  # the queue grows: no upper end
            assert point["latency_intervals"]["ttft"]["p99"][1] == "inf"
        own = RunFolder.open(point["run"]).read_summary().latency["e2e"].percentiles["p99"]
        assert own.lo <= own.value <= own.hi
    assert "90% interval:" in r.output
    assert "90% interval:" in (folder / "sweep.html").read_text()


def test_check_sets_measured_runs_against_the_intervals(tmp_path, cal_file):
    """Runs the calibrated server "measured" (predicted runs of other seeds stand for them):
    most of their percentiles fall inside the intervals predicted from their settings."""
    for seed in (7, 8):
        made = invoke("predict", "--calibration", cal_file, "--rate", 6, "--requests", 400,
                      "--seed", seed, "--draws", 0, "--out", tmp_path, "--name", f"m{seed}",
                      "--no-test-advice")
        assert made.exit_code == 0, made.output
    runs = sorted(p for p in tmp_path.iterdir() if p.name.endswith(("m7", "m8")))
    r = invoke("predict", "--calibration", cal_file, "--check", runs[0], "--check", runs[1],
               "--draws", 8, "--out", tmp_path, "--json")
    assert r.exit_code == 0, r.output
    checked = json_of(r)
    assert len(checked["checks"]) == 2 * 9  # TTFT, TPOT, E2E at p50, p90, p99
    assert checked["coverage"] >= 0.7
    assert all(c["lo"] <= c["predicted"] <= c["hi"] for c in checked["checks"])
    table = invoke("predict", "--calibration", cal_file, "--check", runs[0], "--draws", 4,
                   "--out", tmp_path)
    assert "coverage" in table.output and "measured against predicted" in table.output
    bad = invoke("predict", "--calibration", cal_file, "--check", tmp_path / "nowhere",
                 "--out", tmp_path)
    assert bad.exit_code == 2 and "--check" in bad.output


def test_a_run_calibration_keeps_its_spread_and_warns_when_its_fit_is_loose(tmp_path,
                                                                            cal_file):
    folders = []
    for rate in (1.0, 6.0, 12.0):
        r = invoke("predict", "--calibration", cal_file, "--rate", rate, "--requests", 400,
                   "--draws", 0, "--out", tmp_path, "--name", f"m{rate:g}", "--no-test-advice")
        assert r.exit_code == 0, r.output
        folders += [p for p in tmp_path.iterdir() if p.name.endswith(f"m{rate:g}")]
    out = tmp_path / "fitted.json"
    r = invoke("calibrate", *sum((["--from", f] for f in folders), []), "--out", out,
               "--max-num-seqs", 32, "--max-num-batched-tokens", 512)
    assert r.exit_code == 0 and "spread:" in r.output, r.output
    spread = calibrations.load(out).spread
    assert spread.runs == 3 and spread.windows >= 3 and spread.step > 0
    assert spread.request.network == pytest.approx(0.0, abs=1e-6)  # the simulated network
    loose = calibrations.load(out).model_copy(update={"fit": calibration().fit.model_copy(
        update={"mape": 0.25})})
    path = calibrations.save(loose, tmp_path / "loose.json")
    predicted = invoke("predict", "--calibration", path, "--rate", 2, "--requests", 100,
                       "--draws", 0, "--out", tmp_path, "--no-test-advice")
    assert "the fit error is 25%" in predicted.output and "--check" in predicted.output
    assert calibrations.fit_warning(calibration()) is None


def test_the_machine_probe_flags_a_calibration_the_machine_has_outgrown():
    """A calibration whose reference steps took a hundredth of what they take now (a margin
    no busy machine's swings between two timings close): the machine is far beyond its
    spread, so the probe warns (or, for a cached one, calibrates again)."""
    engine = EngineConfig(model="tiny", max_model_len=256, max_num_seqs=16, warmup=False)
    now = reference_ms(engine)
    cal = calibration().model_copy(update={
        "target": {"host": __import__("platform").node()},
        "reference": Reference(ms=[m / 100 for m in now], load_average=0.5)})
    check = machine.check_machine(cal, engine)
    assert check.beyond and check.ratio > 5 and "beyond the spread" in check.line()
    lines = Console(record=True, width=300)
    from latlab.services import predict as service

    assert service._machine(cal, engine, lines, "recalibrate", cached=True) is None
    assert service._machine(cal, engine, lines, "recalibrate", cached=False) is cal
    assert "calibrate again" in lines.export_text()
    rescaled = service._machine(cal, engine, lines, "rescale", cached=True)
    ratio = rescaled.step.coefficients["step"] / cal.step.coefficients["step"]
    assert ratio > 5 and "the machine probe" in rescaled.notes[-1]
    elsewhere = cal.model_copy(update={"target": {"host": "another-machine"}})
    assert machine.check_machine(elsewhere, engine) is None


def test_on_drift_rescale_follows_the_machine_within_the_spread_too(monkeypatch):
    """The probe before each held-out run tracked its served steps on a shared host (the
    benchmark's --levels): `rescale` scales to the machine now whatever the ratio; the
    other choices leave a calibration within its spread as it is."""
    from latlab.services import predict as service

    cal = calibration()
    within = machine.MachineCheck(ratio=0.8, limit=1.5, load_then=4.0, load_now=1.0)
    monkeypatch.setattr(machine, "check_machine", lambda c, e: within)
    lines = Console(record=True, width=300)
    engine = EngineConfig(model="tiny")
    for kept in ("recalibrate", "warn"):
        assert service._machine(cal, engine, lines, kept, cached=True) is cal
    scaled = service._machine(cal, engine, lines, "rescale", cached=True)
    assert scaled.step.coefficients["step"] == pytest.approx(
        0.8 * cal.step.coefficients["step"])
    said = lines.export_text()
    assert "scaled by 0.80" in said and "within the spread" in said


def test_a_calibration_file_that_cannot_be_read_is_a_usage_error(tmp_path):
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(InputError):
        resolve_calibration(CalibrationSource(), tmp_path / "bad.json", [], None,
                            Console(file=open("/dev/null", "w")))


def test_the_open_loop_probe_of_a_slow_server_still_runs():
    """Half a capacity of 0.06 req/s once rounded to 0.03 req/s and 0 requests (and under
    0.01 req/s to a rate of 0): neither a bench latlab can run."""
    from latlab.services.calibrate import PROBE_OPEN_MIN, PROBE_OPEN_S, open_probe
    from latlab.services.errors import ServiceFailed

    assert open_probe(0.06) == (0.03, 2)
    assert open_probe(0.004) == (0.002, 2)
    rate, requests = open_probe(40.0)
    assert rate == 20.0 and requests == round(20.0 * PROBE_OPEN_S)
    # a busy host's lower rate: as many requests as a quiet one's minimum, over longer
    rate, requests = open_probe(1.4)
    assert requests == PROBE_OPEN_MIN > round(rate * PROBE_OPEN_S)
    with pytest.raises(ServiceFailed):
        open_probe(float("nan"))


def test_the_open_loop_probes_prompts_fit_a_short_context():
    """A small model (context 1024) probed at its high capacity: hundreds of prompts from the
    default lengths (mean 256) drew one that left no room for output, and the probe failed."""
    from latlab.records.workload import WorkloadConfig
    from latlab.services.calibrate import probe_prompts

    assert probe_prompts(None) == probe_prompts(4096) == \
        WorkloadConfig.model_fields["prompt_tokens"].default
    rng = np.random.default_rng(0)
    for context in (1024, 256):
        lengths = probe_prompts(context).sample_many(rng, 5_000)  # ten of tiny's probes
        assert lengths.max() < 0.8 * context  # room for output
