"""latlab compare: changes with CIs, attribution to components, workload check, gates."""

import numpy as np
import pytest
from timelines import timeline, write_run
from typer.testing import CliRunner

from latlab.analysis import analyze
from latlab.analysis.compare import CompareError, compare
from latlab.analysis.gate import Gate, GateError
from latlab.analysis.unlike import workload_differences
from latlab.cli import app
from latlab.records.config import RunConfig
from latlab.report.comparison import attribution_line

BENCH = {"bench": {"workload": {"prompt_tokens": {"kind": "fixed", "a": 100}},
                   "arrivals": {"process": "poisson", "rate": 10.0},
                   "url": "http://127.0.0.1:1", "name": "x"}}


def run_with(tmp_path, queue_ms: float, n: int = 80, seed: int = 0, config=None):
    rng = np.random.default_rng(seed)
    records = [timeline(i, i * 100, queue=queue_ms * rng.uniform(0.5, 1.5),
                        prefill=20 * rng.uniform(0.9, 1.1)) for i in range(n)]
    return analyze(write_run(tmp_path, records, config=config or BENCH))


def test_a_queue_regression_is_worse_and_attributed_to_queue(tmp_path):
    a = run_with(tmp_path, queue_ms=10)
    b = run_with(tmp_path, queue_ms=60, seed=1)
    c = compare(a, b)
    ttft = c.change("p50_ttft")
    assert ttft.verdict == "worse" and ttft.interval.low > 0.5, ttft.interval
    assert ttft.delta == pytest.approx(50, rel=0.3)
    moved = max(ttft.attribution, key=lambda k: abs(ttft.attribution[k]))
    assert moved == "queue"
    assert abs(ttft.attribution["prefill"]) < 3
    line = attribution_line(ttft)
    assert "queue +" in line and "prefill" in line and "unchanged" in line
    assert c.change("p50_tpot").verdict == "can't tell"  # two single runs: never "same"
    tail = c.change("p99_ttft")  # blocks of 20 requests: a p99 is a block's largest
    assert not tail.judged and "too few samples a block for a p99" in tail.why, tail.why
    assert c.budgets["mean"][1].bucket("queue & overhead") > c.budgets["mean"][0].bucket(
        "queue & overhead")


def test_same_setup_twice_is_never_better_or_worse(tmp_path):
    c = compare(run_with(tmp_path, 10, seed=2), run_with(tmp_path, 10, seed=3))
    latency = [ch for ch in c.changes if ch.unit == "ms"]
    assert latency and {ch.verdict for ch in latency} == {"can't tell"}, [
        (ch.key, ch.a, ch.b, ch.why) for ch in latency if ch.verdict in ("better", "worse")]


def test_a_change_inside_the_minimum_effect_is_the_same(tmp_path):
    """The same requests, each 0.5 ms longer in the queue: about 1.5 % of a ~32 ms TTFT,
    inside the 5 % default, so "same" where a repeat of A shows the drift between runs; two
    single runs cannot see it, so from them alone it is "can't tell" (use latlab ab); a 1 %
    minimum effect is inside the interval: neither same nor (two single runs) a change."""
    from latlab.analysis.replicates import from_blocks
    from latlab.records.verdict import VerdictConfig

    a = run_with(tmp_path, 10, n=2000, seed=4)

    def rerun(queue_ms: float):
        return analyze(write_run(tmp_path, [timeline(i, i * 100, queue=r.server.queue
                                                     + queue_ms, prefill=r.server.prefill)
                                            for i, r in enumerate(a.run.read_records())],
                                 config=BENCH))

    b, repeat = rerun(0.5), rerun(0.1)
    single = compare(a, b).change("p50_ttft")
    assert single.verdict == "can't tell" and "inside ±5%" in single.why, single.why
    assert "latlab ab" in single.why and -0.05 < single.interval.low < single.interval.high < 0.05
    repeated = compare(a, b, from_blocks(a, b, repeat)).change("p50_ttft")
    assert repeated.verdict == "same" and "inside ±5%" in repeated.why
    finer = compare(a, b, verdicts=VerdictConfig(min_effect=["1%"])).change("p50_ttft")
    assert finer.verdict == "can't tell", finer.interval


def test_a_percentile_is_judged_only_with_enough_samples_above_it():
    """A p99 of 12 requests a round is the round's largest: whether it caught a stall. Rounds
    17 ms against 8 ms (a caching A/A under load) are not judged; a p50 of the same is."""
    from latlab.analysis.replicates import MIN_TAIL, Replicates, sample_count

    def side(n: int, values: list[float]) -> list[dict[str, float]]:
        return [{"p99_ttft": v, "p90_ttft": v, "p50_ttft": v, sample_count("ttft"): n}
                for v in values]

    few = Replicates(side(12, [17.0, 18.0, 16.0]), side(12, [8.0, 8.2, 7.9]), "", "rounds",
                     strict=False)
    assert ("too few samples a round for a p99: as few as 12, and 500 a round"
            in few.thin("p99_ttft"))
    assert few.thin("p90_ttft") is not None  # 1.2 above it
    assert few.thin("p50_ttft") is None and few.thin("output_tokens_per_s") is None
    enough = Replicates(side(100 * MIN_TAIL, [17.0] * 3), side(50 * MIN_TAIL, [8.0] * 3), "",
                        "rounds", strict=False)
    assert enough.thin("p99_ttft") is not None  # one side's rounds are too small
    assert Replicates(side(100 * MIN_TAIL, [1.0]), side(100 * MIN_TAIL, [1.0]), "", "rounds",
                      strict=False).thin("p99_ttft") is None


def test_a_change_within_the_drift_between_runs_cannot_be_told(tmp_path):
    from latlab.analysis.replicates import from_blocks

    a, b = run_with(tmp_path, 10, seed=5), run_with(tmp_path, 13, seed=6)
    repeat = run_with(tmp_path, 16, seed=7)  # the baseline, rerun: its queue drifted more
    drifted = compare(a, b, from_blocks(a, b, repeat)).change("p50_ttft")
    assert drifted.verdict == "can't tell", drifted.interval
    assert drifted.interval.low < 0 < drifted.interval.high
    assert "drift between runs" in from_blocks(a, b, repeat).source


def test_unmeasured_components_are_not_attributed(tmp_path):
    """B's server sent no timings (a gateway stripped them): its prefill is unknown, not 0."""
    a = run_with(tmp_path, queue_ms=10)
    rng = np.random.default_rng(1)
    b = analyze(write_run(tmp_path, [timeline(i, i * 100, queue=60 * rng.uniform(0.5, 1.5),
                                              prefill=20, server=False) for i in range(80)],
                          config=BENCH))
    ttft = compare(a, b).change("p50_ttft")
    assert "prefill" not in ttft.attribution and "queue" not in ttft.attribution


def test_workload_differences_ignore_where_the_load_went(tmp_path):
    base = RunConfig.model_validate(BENCH)
    other_target = {"bench": {**BENCH["bench"], "url": "http://127.0.0.1:2", "name": "y"}}
    assert workload_differences(base, RunConfig.model_validate(other_target)) == []
    (tmp_path / "key").write_text("sk-test\n")
    keyed = {"bench": {**BENCH["bench"], "api_key_file": str(tmp_path / "key")}}
    assert workload_differences(base, RunConfig.model_validate(keyed)) == []  # not workload
    other_rate = {"bench": {**BENCH["bench"],
                            "arrivals": {"process": "poisson", "rate": 20.0}}}
    assert workload_differences(base, RunConfig.model_validate(other_rate)) == [
        "arrivals.rate: 10.0 vs 20.0"]


def test_gates(tmp_path):
    c = compare(run_with(tmp_path, 10), run_with(tmp_path, 60, seed=1))
    tripped = Gate.parse("p50_ttft>+10%").check(c)
    assert tripped.status == "tripped" and "p50_ttft>+10%" in tripped.message
    assert Gate.parse("p50_ttft>+500%").check(c).status == "passed"
    assert Gate.parse("p50_ttft>+0.01s").check(c).status == "tripped"  # absolute, seconds
    assert Gate.parse("p50_tpot>+10%").check(c).status == "passed"
    assert c.change("error_rate").a == 0  # no relative change from 0 to 0: it passes
    assert Gate.parse("error_rate>+10%").check(c).status == "passed"


def test_a_gate_the_interval_reaches_cannot_tell(tmp_path):
    from latlab.analysis.replicates import from_blocks

    a, b = run_with(tmp_path, 10), run_with(tmp_path, 60, seed=1)
    repeat = run_with(tmp_path, 70, seed=2)  # the baseline again, as slow as B
    c = compare(a, b, from_blocks(a, b, repeat))
    result = Gate.parse("p50_ttft>+10%").check(c)
    assert result.status == "inconclusive" and "too noisy to gate" in result.message
    interval = c.change("p50_ttft").interval
    past = 100 * (interval.estimate + interval.high) / 2  # beyond what was seen, within reach
    near = Gate.parse(f"p50_ttft>+{past:.0f}%").check(c)
    assert near.status == "inconclusive" and "reaches" in near.message, near.message
    with pytest.raises(GateError, match="expected KEY>VALUE"):
        Gate.parse("ttft got worse")
    with pytest.raises(GateError, match="unknown metric 'p42_speed'"):
        Gate.parse("p42_speed>1").check(c)


def test_a_run_without_successes_cannot_be_compared(tmp_path):
    from latlab.records.timeline import Outcome
    empty = analyze(write_run(tmp_path, [timeline(0, 0, outcome=Outcome.HTTP_5XX)], config=BENCH))
    with pytest.raises(CompareError, match="no successful request"):
        compare(run_with(tmp_path, 10), empty)


def test_cli_exit_codes(tmp_path):
    a = run_with(tmp_path, 10).run.path
    b = run_with(tmp_path, 60, seed=1).run.path
    slower_rate = {"bench": {**BENCH["bench"], "arrivals": {"rate": 99.0}}}
    d = run_with(tmp_path, 10, config=slower_rate).run.path
    cli = CliRunner()
    ok = cli.invoke(app, ["compare", str(a), str(b)])
    assert ok.exit_code == 0 and "queue" in ok.output
    tripped = cli.invoke(app, ["compare", str(a), str(b), "--fail-if", "p50_ttft>+10%",
                               "--fail-if", "p50_tpot>+50%"])
    assert tripped.exit_code == 1 and "gate tripped: p50_ttft" in tripped.output
    assert "gate passed: p50_tpot" in tripped.output  # every gate listed
    repeat = run_with(tmp_path, 70, seed=2).run.path  # the baseline again, as noisy as B
    noisy = cli.invoke(app, ["compare", str(a), str(b), "--noise", str(repeat),
                             "--fail-if", "p50_ttft>+10%"])
    assert noisy.exit_code == 3 and "too noisy to gate" in noisy.output
    # blocks of 20 requests: a p99 is not judged, so a gate on it cannot pass or trip
    thin = cli.invoke(app, ["compare", str(a), str(b), "--fail-if", "p99_ttft>+1000%"])
    assert thin.exit_code == 3 and "not judged: too few samples a block" in thin.output
    passed = cli.invoke(app, ["compare", str(a), str(b), "--fail-if", "p50_tpot>+50%"])
    assert passed.exit_code == 0 and "gates passed" in passed.output
    refused = cli.invoke(app, ["compare", str(a), str(d)])
    assert refused.exit_code == 2 and "different workloads" in refused.output
    allowed = cli.invoke(app, ["compare", str(a), str(d), "--allow-different-workloads"])
    assert allowed.exit_code == 0
    assert cli.invoke(app, ["compare", str(a), str(tmp_path / "nope")]).exit_code == 2


def test_slos_are_an_analysis_threshold_not_the_workload():
    strict = {"bench": {**BENCH["bench"], "slos": {"ttft": 100.0}}}
    loose = {"bench": {**BENCH["bench"], "slos": {"ttft": 900.0}}}
    assert workload_differences(RunConfig.model_validate(strict),
                                RunConfig.model_validate(loose)) == []


def test_goodput_is_compared_only_under_the_same_slos(tmp_path):
    a = run_with(tmp_path, 10).run.path
    b = run_with(tmp_path, 60, seed=1).run.path
    cli = CliRunner()
    no_slos = cli.invoke(app, ["compare", str(a), str(b), "--fail-if", "goodput<-10%"])
    assert no_slos.exit_code == 2 and "give compare --slo" in no_slos.output
    assert "B against A" not in no_slos.output  # refused before any table is printed
    judged = cli.invoke(app, ["compare", str(a), str(b), "--slo", "ttft=60ms",
                              "--fail-if", "goodput<-10%"])
    assert judged.exit_code == 1 and "goodput changed by" in judged.output
    unknown = cli.invoke(app, ["compare", str(a), str(b), "--fail-if", "p42_speed>1"])
    assert unknown.exit_code == 2 and "B against A" not in unknown.output


def test_a_bucket_no_request_measured_prints_as_unknown_not_zero(tmp_path):
    """Without the server's timings its stages are unknown: '–', not '0.0 ms 0%'."""
    from rich.console import Console

    from latlab.report.budget_bars import print_budget

    run = analyze(write_run(tmp_path, [timeline(i, i * 100, server=False) for i in range(20)],
                            config=BENCH))
    assert not run.mean.measured("prefill") and run.mean.measured("network")
    console = Console(record=True, width=120, color_system=None)
    print_budget(console, run)
    prefill = next(line for line in console.export_text().splitlines() if "prefill" in line)
    assert "not measured" in prefill and "0.0 ms" not in prefill


def test_an_error_rate_is_tested_at_the_looks_share_of_alpha():
    """A sequential A/B's look spends part of α: an error-rate difference significant at
    5 % (Fisher p ≈ 0.02) is a change when the look spends it all, not when it spends 10 %."""
    from types import SimpleNamespace

    from latlab.analysis.compare import _error_rate
    from latlab.analysis.significance import fisher_test

    a, b = SimpleNamespace(in_window=200, ok=198), SimpleNamespace(in_window=200, ok=188)
    p = fisher_test([[2, 198], [12, 188]])
    assert 0.005 < p < 0.05
    assert _error_rate(a, b, 0.05).verdict == "worse"
    assert _error_rate(a, b, 0.005).verdict != "worse"


def test_settings_that_differ_only_in_a_floats_last_bits_are_one_workload():
    """A warm-up derived from the duration (0.1 × 1.5 s = 0.15000000000000002) and one written
    as 0.15 are the same setting: not "0.15 vs 0.15", which would refuse the comparison."""
    from latlab.records.bench import BenchConfig

    derived, written = (RunConfig(bench=BenchConfig(url="http://127.0.0.1:9", duration_s=1.5,
                                                    warmup_s=w)) for w in (None, 0.15))
    assert derived.bench.warmup_s != written.bench.warmup_s  # the last bits differ
    assert workload_differences(derived, written) == []
