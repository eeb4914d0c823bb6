"""`latlab tune` on latlab serve: one measured run calibrates the simulator, the batching
settings are screened on paired draws, the best predicted gain is verified with ab, and
tune.json says what was predicted, measured, and whether the two agree."""

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from latlab.cli import app
from latlab.records.tune import TuneRecord


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def test_tune_screens_in_the_simulator_and_measures_the_best_predicted_gain(tmp_path):
    # two sequences at a time for six users: most requests wait, and the TTFT SLO fails
    r = invoke("tune", "--serve-args", "--model tiny --max-num-seqs 2", "--users", 6,
               "--requests", 48, "--prompt-tokens", 200, "--output-tokens", "fixed:16",
               "--slo", "ttft=300ms", "--max-num-seqs", "1,2,8", "--step-tokens", "256",
               "--verify", 1, "--rounds", 1, "--max-rounds", 1, "--draws", 3, "--out", tmp_path,
               "--json")
    assert r.exit_code == 0, r.output
    answer = orjson.loads(r.stdout[r.stdout.index("{"):])
    record = TuneRecord.model_validate(answer)
    args = {c.args for c in record.candidates}
    assert "--model tiny --max-num-seqs 8" in args and "--model tiny --max-num-seqs 1" in args
    assert "--model tiny --max-num-seqs 2 --max-num-batched-tokens 256" in args
    shares = [c.share for c in record.candidates]
    assert shares == sorted(shares, reverse=True)  # the best gain first
    assert all(c.predicted_lo <= c.predicted <= c.predicted_hi for c in record.candidates)
    # a gain's interval spans the paired draws, or there is none (worlds not set apart);
    # zero wide only where the setting changed nothing in any world
    assert all(c.change_lo < c.change_hi or c.change_lo == c.change_hi == 0
               for c in record.candidates
               if c.screened == "simulation" and c.change_lo is not None)
    # 8 sequences where the run only ever batched 2: steps the calibration never timed, so
    # one real run screens it instead of the simulator
    eight = next(c for c in record.candidates if c.args == "--model tiny --max-num-seqs 8")
    assert eight.screened == "run" and "never timed" in eight.unseen
    assert (Path(eight.screen_run) / "summary.json").is_file()
    one = next(c for c in record.candidates if c.args == "--model tiny --max-num-seqs 1")
    assert one.screened == "simulation" and one.unseen is None
    # (a step budget the run never timed is screened by a run too: test_advice_effects's
    # llama-server test; one run here, the 8 sequences', covers the run's path)
    gains = [c for c in record.candidates if c.change > 0]
    if gains:  # the best gain is measured with ab, and set against its prediction
        best = gains[0]
        assert best.ab_folder is not None and best.measured is not None
        assert best.verdict is not None
        assert (best.agrees is not None) == (best.screened == "simulation"
                                             and best.change_lo is not None)
    assert all(c.ab_folder is None for c in record.candidates if c.change <= 0)
    assert record.baseline_run and record.start_goodput is not None
    assert record.start_predicted is not None


def test_tune_needs_slos_and_a_server_it_can_restart(tmp_path):
    r = invoke("tune", "--serve-args", "--model tiny", "--requests", 4, "--out", tmp_path)
    assert r.exit_code != 0 and "--slo" in r.output and "Traceback" not in r.output
    r = invoke("tune", "--url", "http://127.0.0.1:9", "--slo", "ttft=1s", "--out", tmp_path)
    assert r.exit_code != 0 and "--url" in r.output


def test_a_ctrl_c_before_abs_first_round_stops_tune_without_a_traceback(tmp_path, monkeypatch):
    import time

    from rich.console import Console

    from latlab.analysis.ab import Sequential
    from latlab.records.ab import ABRecord
    from latlab.records.tune import Candidate, TuneConfig
    from latlab.records.verdict import VerdictConfig
    from latlab.services import tune
    from latlab.services.ab import ABRuns

    def interrupted(config, err):  # Ctrl-C in round 1: no side has a round to compare
        done = ABRuns(tmp_path, ABRecord(created=0.0, a=config.a, b=config.b),
                      Sequential(VerdictConfig(), 2))
        done.record.interrupted = True
        return done

    monkeypatch.setattr(tune, "run_ab", interrupted)
    config = TuneConfig.model_validate({"bench": {"serve_args": "--model tiny",
                                                  "slos": {"ttft": 300.0}}})
    candidate = Candidate(args="--model tiny --max-num-seqs 8", knobs={"max_num_seqs": 8},
                          predicted=2, predicted_lo=1, predicted_hi=3, change=1, change_lo=0.5,
                          change_hi=1.5)
    record = TuneRecord(created=0.0, start="--model tiny", candidates=[candidate])
    try:
        tune._verify(record, config, Console(quiet=True), 0.0, time.monotonic(), tmp_path)
    except KeyboardInterrupt:
        pass
    else:
        raise AssertionError("the interrupt was not passed on")
    assert candidate.ab_folder == str(tmp_path) and candidate.verdict is None


def test_a_candidate_whose_server_will_not_start_fails_alone(tmp_path, monkeypatch):
    import time

    from rich.console import Console

    from latlab.load.target.launch import EngineError
    from latlab.records.tune import Candidate, TuneConfig
    from latlab.services import tune

    def refused(config, err):  # the server exits at once with the candidate's flags
        raise EngineError("latlab serve exited with code 2 before it was ready")

    monkeypatch.setattr(tune, "run_ab", refused)
    config = TuneConfig.model_validate({"bench": {"serve_args": "--model tiny",
                                                  "slos": {"ttft": 300.0}}, "verify": 2})
    candidates = [Candidate(args=f"--model tiny --max-num-seqs {n}", knobs={"max_num_seqs": n},
                            predicted=2, predicted_lo=1, predicted_hi=3, change=1,
                            change_lo=0.5, change_hi=1.5) for n in (8, 16)]
    record = TuneRecord(created=0.0, start="--model tiny", candidates=candidates)
    tune._verify(record, config, Console(quiet=True), 0.0, time.monotonic(), tmp_path)
    assert [c.verdict for c in candidates] == ["failed", "failed"]
    assert "exited with code 2" in record.notes[0]


LLAMA_SERVER = Path(os.environ.get("LATLAB_LLAMA_SERVER", "/work/build/llama-server"))
needs_llama = pytest.mark.skipif(
    not LLAMA_SERVER.is_file(), reason=f"no llama-server at {LLAMA_SERVER} (build it as "
    "scripts/llamacpp.sh says, or set LATLAB_LLAMA_SERVER)")


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    model = tmp_path_factory.mktemp("model")
    subprocess.run([sys.executable, "-m", "latlab", "model", "export", str(model), "--model",
                    "tiny", "--gguf"], check=True, capture_output=True, timeout=300)
    return model / "model.gguf"


def llama_template(gguf: Path) -> str:
    return (f"{LLAMA_SERVER} -m {gguf} --host 127.0.0.1 --port {{port}} -t 1 -c 2048 "
            "{args}")


@needs_llama
@pytest.mark.timeout(600)
def test_tune_on_llama_server_measures_what_its_calibration_has_not_seen(tmp_path, gguf):
    # two slots for four users: more slots make decode batches the start never ran, and a
    # 32-token batch is far below the 400-token prompts it prefilled: both screened by a run
    r = invoke("tune", "--launch", llama_template(gguf), "--serve-args", "-np 2",
               "--users", 4, "--requests", 24, "--prompt-tokens", 400, "--output-tokens",
               "fixed:16", "--slo", "ttft=2s", "--max-num-seqs", "1,4,16",
               "--step-tokens", "32,256", "--verify", 1, "--rounds", 1, "--max-rounds", 1,
               "--draws", 2, "--out", tmp_path, "--json")
    assert r.exit_code == 0, r.output
    record = TuneRecord.model_validate(orjson.loads(r.stdout[r.stdout.index("{"):]))
    assert record.server == "llamacpp"
    by_args = {c.args: c for c in record.candidates}
    # -c 2048 split 16 ways leaves 128 tokens a slot: less than a request needs, not tried
    assert "-np 16" not in by_args and "-np 1" in by_args
    assert by_args["-np 1"].screened == "simulation"
    for args in ("-np 4", "-np 2 -b 32 -ub 32"):
        c = by_args[args]
        assert c.screened == "run" and c.unseen, args
        assert (Path(c.screen_run) / "server.log").is_file()  # a real llama-server run
    assert by_args["-np 2 -b 256 -ub 256"].screened == "simulation"
    verified = [c for c in record.candidates if c.verdict is not None]
    assert len(verified) <= 1 and all(c.ab_folder for c in verified)


def test_a_gain_without_an_interval_is_printed_without_one():
    """A zero-width span is not an interval: the table says there is none."""
    from io import StringIO

    from rich.console import Console

    from latlab.records.tune import Candidate
    from latlab.report.tune import print_tune

    c = Candidate(args="-np 8", knobs={"max_num_seqs": 8}, predicted=2.0, predicted_lo=2.0,
                  predicted_hi=2.0, change=1.0, change_lo=None, change_hi=None, share=1.0)
    out = StringIO()
    print_tune(Console(file=out, width=200), TuneRecord(created=0.0, start="-np 4",
                                                        candidates=[c]))
    assert "+1.00 (no interval)" in out.getvalue() and "…" not in out.getvalue()


def test_where_no_request_met_the_slos_tune_does_not_say_keep_the_start():
    """Goodput 0 everywhere decides nothing: not a "keep the start"."""
    from io import StringIO

    from rich.console import Console

    from latlab.records.tune import Candidate
    from latlab.report.tune import print_tune

    c = Candidate(args="-np 8", knobs={"max_num_seqs": 8}, predicted=0.0, predicted_lo=0.0,
                  predicted_hi=0.0, change=0.0, change_lo=None, change_hi=None)
    out = StringIO()
    print_tune(Console(file=out, width=200), TuneRecord(created=0.0, start="", candidates=[c],
                                                        start_goodput=0.0))
    assert "nothing to rank" in out.getvalue() and "keep the start" not in out.getvalue()


def test_the_setting_to_use_is_the_largest_gain_ab_measured_beside_its_own_start():
    """Two abs, two starts: a busy host measured the start at 1.0 req/s in one and 3.0 in
    the other; the one that doubled its start is better than the one with more req/s."""
    from latlab.records.tune import Candidate
    from latlab.services.tune import _measured_gain

    def verified(args, start, measured):
        return Candidate(args=args, knobs={}, predicted=2.0, predicted_lo=1.0,
                         predicted_hi=3.0, change=1.0, change_lo=0.5, change_hi=1.5,
                         measured_start=start, measured=measured, verdict="better")

    doubled, more = verified("-np 8", 1.0, 2.0), verified("-np 16", 3.0, 3.5)
    assert max([more, doubled], key=_measured_gain) is doubled
    assert _measured_gain(verified("-np 2", None, None)) == float("-inf")


def test_a_larger_gain_that_adds_knobs_to_a_verified_one_is_not_chosen_unmeasured():
    """-np 8 -b 512 measured +134 % in its ab, -np 8 alone +108 % in another, their intervals
    overlapping: what -b 512 adds is not shown, so tune says to use -np 8 and gives the ab
    that would measure it; a gain whose interval lies above the simpler one's still wins."""
    from latlab.records.bench import BenchConfig
    from latlab.records.tune import Candidate, TuneConfig
    from latlab.services.tune import _choose

    def verified(args, knobs, start, measured, low, high):
        return Candidate(args=args, knobs=knobs, predicted=2.0, predicted_lo=1.0,
                         predicted_hi=3.0, change=1.0, change_lo=0.5, change_hi=1.5,
                         measured_start=start, measured=measured, measured_low=low,
                         measured_high=high, verdict="better")

    slots = verified("-np 8", {"max_num_seqs": 8}, 1.13, 2.35, 0.6, 1.6)
    both = verified("-np 8 -b 512 -ub 512", {"max_num_seqs": 8, "step_tokens": 512}, 1.11,
                    2.60, 0.9, 1.8)
    other = verified("-b 512 -ub 512", {"step_tokens": 512}, 1.0, 1.5, 0.1, 0.8)
    config = TuneConfig(bench=BenchConfig(launch="srv --port {port} {args}",
                                          slos={"ttft": 2000.0}))
    record = TuneRecord(created=0.0, start="", baseline_run="runs/start")
    assert _choose([both, slots, other], record, config) == "-np 8"
    (note,) = record.notes
    assert "not shown" in note and "--a '-np 8' --b '-np 8 -b 512 -ub 512'" in note
    assert "--launch 'srv --port {port} {args}'" in note
    record = TuneRecord(created=0.0, start="", baseline_run="runs/start")
    assert _choose([both, other], record, config) == both.args and not record.notes
