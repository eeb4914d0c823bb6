"""What the simulator does beside scheduling: a queue deadline, idle unload, speculative
decoding, sessions and agent loops; the worlds a prediction draws; a simulation's columns."""

from __future__ import annotations

import numpy as np
import pytest
from sim_helpers import STEP, calibration, fixed, open_loop

from latlab.metrics.summary import summarize
from latlab.records.arrivals import ArrivalConfig
from latlab.records.calibration import SizeFactor, Spread
from latlab.records.lengths import LengthDistribution
from latlab.records.simulation import Fleet
from latlab.records.workload import SessionConfig, WorkloadConfig
from latlab.sim.fleet import simulate
from latlab.sim.results import OK, QUEUE_TIMEOUT
from latlab.sim.spread import estimate, level_sd
from latlab.sim.stepcost import StepCostModel
from latlab.sim.table import request_table
from latlab.sim.workload import build
from latlab.sim.world import Draw

FIXED = {"prompt_tokens": LengthDistribution(kind="fixed", a=40),
         "output_tokens": LengthDistribution(kind="fixed", a=12)}


def summaries_agree(result, workload) -> None:
    """The columns' summary is the records' summary, percentile for percentile."""
    columns = summarize(request_table(result, workload.ensure(len(result)), "completions"))
    records = summarize([result.timeline(i) for i in range(len(result))])
    for name, dist in records.latency.items():
        for q, p in dist.percentiles.items():
            assert columns.latency[name].percentiles[q].value == pytest.approx(p.value), name
    assert columns.failures == records.failures
    return columns


def test_the_queue_deadline_refuses_what_waited_too_long_with_a_503():
    overload = open_loop(60.0, 400)
    result = simulate(overload, calibration(max_num_seqs=4), Fleet(max_queue_delay=0.5))
    c = result.columns
    refused = c.outcome == QUEUE_TIMEOUT
    assert refused.sum() > 50 and (c.outcome == OK).sum() > 50
    assert (c.done[refused] - c.engine_in[refused] > 0.5).all()  # refused after the deadline
    ok = c.outcome == OK
    assert (c.first_scheduled[ok] - c.engine_in[ok] <= 0.5 + 0.2).all()  # a step's slack
    assert result.timeline(int(np.flatnonzero(refused)[0])).status == 503
    summary = summaries_agree(result, overload)
    assert summary.failures == {"http_5xx": int(refused.sum())}
    patient = simulate(open_loop(60.0, 400), calibration(max_num_seqs=4, max_waiting=1000))
    assert (patient.columns.outcome == OK).all()


def test_idle_unload_makes_the_request_after_a_long_gap_wait_for_the_model():
    arrival, prompt, output = [0.0, 0.5, 10.0, 10.3], [40] * 4, [12] * 4
    awake = simulate(fixed(arrival, prompt, output), calibration())
    unloads = simulate(fixed(arrival, prompt, output), calibration(),
                       Fleet(idle_unload=5.0, reload_s=2.0))
    wait = unloads.columns.first_scheduled - awake.columns.first_scheduled
    assert unloads.fleet.reloads == 1
    assert wait[:2] == pytest.approx([0.0, 0.0], abs=1e-9)  # loaded at the start
    assert wait[2] == pytest.approx(2.0, abs=1e-9)  # idle 9 s: it loads first
    assert 0 < wait[3] < 2.0  # arrived while the model was loading


@pytest.mark.parametrize("acceptance", [1e-12, 1.0])
def test_speculative_decoding_gives_a_step_the_drafts_accepted_and_one(acceptance):
    work = open_loop(2.0, 60, WorkloadConfig(**FIXED))
    plain = simulate(work, calibration())
    spec = simulate(open_loop(2.0, 60, WorkloadConfig(**FIXED)), calibration(),
                    Fleet(speculative_tokens=3, acceptance=f"fixed:{acceptance:g}"))
    assert (spec.columns.output == plain.columns.output).all()
    r = spec.timeline(7)
    assert sum(r.token_counts) == r.completion_tokens == 12
    if acceptance == 1.0:  # the prefill's token, then 3 drafts and the target's a step
        assert r.token_counts == [1, 4, 4, 3]  # (2 drafts: never past the 12th token)
        assert spec.steps < plain.steps / 2
    else:
        assert r.token_counts == [1] * 12
    summaries_agree(spec, work)


def sessions(kind: str, **given) -> WorkloadConfig:
    if kind == "agent":
        s = SessionConfig(agent_steps="fixed:3", tool_ms="fixed:250")
    else:
        s = SessionConfig(turns="fixed:3", think_s="fixed:2", **given)
    return WorkloadConfig(**FIXED, sessions=s)


def test_a_chat_turn_sends_the_history_after_a_think_time():
    work = build(sessions("chat"), ArrivalConfig(process="poisson", rate=0.5), 30, None)
    result = simulate(work, calibration())
    c = result.columns
    assert len(result) == 30 and set(np.bincount(c.session)) == {3}
    for s in range(10):
        turns = np.flatnonzero(c.session == s)
        assert c.turn[turns].tolist() == [1, 2, 3]
        assert c.prompt[turns].tolist() == [40, 40 + 12 + 40, 40 + 2 * (12 + 40)]
        assert c.scheduled[turns[1:]] == pytest.approx(c.done[turns[:-1]] + 2.0)
        assert c.after[turns[1:]] == pytest.approx(c.done[turns[:-1]])
    summary = summaries_agree(result, work)
    assert summary.sessions.sessions == 10 and summary.sessions.complete == 10
    assert [t.prompt_tokens for t in summary.sessions.per_turn] == [40, 92, 144]


def test_the_prefix_cache_finds_a_sessions_history():
    work = build(sessions("chat"), ArrivalConfig(process="poisson", rate=0.5), 30, None)
    result = simulate(work, calibration(enable_prefix_caching=True, block_size=16))
    c = result.columns
    later = c.turn > 1
    assert (c.cached[later] >= 32).all()  # at least the previous prompt's full blocks
    assert (c.cached[c.turn == 1] == 0).all()


def test_an_agent_calls_again_when_its_tool_step_ends_and_users_run_sessions_in_turn():
    work = build(sessions("agent"), ArrivalConfig(process="closed", users=2), 12, None)
    result = simulate(work, calibration())
    c = result.columns
    assert len(result) == 12 and c.session.max() == 3  # 4 sessions of 3 calls, 2 at a time
    later = c.turn > 1
    assert (c.tool_end[later] - c.tool_start[later]) == pytest.approx(0.25)
    assert c.scheduled[later] == pytest.approx(c.tool_end[later])
    firsts = np.flatnonzero(c.turn == 1)
    ends = {s: c.done[c.session == s].max() for s in range(4)}
    started = sorted(c.scheduled[firsts])
    assert started[2] == pytest.approx(min(ends[0], ends[1]))  # a user's next session
    assert summaries_agree(result, work).sessions.tool_ms > 0


def test_requests_bound_whole_sessions_and_a_history_past_the_context_ends_one():
    bounded = build(sessions("chat"), ArrivalConfig(process="poisson", rate=1.0), 10, None)
    assert len(simulate(bounded, calibration())) == 9  # three sessions of three turns
    long = WorkloadConfig(prompt_tokens=LengthDistribution(kind="fixed", a=100),
                          output_tokens=LengthDistribution(kind="fixed", a=20),
                          sessions=SessionConfig(turns="fixed:5", think_s="fixed:1"))
    work = build(long, ArrivalConfig(process="poisson", rate=0.2), 10, None)
    result = simulate(work, calibration(max_model_len=256))
    assert result.columns.turn.max() == 2  # turn 3 would be 100 + 2 × 120 tokens


def test_a_drawn_world_charges_its_level_and_each_window_its_drift():
    def world(level: float, drift: float) -> Draw:
        return Draw(level=np.log(level), drift=drift, window_s=10.0, request_sd=(0.0, 0.0),
                    rng=np.random.default_rng(0))

    work = fixed([0.0, 30.0], [40, 40], [12, 12])
    plain, slower = simulate(work, calibration()), simulate(work, calibration(),
                                                            draw=world(1.25, 0.0))
    for r in (plain, slower):
        r.busy = r.columns.done - r.columns.engine_in - 0.3e-3 - 0.5e-3  # less post, network
    assert slower.busy == pytest.approx(1.25 * plain.busy, rel=1e-9)
    drifting = world(1.0, 0.3)
    factors = [drifting.speed(t) for t in (1.0, 9.0, 11.0, 35.0)]
    assert factors[0] == factors[1] != factors[2] != factors[3]


def test_the_step_cost_charges_its_factors_by_size_in_steps_and_decode_runs():
    work = fixed([0.0, 30.0], [40, 40], [12, 12])
    slower = calibration()
    slower.step = slower.step.model_copy(update={"by_size": [SizeFactor(ms=1.0, factor=1.25)]})
    plain, scaled = simulate(work, calibration()), simulate(work, slower)
    for r in (plain, scaled):
        r.busy = r.columns.done - r.columns.engine_in - 0.3e-3 - 0.5e-3  # less post, network
    assert scaled.busy == pytest.approx(1.25 * plain.busy, rel=1e-9)
    model = StepCostModel(STEP.model_copy(update={"by_size": [
        SizeFactor(ms=2.0, factor=1.0), SizeFactor(ms=8.0, factor=2.0)]}))
    assert model.factor(0.001) == 1.0 and model.factor(0.016) == 2.0  # the nearest beyond
    assert model.factor(0.004) == pytest.approx(np.sqrt(2.0))  # linear in log ms


def test_the_spread_separates_drift_between_windows_from_the_noise_of_steps():
    rng = np.random.default_rng(3)
    times = np.arange(6000) * 0.05  # 300 s of steps, 20 a second
    level = np.repeat(rng.normal(0, 0.1, 30), 200)  # each 10 s window its own level
    fitted = rng.uniform(5, 50, 6000)
    r = level + rng.normal(0, 0.05, 6000)
    spread, _ = estimate(r, fitted, times, np.zeros(6000))
    assert spread.step == pytest.approx(np.hypot(0.1, 0.05), rel=0.2)
    assert spread.drift == pytest.approx(0.1, rel=0.3) and spread.windows == 30
    steady, factors = estimate(rng.normal(0, 0.05, 6000), fitted, times, np.zeros(6000))
    assert steady.drift < 0.02 and steady.shape < 0.02
    assert all(f.factor == pytest.approx(1.0, abs=0.01) for f in factors)


def test_a_misfit_by_the_size_of_step_is_charged_not_drawn_as_a_level():
    """The big steps took longer than the linear model charged, the same way in every run:
    the factors by size charge it, and the level's uncertainty across step sizes is only
    the factors' own error — not the misfit itself."""
    rng = np.random.default_rng(4)
    times = np.arange(6000) * 0.05
    fitted = rng.uniform(5, 50, 6000)
    off = 0.3 * (np.log(fitted) - np.log(5)) / np.log(10)  # 0 at 5 ms, +0.3 at 50 ms
    spread, factors = estimate(off + rng.normal(0, 0.05, 6000), fitted, times, np.zeros(6000))
    assert spread.shape < 0.01 and spread.shape_dof > 1000
    model = StepCostModel(STEP.model_copy(update={"by_size": factors}))
    for ms in (8.0, 20.0, 40.0):
        expected = np.exp(0.3 * np.log(ms / 5) / np.log(10) + 0.05 ** 2 / 2)  # the mean
        assert model.factor(ms / 1e3) == pytest.approx(expected, rel=0.03), ms
    before = Spread(step=0.1, shape=0.09, drift=0.02, between=0.0, runs=4)
    assert level_sd(spread) < level_sd(before) / 5


def test_a_probe_slow_at_sizes_no_other_run_has_is_a_runs_level_not_a_factor():
    """Two runs share the step sizes 10–50 ms and sit on the fit; a third (lone decodes, all
    at 5 ms) ran 1.5× slower. Slow for their size, or for the moment they were timed? The
    data cannot say, so it is no factor by size but a level between runs, drawn."""
    rng = np.random.default_rng(5)
    fitted = np.r_[rng.uniform(10, 50, 4000), np.full(1000, 5.0)]
    run = np.r_[np.zeros(2000), np.ones(2000), np.full(1000, 2)]
    r = np.r_[rng.normal(0, 0.05, 4000), rng.normal(np.log(1.5), 0.05, 1000)]
    times = np.r_[np.arange(2000), np.arange(2000), np.arange(1000)] * 0.05
    spread, factors = estimate(r, fitted, times, run)
    assert min(f.ms for f in factors) >= 10.0  # no factor of the lone decodes' own
    assert StepCostModel(STEP.model_copy(update={"by_size": factors})).factor(0.005) \
        == pytest.approx(1.0, abs=0.02)
    assert spread.between > 0.15 and spread.runs == 3


def test_misfits_that_tie_or_too_few_samples_a_run_give_a_spread_not_an_error():
    """Timings that tie within each size of step (no noise to weigh the groups by), and
    samples each from a run of its own (no degrees of freedom left for the factors)."""
    fitted = np.linspace(1.0, 100.0, 200)
    tied = np.where(fitted < 50, 0.0, 0.2)
    spread, factors = estimate(tied, fitted, np.arange(200) * 0.1, np.zeros(200))
    assert [round(f.factor, 3) for f in factors] == [1.0] * 5 + [round(np.exp(0.2), 3)] * 5
    assert spread.shape < 1e-3
    lone = np.random.default_rng(6).normal(0, 0.1, 50)
    spread, factors = estimate(lone, fitted[:50], np.arange(50.0), np.arange(50))
    assert factors == [] and spread.shape == 0.0 and spread.runs == 0


def test_the_acceptance_a_speculating_server_showed_is_read_from_its_scrapes(tmp_path):
    import orjson

    scrapes = [{"t_ns": 1, "values": {"spec_draft_tokens": 100, "spec_accepted_tokens": 40}},
               {"t_ns": 2, "values": {"spec_draft_tokens": 1100, "spec_accepted_tokens": 640}}]
    (tmp_path / "metrics.jsonl").write_bytes(b"\n".join(orjson.dumps(s) for s in scrapes))
    assert Fleet(speculative_tokens=4, acceptance=str(tmp_path)).acceptance.a == 0.6
    (tmp_path / "metrics.jsonl").write_bytes(orjson.dumps(scrapes[0]))
    with pytest.raises(ValueError, match="count no speculative drafts"):
        Fleet(speculative_tokens=4, acceptance=str(tmp_path))
