"""The simulated replica schedules exactly like the engine: for the same requests arriving at
the same times, and a step cost that is a fixed function of the step, every step runs the
same sequences with the same token counts, and every request finishes at the same time."""

from __future__ import annotations

import numpy as np
import pytest

from latlab.engine.batching import step_features
from latlab.engine.engine import LLMEngine
from latlab.engine.sampling_params import SamplingParams
from latlab.records.arrivals import ArrivalConfig
from latlab.records.calibration import Calibration, FitError, StepCost
from latlab.records.engine import EngineConfig, EngineShape
from latlab.records.simulation import Fleet
from latlab.records.workload import WorkloadConfig
from latlab.sim.fleet import Simulation
from latlab.sim.sequence import new_sequence
from latlab.sim.stepcost import StepCostModel
from latlab.sim.workload import Lengths, SimWorkload

PREFIX = list(range(1, 49))  # the shared prefix the simulator gives a workload of 48 tokens
COST = StepCost(coefficients={"step": 2.0, "tokens": 0.05, "decodes": 0.1, "prefills": 0.5,
                              "sampled": 0.02, "decode_context": 3.0, "prefill_attention": 9.0})


def requests(n: int, seed: int, rate: float, prompt: tuple[int, int], output: tuple[int, int]):
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1 / rate, n))
    return (arrival, rng.integers(*prompt, n, endpoint=True),
            rng.integers(*output, n, endpoint=True))


def labels(n: int, seed: int, prefix: bool, priorities: bool, tenants: bool):
    """Per request: whether it shares the prefix, its priority, its tenant."""
    rng = np.random.default_rng(seed + 1)
    return (rng.random(n) < 0.7 if prefix else np.zeros(n, bool),
            rng.integers(0, 3, n).tolist() if priorities else [0] * n,
            [["a", "b", "b", "b"][k] for k in rng.integers(0, 4, n)] if tenants else [None] * n)


def engine_run(config: EngineConfig, arrival, prompt, output, shared, priority, tenant):
    """The engine's own steps, its thread's loop on a virtual clock: take in what arrived,
    step, advance the clock by the step's cost."""
    engine = LLMEngine(config)
    cost = StepCostModel(COST)
    trace, finished, first, step_cost = [], {}, {}, [0.0]
    schedule = engine.scheduler.schedule

    def spy():
        out = schedule()
        trace.append([(seq.request_id, n) for seq, n in out.scheduled])
        f = step_features(out.scheduled)
        step_cost[0] = cost.seconds(*f)
        return out

    engine.scheduler.schedule = spy
    now, i = 0.0, 0
    while i < len(arrival) or engine.has_unfinished():
        while i < len(arrival) and arrival[i] <= now:
            # The simulator's own token ids: the same prefix-cache hits
            ids = new_sequence(i, int(prompt[i]), 1, PREFIX if shared[i] else None).token_ids
            engine.add_request(str(i), ids, SamplingParams(max_tokens=int(output[i]),
                                                           temperature=0.0, ignore_eos=True),
                               priority=priority[i], tenant=tenant[i])
            i += 1
        if not engine.has_unfinished():
            now = float(arrival[i])
            continue
        outputs = engine.step()
        now += step_cost[0]
        for o in outputs:
            first.setdefault(o.request_id, now)
            if o.finished:
                finished[o.request_id] = now
    return trace, (finished, first), engine.scheduler


def sim_run(config: EngineConfig, num_blocks: int, arrival, prompt, output, shared, priority,
            tenant):
    shape = EngineShape.of(config, num_blocks).model_copy(update={"max_waiting": 10_000})
    calibration = Calibration(engine=shape, step=COST,
                              fit=FitError(samples=1, mape=0, p90=0, max=0))
    n = len(arrival)
    workload = SimWorkload(WorkloadConfig(prefix_tokens=len(PREFIX)),
                           ArrivalConfig(process="poisson", rate=1.0), n, None,
                           arrival=np.asarray(arrival),
                           lengths=Lengths(np.asarray(prompt), np.asarray(output), shared,
                                           tenant, priority))
    sim = Simulation(workload, calibration, Fleet())
    replica = sim.replicas[0]
    replica.trace = []
    result = sim.run()
    done = {str(i): float(result.columns.done[i]) for i in range(n)}
    first = result.first_last_token()[0]
    return replica.trace, (done, {str(i): float(first[i]) for i in range(n)}), result


CASES = {
    "continuous, chunked": dict(options={}, blocks=400, rate=40.0, prompt=(4, 200),
                                output=(1, 60)),
    "KV pool short: preemption": dict(options={}, blocks=40, rate=60.0, prompt=(20, 150),
                                      output=(10, 80)),
    "no chunked prefill": dict(options={"enable_chunked_prefill": False,
                                        "max_num_batched_tokens": 256}, blocks=400, rate=40.0,
                               prompt=(4, 200), output=(1, 40)),
    "static batching": dict(options={"batching": "static"}, blocks=400, rate=30.0,
                            prompt=(4, 120), output=(1, 40)),
    "few sequences, queueing": dict(options={"max_num_seqs": 3, "max_num_batched_tokens": 64},
                                    blocks=200, rate=80.0, prompt=(4, 100), output=(2, 30)),
    "prefix caching": dict(options={"enable_prefix_caching": True}, blocks=120, rate=50.0,
                           prompt=(4, 150), output=(1, 40), prefix=True),
    "priorities, KV pool short": dict(options={"scheduling_policy": "priority"}, blocks=40,
                                      rate=60.0, prompt=(20, 150), output=(10, 80),
                                      priorities=True),
    "fair share, decode and prefill caps": dict(
        options={"fair_share": True, "max_decode_tokens": 5, "max_prefill_tokens": 40},
        blocks=400, rate=60.0, prompt=(4, 150), output=(2, 50), tenants=True),
}


@pytest.mark.parametrize("case", CASES)
def test_the_simulated_schedule_is_the_engines_step_by_step(case):
    c = CASES[case]
    options = {"max_num_seqs": 8, "max_num_batched_tokens": 96, **c["options"]}
    config = EngineConfig(model="tiny", max_model_len=256, block_size=8,
                          num_kv_blocks=c["blocks"], warmup=False, **options)
    arrival, prompt, output = requests(40, 7, c["rate"], c["prompt"], c["output"])
    shared, priority, tenant = labels(40, 7, c.get("prefix", False), c.get("priorities", False),
                                      c.get("tenants", False))
    load = (arrival, prompt + np.where(shared, len(PREFIX), 0), output, shared, priority, tenant)
    trace, finished, scheduler = engine_run(config, *load)
    sim_trace, sim_done, result = sim_run(config, c["blocks"], *load)
    assert len(sim_trace) == len(trace)
    for step, (mine, theirs) in enumerate(zip(sim_trace, trace)):
        assert mine == theirs, f"step {step} differs"
    preemptions = scheduler.num_preemptions
    assert result.preemptions == preemptions
    for theirs, mine in zip(finished, sim_done):  # when each finished, its first token
        assert mine.keys() == theirs.keys()
        for rid, t in theirs.items():
            assert mine[rid] == pytest.approx(t, rel=1e-9, abs=1e-9), rid
    if case in ("KV pool short: preemption", "priorities, KV pool short"):
        assert preemptions > 0
    if case == "prefix caching":
        assert scheduler.block_manager.num_hit_tokens > 0  # the same steps with cache hits
    if case == "continuous, chunked":
        assert result.decode_run_steps > len(trace) / 2  # most steps were taken in runs
