"""Hostile input a user types: each is refused with a one-line error naming the option (exit
code 2), before any work, and the help says each option's one default."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from latlab.cli import app


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.mark.parametrize("flag", ["--max-num-seqs", "--num-kv-blocks", "--block-size",
                                  "--max-model-len", "--max-num-batched-tokens"])
@pytest.mark.parametrize("value", ["0", "-3"])
def test_calibrate_refuses_a_server_limit_below_one(tmp_path, flag, value):
    r = invoke("calibrate", "--from", tmp_path, flag, value, "--out", tmp_path / "cal.json")
    assert r.exit_code == 2, r.output
    assert f"{flag} {value}" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "cal.json").exists()


def test_calibrate_help_gives_each_server_limit_one_default():
    out = " ".join(invoke("calibrate", "--help").output.split())
    assert "[default: as many" not in out and "[default: the model's" not in out
    assert "the server's KV-cache blocks (default 100000)" in out


@pytest.mark.parametrize("option", [["--launch", "false --port {port}"],
                                    ["--server-url", "http://127.0.0.1:9"]])
def test_coldstart_refuses_options_it_would_ignore(option):
    """coldstart starts its own server (--command or the engine): bench's --launch and
    --server-url are not its options, rather than silently measuring the engine."""
    r = invoke("coldstart", *option, "--runs", "1")
    assert r.exit_code == 2 and "No such option" in r.output, r.output


@pytest.mark.parametrize(("text", "named"), [
    ('{"duraton_s": 5}', "duraton_s"),
    ('{"bench": {"rate": 2}}', "rate"),
    ("workload:\n  outputtokens: 5\n", "workload.outputtokens"),
])
def test_a_config_file_with_a_misspelt_setting_is_refused(tmp_path, text, named):
    """Left at its default without a word, a typo would measure another workload."""
    path = tmp_path / "load.yaml"
    path.write_text(text)
    r = invoke("bench", "--config", path, "--url", "http://127.0.0.1:9")
    assert r.exit_code == 2, r.output
    assert f"unknown setting {named}" in r.output and "Traceback" not in r.output


def test_a_config_file_of_known_settings_is_taken(tmp_path):
    path = tmp_path / "load.yaml"
    path.write_text("duration_s: 3\narrivals:\n  users: 2\nworkload:\n  output_tokens: '5'\n")
    r = invoke("bench", "--config", path, "--url", "http://127.0.0.1:9", "--users", "0")
    assert r.exit_code == 2 and "--users 0" in r.output, r.output  # read, then the flag checked


def test_an_out_that_is_a_file_is_a_one_line_error(tmp_path):
    (tmp_path / "afile").write_text("")
    r = invoke("bench", "--out", tmp_path / "afile", "--url", "http://127.0.0.1:9")
    assert r.exit_code == 2, r.output
    assert "--out" in r.output and "cannot create a run folder there" in r.output


def test_the_workload_differences_show_settings_as_written():
    from latlab.analysis.unlike import workload_differences
    from latlab.records.bench import BenchConfig
    from latlab.records.config import RunConfig

    a, b = (RunConfig(bench=BenchConfig(url="http://127.0.0.1:9", duration_s=d)) for d in (5, 3))
    shown = workload_differences(a, b)
    assert "duration_s: 5.0 vs 3.0" in shown and "warmup_s: 0.5 vs 0.3" in shown, shown


@pytest.mark.parametrize("where", ["afile/report.html", "missing/report.html"])
def test_report_out_in_no_folder_is_a_one_line_error(tmp_path, where):
    (tmp_path / "afile").write_text("")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text("{}")
    r = invoke("report", tmp_path / "run", "--out", tmp_path / where)
    assert r.exit_code == 2, r.output
    assert "--out" in r.output and "is no folder" in r.output


def test_runs_lists_a_missing_runs_folder_without_creating_it(tmp_path):
    r = invoke("runs", "--runs-dir", tmp_path / "nowhere" / "runs")
    assert r.exit_code == 0 and "no runs stored yet" in r.output, r.output
    assert not (tmp_path / "nowhere").exists()
    (tmp_path / "afile").write_text("")
    r = invoke("runs", "--runs-dir", tmp_path / "afile")
    assert r.exit_code == 2 and "not a folder" in r.output, r.output


def test_calibrate_out_under_a_file_is_a_one_line_error(tmp_path, monkeypatch):
    from sim_helpers import calibration

    from latlab.sim import calibration as calibrations

    # the fit is test_predict's; here only where it is written
    monkeypatch.setattr(calibrations, "run_calibration", lambda *_: calibration())
    (tmp_path / "afile").write_text("")
    r = invoke("calibrate", "--from", tmp_path, "--out", tmp_path / "afile" / "cal.json")
    assert r.exit_code == 2, r.output
    assert "--out" in r.output and "cannot write it" in r.output


def test_ctrl_c_in_an_ab_round_stops_ab_as_interrupted(tmp_path, monkeypatch):
    """The bench of a round catches Ctrl-C itself and ends as an interrupted run: ab must
    stop there as interrupted (the finished rounds compared and kept), not fail as if the
    round's server had, nor go on to the next round with a partial one."""
    from types import SimpleNamespace

    from latlab.analysis.ab import Sequential
    from latlab.records.ab import ABConfig, ABRecord
    from latlab.services import ab

    run = SimpleNamespace(path=tmp_path / "round")
    summary = SimpleNamespace(stop_reason="interrupted", cache=None, client=None)
    monkeypatch.setattr(ab, "run_bench", lambda *a, **k: SimpleNamespace(
        run=run, summary=summary, failed=True, message="interrupted (Ctrl-C)"))
    monkeypatch.setattr(ab, "_scrape", lambda config: None)
    config = ABConfig(a="http://127.0.0.1:9", b="http://127.0.0.1:10")
    done = ab.ABRuns(tmp_path, ABRecord(created=0.0, a=config.a, b=config.b),
                     Sequential(config, config.most_rounds, config.decide_on))
    with pytest.raises(KeyboardInterrupt):
        ab._round(done, config.sides()["A"], "A", 2, config, None)
    assert [r.round for r in done.record.rounds] == [2] and not done.analyses["A"]


def test_ab_refuses_a_sides_unknown_engine_option_before_starting_anything():
    r = invoke("ab", "--a", "", "--b", "--max-num-seqs many", "--duration", "2")
    assert r.exit_code == 2, r.output
    assert "--b" in r.output and "--max-num-seqs" in r.output
    r = invoke("ab", "--a", "--nosuchflag", "--b", "", "--duration", "2")
    assert r.exit_code == 2 and "--a" in r.output and "--nosuchflag" in r.output, r.output


@pytest.mark.parametrize("text", ["", "not a span\n", '{"timestamp": 0}\n'])
def test_observe_from_a_file_without_spans_is_bad_input(tmp_path, text):
    spans = tmp_path / "spans.jsonl"
    spans.write_text(text)
    r = invoke("observe", "--from", spans, "--out", tmp_path / "runs")
    assert r.exit_code == 2, r.output
    assert f"--from {spans}: no span latlab could read" in " ".join(r.output.split())


@pytest.mark.parametrize(("reason", "message", "said"), [
    ("interrupted", "interrupted (Ctrl-C): the points finished so far are kept",
     "interrupted (Ctrl-C): the points finished so far are kept"),
    ("all_points", "every load given was run", "all_points: every load given was run"),
])
def test_a_sweeps_stop_line_says_its_reason_once(reason, message, said):
    from types import SimpleNamespace

    from latlab.report.sweep import sweep_answers

    sweep = SimpleNamespace(knee=None, slo_max=None, slo_max_cost=None, definitions={},
                            stop=SimpleNamespace(reason=reason, message=message))
    lines = [t.plain for t in sweep_answers(sweep)]
    assert f"stopped   {said}" in lines, lines
