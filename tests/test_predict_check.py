"""`predict --check` compares like with like: a run that did not stream is checked on E2E
only (its measured TTFT is the whole answer's time), and an interval that reaches ∞ decides
nothing (it counts neither way in the coverage)."""

import math

from sim_helpers import calibration

from latlab.records.bench import BenchConfig
from latlab.records.config import RunConfig
from latlab.records.simulation import Fleet, Simulation
from latlab.services.bench import run_bench
from latlab.services.predict_check import Checked, check_run, coverage
from latlab.services.predict_intervals import Intervals
from latlab.sim.fleet import simulate
from latlab.sim.folder import write_run
from latlab.sim.workload import build


def checked(measured: float, hi: float) -> Checked:
    return Checked("run", "4 users", "ttft", "p99", measured, 100.0, 50.0, hi)


def test_an_interval_that_reaches_infinity_decides_nothing():
    checks = [checked(80, 200), checked(900, 200), checked(5000, math.inf)]
    assert [c.decides for c in checks] == [True, True, False]
    assert checks[2].inside  # ∞ holds anything: that is why it cannot count
    assert coverage(checks) == 0.5
    assert math.isnan(coverage([checked(1, math.inf)]))


def test_a_run_that_did_not_stream_is_checked_on_e2e_only(tmp_path):
    """A real unstreamed run of the embedded engine against a streamed run of the same
    settings (a simulated one: a run folder as bench writes it), both checked against one
    calibration."""
    bench = BenchConfig(serve_args="--model tiny", users=2, requests=24, out=tmp_path,
                        workload={"prompt_tokens": 200, "output_tokens": "fixed:24"})
    unstreamed = run_bench(bench.model_copy(update={"stream": False}))
    assert not unstreamed.failed and not unstreamed.run.read_config().bench.stream
    workload = build(bench.workload, bench.arrivals, bench.requests, None)
    cal = calibration()
    streamed, _ = write_run(simulate(workload, cal), workload, RunConfig(
        kind="predict", bench=bench, simulation=Simulation(calibration="test")), tmp_path, "s")
    assert streamed.read_config().bench.stream
    intervals = Intervals(draws=2, requests=100, world_requests=48)
    assert {c.metric for c in check_run(streamed, cal, Fleet(), intervals)} == \
        {"ttft", "tpot", "e2e"}
    checks = check_run(unstreamed.run, cal, Fleet(), intervals)
    assert checks and {c.metric for c in checks} == {"e2e"}
