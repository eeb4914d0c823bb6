"""Advice tested before it is given: each suggested setting is simulated with the run's own
calibration, on paired draws; one predicted to hurt is left out of the fix, and every one kept
carries its predicted effect and a `latlab ab` that measures it."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from latlab.analysis import analyze
from latlab.analysis.advice import with_args
from latlab.analysis.findings import Advice, Change, Finding, Severity
from latlab.analysis.rules.compute import STALL_METRIC
from latlab.records.bench import BenchConfig
from latlab.records.calibration import Spread
from latlab.records.simulation import Fleet
from latlab.services.advice_effects import (
    Effect,
    annotate,
    changed,
    predict_effect,
    run_calibration,
)
from latlab.services.bench import run_bench
from latlab.services.calibration_reach import unseen


def test_a_change_replaces_the_options_it_names_under_either_spelling():
    assert with_args("-m M --batch-size 2048 -ub 512 -t 1", "-b 64 -ub 64") == \
        "-m M -t 1 -b 64 -ub 64"
    assert with_args("--model tiny --max-num-batched-tokens=512", "--max-num-batched-tokens 128"
                     ) == "--model tiny --max-num-batched-tokens 128"
    assert with_args("", "--enable-prefix-caching") == "--enable-prefix-caching"
    assert with_args("--model-path M --chunked-prefill-size -1", "--chunked-prefill-size 512"
                     ) == "--model-path M --chunked-prefill-size 512"


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """A short run of latlab serve (tiny) batching 2 sequences for 4 users: half wait."""
    out = tmp_path_factory.mktemp("runs")
    config = BenchConfig(serve_args="--model tiny --max-num-seqs 2 --max-num-batched-tokens 256",
                         users=4,
                         requests=60, out=out,
                         workload={"prompt_tokens": 600, "output_tokens": "fixed:32"})
    result = run_bench(config)
    assert not result.failed, result.message
    return result.run


def test_the_runs_own_calibration_knows_the_servers_settings(measured):
    cal = run_calibration(analyze(measured))
    assert cal.engine.max_num_batched_tokens == 256 and cal.engine.max_num_seqs == 2
    fewer = changed(cal, Change("max_num_seqs", 1, "latlab", "--max-num-seqs 1"))
    assert fewer.engine.max_num_seqs == 1 and cal.engine.max_num_seqs == 2


def apart(cal):
    """`cal` with worlds its spread sets apart: a short run's own may have no level spread
    and one window's drift (none), and then no interval decides anything."""
    s = cal.spread
    return cal.model_copy(update={"spread": s.model_copy(update={"shape": max(s.shape, 0.1)})})


def test_a_change_predicted_to_hurt_is_not_advised_and_one_kept_says_how_to_measure(measured):
    a = analyze(measured)
    one = Advice("one sequence at a time",
                 Change("max_num_seqs", 1, "latlab", "--max-num-seqs 1"))
    # every user's request in the batch at once: none waits in the queue for its first token
    bigger = Advice("a bigger batch", Change("max_num_seqs", 8, "latlab", "--max-num-seqs 8"))
    f = Finding("test", Severity.INFO, "t", [], "w", "", 0.5,
                tries=[one, Advice("shorter prompts"), bigger], metric=("ttft", "p50"))
    a.findings = [f]
    assert annotate(a, apart(run_calibration(a)), draws=4) == []
    # four users queued behind one sequence: TTFT and the output rate both suffer
    assert "one sequence" not in f.fix and "shorter prompts" in f.fix
    assert any(n.startswith("not advised: predicted for `--max-num-seqs 1`") for n in f.notes)
    assert one not in f.tries and bigger in f.tries
    measure = [n for n in f.notes if n.startswith("measure it: ")]
    assert len(measure) == 1  # the one setting kept
    words = shlex.split(measure[0].removeprefix("measure it: "))
    assert words[:4] == ["latlab", "ab", "--config", str(measured.path)]
    a_args = "--model tiny --max-num-seqs 2 --max-num-batched-tokens 256"
    assert words[words.index("--a") + 1] == a_args
    assert words[words.index("--b") + 1] == \
        "--model tiny --max-num-batched-tokens 256 --max-num-seqs 8"
    # its rounds go on until the finding's own metric is decided
    assert words[words.index("--decide-on") + 1] == "p50_ttft"
    # the run only ever batched 2: a batch of 4 is a step its calibration never timed, so it
    # is not predicted (no number made up) but kept, with the ab that measures it
    assert any(n.startswith("not predicted for `--max-num-seqs 8`: the run timed decode "
                            "batches of at most 2") for n in f.notes)
    assert not any(n.startswith("predicted for `--max-num-seqs 8`") for n in f.notes)


def test_a_budget_far_below_the_chunks_the_run_timed_is_measured_not_predicted(measured):
    a = analyze(measured)  # 600-token prompts in chunks of 256
    tiny = Advice("a tiny budget", Change("step_tokens", 32, "latlab",
                                          "--max-num-batched-tokens 32"))
    half = Advice("half the budget", Change("step_tokens", 128, "latlab",
                                            "--max-num-batched-tokens 128"))
    f = Finding("test", Severity.INFO, "t", [], "w", "", 0.5, tries=[tiny, half],
                metric=STALL_METRIC)
    a.findings = [f]
    annotate(a, draws=3)
    assert tiny in f.tries and any(
        n.startswith("not predicted for `--max-num-batched-tokens 32`: the run timed prefills "
                     "in steps of about 256 prompt tokens") for n in f.notes)
    # half the chunk it timed is within reach: simulated (advised or left out, but predicted)
    # on the stall finding's metric, which the simulated streams' token times give
    said = [n for n in f.notes if n.startswith(
        ("predicted for `--max-num-batched-tokens 128`",
         "not advised: predicted for `--max-num-batched-tokens 128`"))]
    assert len(said) == 1 and ": mean ITL per-request max " in said[0]
    measure = [n for n in f.notes if n.startswith("measure it: ")]
    assert len(measure) == len(f.tries)
    assert all(n.endswith("--decide-on mean_itl_max") for n in measure)


def test_a_predicted_effect_is_judged_on_its_interval_and_the_output_rate():
    change = Change("step_tokens", 128, "latlab", "--max-num-batched-tokens 128")

    def effect(lo, hi, output=0.0):
        return Effect(change, ("itl", "p99"), 100.0, 100.0 + (lo + hi) / 2, lo, hi, output,
                      output, 8)

    assert effect(-40, -5).verdict == "better" and effect(5, 40).verdict == "worse"
    assert effect(-40, 10).verdict == "can't tell" and effect(0, 0).verdict == "no effect"
    # a shorter stall bought with a fifth of the output rate is no improvement
    assert effect(-40, -5, output=-0.2).verdict == "worse"
    # one bought with a longer wait for the first token is a trade: said beside it
    traded = Effect(change, ("itl", "p99"), 100.0, 80.0, -30, -10, 0.0, 0.0, 8,
                    ttft_change=1.9)
    assert traded.verdict == "better" and traded.line().endswith("TTFT p50 +190%: better")
    assert "TTFT" not in effect(-40, -5).line()


def test_without_draws_the_point_estimates_decide_and_say_they_have_no_interval(measured):
    a = analyze(measured)
    half = Change("step_tokens", 128, "latlab", "--max-num-batched-tokens 128")
    e = predict_effect(run_calibration(a), a.config, Fleet(), half, ("itl", "p99"), draws=0)
    assert e is not None and e.point and e.draws == 0 and e.lo == e.hi == e.after - e.before
    assert "a point estimate, no interval" in e.line() and "paired draws" not in e.line()

    def point(before, after, output=0.0):
        d = after - before
        return Effect(half, ("itl", "p99"), before, after, d, d, output, output, 0,
                      interval=False, difference=d)

    assert point(100, 80).verdict == "better" and point(100, 120).verdict == "worse"
    assert point(100, 100.5).verdict == "no effect"
    assert point(100, 80, output=-0.2).verdict == "worse"  # bought with the output rate


def test_worlds_the_spread_does_not_set_apart_give_no_interval_and_decide_nothing(measured):
    """llama-server's advice once printed "difference −624.3 ms to −624.3 ms": a calibration
    whose spread has no level and no drift draws the same world eight times, and a fixed
    workload then gives the same difference in each — a span of width zero, not an
    interval."""
    a = analyze(measured)
    cal = run_calibration(a)
    flat = cal.model_copy(update={"spread": Spread(step=0.3)})  # noisy steps, no level/drift
    half = Change("step_tokens", 128, "latlab", "--max-num-batched-tokens 128")
    e = predict_effect(flat, a.config, Fleet(), half, ("itl", "p99"), draws=3)
    assert e is not None and e.draws == 3
    assert not e.interval and e.verdict == "can't tell"
    assert "no interval" in e.line() and "difference" not in e.line()
    # the same change in worlds the spread does set apart: an interval of some width
    apart = cal.model_copy(update={"spread": Spread(step=0.3, shape=0.2, drift=0.1)})
    e = predict_effect(apart, a.config, Fleet(), half, ("itl", "p99"), draws=3)
    assert e is not None and e.interval and e.lo < e.hi and "% difference" in e.line()


def test_the_changes_predicted_better_come_first_the_largest_paired_gain_first(measured,
                                                                              monkeypatch):
    """Ranked by the paired differences' median, not by the medians' difference: a change
    whose sides' medians differ most may gain less draw by draw."""
    from latlab.services import advice_effects

    a = analyze(measured)
    small = Change("step_tokens", 128, "latlab", "--max-num-batched-tokens 128")
    large = Change("step_tokens", 192, "latlab", "--max-num-batched-tokens 192")
    unsure = Change("max_num_seqs", 1, "latlab", "--max-num-seqs 1")
    predicted = {  # before, after (medians), lo, hi, the paired differences' median
        small: (100.0, 60.0, -30.0, -5.0, -10.0),   # medians 40 apart, 10 a draw
        large: (100.0, 80.0, -40.0, -20.0, -30.0),  # medians 20 apart, 30 a draw
        unsure: (100.0, 50.0, -60.0, 10.0, -50.0)}  # the largest, but can't tell

    def effect(cal, config, fleet, change, metric, draws):
        before, after, lo, hi, d = predicted[change]
        return Effect(change, metric, before, after, lo, hi, 0.0, 0.0, draws, difference=d)

    monkeypatch.setattr(advice_effects, "predict_effect", effect)
    monkeypatch.setattr(advice_effects, "unseen", lambda cal, a, change: None)
    tries = [Advice("shorter prompts"), Advice("unsure", unsure), Advice("small", small),
             Advice("large", large)]
    f = Finding("test", Severity.INFO, "t", [], "w", "", 0.5, tries=list(tries),
                metric=("itl", "p99"))
    a.findings = [f]
    annotate(a, run_calibration(a), draws=3)
    assert [t.text for t in f.tries] == ["large", "small", "shorter prompts", "unsure"]
    assert f.fix == "large; small; shorter prompts; unsure"


def test_a_run_with_no_workload_to_simulate_says_so_not_that_the_metric_had_none(measured):
    a = analyze(measured)
    cal = run_calibration(a)
    a.config = a.config.model_copy(update={"bench": None})  # as an observed run's
    half = Advice("half", Change("step_tokens", 128, "latlab", "--max-num-batched-tokens 128"))
    f = Finding("test", Severity.INFO, "t", [], "w", "", 0.5, tries=[half],
                metric=("itl", "p99"))
    a.findings = [f]
    annotate(a, cal, draws=2)
    assert half in f.tries and any(n.startswith(
        "not predicted for `--max-num-batched-tokens 128`: the run has no workload")
        for n in f.notes)


LLAMA_SERVER = Path(os.environ.get("LATLAB_LLAMA_SERVER", "/work/build/llama-server"))


@pytest.mark.skipif(not LLAMA_SERVER.is_file(), reason=f"no llama-server at {LLAMA_SERVER} "
                    "(build it as scripts/llamacpp.sh says, or set LATLAB_LLAMA_SERVER)")
def test_on_llama_server_a_batch_its_run_never_timed_is_measured_not_predicted(tmp_path):
    """Last session `-b 64 -ub 64` was predicted +7 % output tokens/s on llama-server and
    measured −71 %: a calibration fitted at the default -b 2048 never timed a 64-token batch."""
    model = tmp_path / "model"
    subprocess.run([sys.executable, "-m", "latlab", "model", "export", str(model), "--model",
                    "tiny", "--gguf"], check=True, capture_output=True, timeout=300)
    launch = (f"{LLAMA_SERVER} -m {model / 'model.gguf'} --host 127.0.0.1 --port {{port}} "
              "-t 1 -c 2048 {args}")
    result = run_bench(BenchConfig(launch=launch, serve_args="-np 2", users=4, requests=24,
                                   out=tmp_path / "runs",
                                   workload={"prompt_tokens": 400, "output_tokens": "fixed:16"}))
    assert not result.failed, result.message
    a = analyze(result.run)
    cal = run_calibration(a)
    assert cal.source == "run" and cal.engine.max_num_seqs == 2  # its /props: 2 slots
    # one prompt and output length at one load: the fit says what it could not tell apart
    assert any(re.match(r"the run tells apart [0-4] of the 5 step costs", n) for n in cal.notes)

    def change(knob, value, args):
        return Change(knob, value, "llamacpp", args)

    assert "a step of 64" in unseen(cal, a, change("step_tokens", 64, "-b 64 -ub 64"))
    assert unseen(cal, a, change("step_tokens", 256, "-b 256 -ub 256")) is None
    assert "at most 2" in unseen(cal, a, change("max_num_seqs", 4, "-np 4"))
    assert unseen(cal, a, change("max_num_seqs", 1, "-np 1")) is None
    small = Advice("a smaller batch", change("step_tokens", 64, "-b 64 -ub 64"))
    f = Finding("test", Severity.INFO, "t", [], "w", "", 0.5, tries=[small],
                metric=("itl", "p99"))
    a.findings = [f]
    annotate(a, draws=2)
    assert small in f.tries  # kept, with no number: the ab that measures it instead
    assert f.notes[0].startswith("not predicted for `-b 64 -ub 64`")
    words = shlex.split(f.notes[1].removeprefix("measure it: "))
    assert words[words.index("--launch") + 1] == launch
    assert words[words.index("--a") + 1] == "-np 2"
    assert words[words.index("--b") + 1] == "-np 2 -b 64 -ub 64"
