"""The simulator: decode runs change nothing but the speed, the step-cost fit, the fleet's
router, admission control and autoscaler, closed loops and concurrency caps, workloads."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from sim_helpers import calibration, fixed, open_loop

from latlab.load.workload.arrivals import arrival_times
from latlab.records.arrivals import ArrivalConfig
from latlab.records.lengths import LengthDistribution
from latlab.records.simulation import Autoscale, Fleet
from latlab.records.workload import WorkloadConfig
from latlab.sim import replica as replica_module
from latlab.sim.fleet import Simulation, simulate
from latlab.sim.results import OK, REJECTED, TOO_LONG
from latlab.sim.stepcost import StepCostModel
from latlab.sim.workload import build


def done_times(result) -> np.ndarray:
    return result.columns.done.copy()


def one_step_at_a_time(monkeypatch) -> None:
    """No decode runs, no admissions: the scheduler makes every step."""
    monkeypatch.setattr(replica_module.SimReplica, "_decode_run", lambda self, now, h: 0)
    monkeypatch.setattr(replica_module, "admits_alone", lambda scheduler, owed: 0)


def test_lazy_steps_give_the_same_times_as_one_step_at_a_time(monkeypatch):
    exact = calibration()
    exact.step.coefficients["decode_groups"] = 0.0  # runs keep their first step's groups
    fast = simulate(open_loop(6.0, 400), exact)
    grouped = simulate(open_loop(6.0, 400), calibration())
    assert fast.decode_run_steps > fast.steps / 2
    one_step_at_a_time(monkeypatch)
    slow = simulate(open_loop(6.0, 400), exact)
    assert slow.decode_run_steps == 0 and slow.steps == fast.steps
    np.testing.assert_allclose(done_times(fast), done_times(slow), rtol=0, atol=1e-9)
    step_by_step = simulate(open_loop(6.0, 400), calibration())
    e2e = [r.columns.done - r.columns.sent for r in (grouped, step_by_step)]
    assert np.median(np.abs(e2e[0] / e2e[1] - 1)) < 0.002  # the groups drift a little
    f1, l1 = fast.first_last_token()
    f2, l2 = slow.first_last_token()
    np.testing.assert_allclose(f1, f2, atol=1e-9)
    np.testing.assert_allclose(l1, l2, atol=1e-9)
    for i in (0, 57, 399):  # every token stamp, rebuilt from the step segments
        assert fast.timeline(i).token_ns == slow.timeline(i).token_ns


def test_a_short_kv_pool_preempts_and_still_matches_single_steps(monkeypatch):
    cal = calibration(num_kv_blocks=60, block_size=8, max_model_len=256)
    cal.step.coefficients["decode_groups"] = 0.0  # runs keep their first step's groups
    fast = simulate(open_loop(20.0, 300), cal)
    assert fast.preemptions > 0
    one_step_at_a_time(monkeypatch)
    slow = simulate(open_loop(20.0, 300), cal)
    assert slow.preemptions == fast.preemptions
    np.testing.assert_allclose(done_times(fast), done_times(slow), atol=1e-9)
    preempted = [i for i in range(len(fast)) if i in fast.columns.runs]
    assert preempted and all(len(fast.token_steps(i)) > 1 for i in preempted)
    r = fast.timeline(preempted[0])
    assert len(r.token_ns) == r.completion_tokens  # every token once, across its runs


def test_round_robin_spreads_evenly_and_least_outstanding_balances():
    rr = simulate(open_loop(30.0, 600), calibration(), Fleet(replicas=3, router="round_robin"))
    assert np.bincount(rr.columns.replica).tolist() == [200, 200, 200]
    lo = simulate(open_loop(30.0, 600), calibration(), Fleet(replicas=3))
    counts = np.bincount(lo.columns.replica)
    assert len(counts) == 3 and counts.min() > 150


def test_prefix_affinity_keeps_shared_prefixes_together_within_a_bound():
    shared = WorkloadConfig(prompt_tokens=LengthDistribution(kind="fixed", a=32),
                            output_tokens=LengthDistribution(kind="fixed", a=8),
                            prefix_tokens=64, prefix_fraction=0.5)
    light = simulate(open_loop(2.0, 300, shared), calibration(),
                     Fleet(replicas=4, router="prefix_affinity"))
    c = light.columns
    with_prefix = c.prompt == 96
    homes = np.bincount(c.replica[with_prefix], minlength=4)
    assert homes.max() >= 0.95 * with_prefix.sum()  # light load: (almost) all at its home
    heavy = simulate(open_loop(200.0, 600, shared), calibration(),
                     Fleet(replicas=4, router="prefix_affinity"))
    homes = np.bincount(heavy.columns.replica[heavy.columns.prompt == 96], minlength=4)
    assert (homes > 0).sum() > 1  # overloaded home: the bound sends some elsewhere


def test_admission_control_turns_away_what_the_queue_cannot_hold():
    result = simulate(open_loop(400.0, 800), calibration(max_num_seqs=4, max_waiting=8))
    c = result.columns
    assert (c.outcome == REJECTED).sum() > 100 and (c.outcome == OK).sum() > 20
    rejected = np.flatnonzero(c.outcome == REJECTED)[0]
    r = result.timeline(rejected)
    assert r.status == 429 and r.first_token_ns is None and r.done_ns > r.sent_ns
    generous = simulate(open_loop(400.0, 800), calibration(max_num_seqs=4, max_waiting=1000))
    assert (generous.columns.outcome == OK).all()


def test_a_chunk_that_leaves_one_prompt_token_is_not_a_decode():
    """96 of 97 prompt tokens in the first step: the last one looks like a decode (one
    token left) but is the prefill's end, where the first token comes from."""
    result = simulate(fixed([0.0, 1.0], [97, 20], [6, 30]),
                      calibration(max_num_batched_tokens=96, max_num_seqs=8))
    c = result.columns
    first, last = result.first_last_token()
    assert (c.first_step >= 0).all() and (first < last).all() and (last < c.done).all()
    r = result.timeline(0)
    assert len(r.token_ns) == 6 and r.first_token_ns == r.token_ns[0]


def test_a_prompt_longer_than_the_context_is_a_400():
    result = simulate(fixed([0.0, 0.1], [100, 300], [5, 5]), calibration(max_model_len=256))
    assert result.columns.outcome.tolist() == [OK, TOO_LONG]
    assert result.timeline(1).status == 400


def test_closed_loop_users_never_exceed_their_number():
    workload = build(WorkloadConfig(), ArrivalConfig(process="closed", users=3), 120, None)
    result = simulate(workload, calibration())
    c = result.columns
    assert len(result) == 120 and (c.outcome == OK).all()
    events = sorted([(t, 1) for t in c.sent] + [(t, -1) for t in c.done])
    assert max(np.cumsum([d for _, d in events])) == 3
    later = np.sort(c.sent)[3:]
    assert np.isin(np.round(later, 9), np.round(c.done, 9)).all()  # each sent as one ends


def test_max_concurrency_holds_requests_at_the_client():
    workload = open_loop(100.0, 200, max_concurrency=2)
    result = simulate(workload, calibration())
    c = result.columns
    events = sorted([(t, 1) for t in c.sent] + [(t, -1) for t in c.done])
    assert max(np.cumsum([d for _, d in events])) == 2
    assert (c.sent - c.scheduled).max() > 0.1  # lateness: waiting for a slot


def test_the_autoscaler_adds_replicas_after_lag_and_cold_start_and_drains_later():
    policy = Autoscale(metric="concurrency", target=2, min_replicas=1, max_replicas=6,
                       interval_s=1.0, lag_s=2.0, cold_start_s=3.0, scale_down_after_s=5.0)
    rng = np.random.default_rng(2)
    spike = np.cumsum(rng.exponential(1 / 40, 400))  # 10 s at 40 req/s, then 30 s at 2 req/s
    arrival = np.concatenate([spike, spike[-1] + np.cumsum(rng.exponential(1 / 2, 60))])
    burst = fixed(arrival, rng.integers(16, 200, 460), rng.integers(2, 40, 460))
    sim = Simulation(burst, calibration(), Fleet(replicas=1, autoscale=policy))
    result = sim.run()
    f = result.fleet
    assert f.scale_ups > 0 and f.peak_replicas > 1 and f.peak_replicas <= 6
    first_up = next(t for t, n in f.timeline if n > 1)
    assert first_up >= 1.0 + 2.0 + 3.0  # first decision at 1 s, then lag and cold start
    assert f.scale_downs > 0  # the quiet 30 s at the end
    assert f.timeline[-1][1] < f.peak_replicas
    assert set(np.unique(result.columns.replica)) == set(range(len(result.replicas)))
    assert f.replica_seconds > result.columns.done.max()


def test_workload_lengths_follow_the_distributions_and_arrivals_are_benchs():
    config = WorkloadConfig()
    arrivals = ArrivalConfig(process="poisson", rate=7.0, seed=3)
    w = build(config, arrivals, 20_000, None)
    gen = arrival_times(arrivals)
    assert w.arrival[:50].tolist() == [next(gen) for _ in range(50)]
    assert w.lengths.prompt.mean() == pytest.approx(256, rel=0.03)
    assert w.lengths.prompt.std() == pytest.approx(128, rel=0.08)
    rng = np.random.default_rng(0)
    one_by_one = [config.output_tokens.sample(rng) for _ in range(20_000)]
    assert w.lengths.output.mean() == pytest.approx(np.mean(one_by_one), rel=0.03)
    timed = build(config, arrivals, None, 10.0)
    assert timed.arrival.max() < 10.0 and len(timed.arrival) == pytest.approx(70, rel=0.4)


def test_the_simulator_needs_no_torch():
    code = ("import sys\nimport latlab.sim.fleet, latlab.sim.folder, latlab.sim.calibration\n"
            "import latlab.sim.calibrate_run, latlab.sim.validate\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_run_whose_tokens_came_in_one_chunk_calibrates_without_those_decodes():
    from timelines import timeline

    from latlab.records.calibration import RequestCosts
    from latlab.records.engine import EngineShape
    from latlab.sim.calibrate_run import rows

    records = [timeline(i, 1000.0 * i, tokens=12, itl=4.0) for i in range(8)]
    burst = [timeline(8 + i, 9000.0 + 1000 * i, tokens=12, itl=0.0) for i in range(3)]
    x, ms, _, decodes, prefills = rows(records + burst, RequestCosts(), EngineShape())
    assert decodes == 8 and prefills == 11
    assert np.isfinite(x).all() and (ms > 0).all()


def test_prompt_tokens_the_server_found_in_its_cache_are_not_prefilled():
    from timelines import timeline

    from latlab.records.calibration import RequestCosts
    from latlab.records.engine import EngineShape
    from latlab.sim.calibrate_run import rows

    records = [timeline(i, 1000.0 * i, tokens=12, itl=4.0, prompt=200) for i in range(8)]
    for r in records[4:]:
        r.cached_tokens = 150
    x, _, _, decodes, prefills = rows(records, RequestCosts(), EngineShape())
    assert prefills == 8 and list(x[decodes:, 1]) == [200] * 4 + [50] * 4  # tokens computed


def test_predicted_records_carry_the_prompt_tokens_their_prefix_cache_served():
    shared = WorkloadConfig(prompt_tokens=LengthDistribution(kind="fixed", a=32),
                            output_tokens=LengthDistribution(kind="fixed", a=8),
                            prefix_tokens=64, prefix_fraction=0.5)
    work = open_loop(2.0, 200, shared)
    cached = simulate(work, calibration(enable_prefix_caching=True, block_size=16))
    c = cached.columns
    with_prefix, ok = c.prompt == 96, c.outcome == OK
    assert (c.cached[with_prefix & ok] == 64).mean() > 0.9  # the 4 shared blocks, after the first
    assert (c.cached[~with_prefix & ok] == 0).all()
    assert cached.timeline(int(np.flatnonzero(with_prefix & ok)[-1])).cached_tokens == 64
    plain = simulate(work, calibration(block_size=16))
    assert (plain.columns.cached[plain.columns.outcome == OK] == 0).all()


def test_fitted_to_served_steps_the_cost_is_the_servers():
    """Steps a server ran 1.3 times slower than timed in process, plus 0.5 ms each (noise of
    ±2 %): the calibration fitted to them charges what they took."""
    from latlab.records.steps import StepRecord
    from latlab.sim.calibration import as_served

    cal = calibration()
    model = StepCostModel(cal.step)
    rng = np.random.default_rng(0)
    steps, t = [], 0
    for _ in range(400):
        decodes, prefill = int(rng.integers(0, 32)), int(rng.choice([0, 0, 0, 64, 256]))
        f = [decodes + prefill, decodes, int(prefill > 0), decodes + int(prefill > 0),
             min(decodes, 3), decodes * int(rng.integers(16, 600)), prefill * prefill]
        if not f[0]:
            continue
        ms = (1.3 * model.seconds(*f) * 1e3 + 0.5) * rng.uniform(0.98, 1.02)
        steps.append(StepRecord(start_ns=t, end_ns=t + int(ms * 1e6), **dict(zip(
            ("tokens", "decodes", "prefills", "sampled", "decode_groups", "decode_context",
             "prefill_attention"), f))))
        t += int(ms * 1e6) + 1000
    served = StepCostModel(as_served(cal, steps).step)
    errors = [abs(served.seconds(*s.features()) * 1e3 / s.ms - 1) for s in steps]
    assert np.mean(errors) < 0.02
    assert "steps served" in as_served(cal, steps).notes[-1]
