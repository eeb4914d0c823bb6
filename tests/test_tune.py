"""`latlab tune` on latlab serve: one measured run calibrates the simulator, the batching
settings are screened on paired draws, the best predicted gain is verified with ab, and
tune.json says what was predicted, measured, and whether the two agree."""

import orjson
from typer.testing import CliRunner

from latlab.cli import app
from latlab.records.tune import TuneRecord


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def test_tune_screens_in_the_simulator_and_measures_the_best_predicted_gain(tmp_path):
    # two sequences at a time for six users: most requests wait, and the TTFT SLO fails
    r = invoke("tune", "--serve-args", "--model tiny --max-num-seqs 2", "--users", 6,
               "--requests", 48, "--prompt-tokens", 200, "--output-tokens", "fixed:16",
               "--slo", "ttft=300ms", "--max-num-seqs", "1,2,8", "--step-tokens", "64,256",
               "--verify", 1, "--rounds", 1, "--max-rounds", 1, "--draws", 3, "--out", tmp_path,
               "--json")
    assert r.exit_code == 0, r.output
    answer = orjson.loads(r.stdout[r.stdout.index("{"):])
    record = TuneRecord.model_validate(answer)
    args = {c.args for c in record.candidates}
    assert "--model tiny --max-num-seqs 8" in args and "--model tiny --max-num-seqs 1" in args
    assert "--model tiny --max-num-seqs 2 --max-num-batched-tokens 64" in args
    predicted = [c.predicted for c in record.candidates]
    assert predicted == sorted(predicted, reverse=True)  # best predicted first
    assert all(c.predicted_lo <= c.predicted <= c.predicted_hi for c in record.candidates)
    gains = [c for c in record.candidates if c.change > 0]
    if gains:  # the best predicted gain is measured, and set against its prediction
        best = gains[0]
        assert best.ab_folder is not None and best.measured is not None
        assert best.agrees is not None and best.verdict is not None
    assert all(c.ab_folder is None for c in record.candidates if c.change <= 0)
    assert record.baseline_run and record.start_goodput is not None
    assert record.start_predicted is not None


def test_tune_needs_slos_and_a_server_it_can_restart(tmp_path):
    r = invoke("tune", "--serve-args", "--model tiny", "--requests", 4, "--out", tmp_path)
    assert r.exit_code != 0 and "--slo" in r.output and "Traceback" not in r.output
    r = invoke("tune", "--url", "http://127.0.0.1:9", "--slo", "ttft=1s", "--out", tmp_path)
    assert r.exit_code != 0 and "--url" in r.output
