"""`latlab predict --trace`: the simulator driven by a trace's window, its prefix sharing
through the engine's block manager, and prefix-affinity routing against round robin."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
from sim_helpers import calibration

from latlab.records.arrivals import ArrivalConfig
from latlab.records.simulation import Fleet
from latlab.records.workload import WorkloadConfig
from latlab.sim.fleet import simulate
from latlab.sim.results import OK
from latlab.sim.sequence import block_ids
from latlab.sim.workload import build

MOONCAKE = Path(__file__).parent / "fixtures" / "traces" / "mooncake.jsonl"


def test_a_traces_window_drives_the_simulated_clients():
    w = build(WorkloadConfig(), ArrivalConfig(trace=MOONCAKE, trace_speed=2.0,
                                              length_scale=1 / 32), None, 10.0)
    assert w.arrival[0] == 0.0 and w.arrival[-1] < 10.0 and np.all(np.diff(w.arrival) >= 0)
    lengths = w.lengths
    assert lengths.prompt[0] == round(40160 / 32) and lengths.output[0] == 1
    assert lengths.blocks.tokens == 16 and list(lengths.blocks.of(0)[:3]) == [0, 1, 2]
    assert len(build(WorkloadConfig(), ArrivalConfig(trace=MOONCAKE), 5, None).arrival) == 5


def test_block_token_ids_name_their_block():
    ids = block_ids(np.array([7, 9]), 4, 6)
    assert len(ids) == 6 and ids[0] != ids[4] and ids[1:4] == [0, 0, 0]
    assert block_ids(np.array([7, 9]), 4, 6)[:4] == block_ids(np.array([7, 3]), 4, 8)[:4]


def shared_trace(tmp_path, conversations: int = 6, turns: int = 4) -> Path:
    """Conversations whose turns repeat the blocks of the turn before and add two."""
    path = tmp_path / "shared.jsonl"
    rows, t = [], 0
    for turn in range(turns):
        for c in range(conversations):
            blocks = [1000 * c + b for b in range(2 * turn + 2)]
            rows.append({"timestamp": t, "input_length": 512 * len(blocks),
                         "output_length": 64, "hash_ids": blocks})
            t += 250
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def test_equal_blocks_hit_the_simulated_prefix_cache(tmp_path):
    arrivals = ArrivalConfig(trace=shared_trace(tmp_path), length_scale=1 / 32)
    w = build(WorkloadConfig(), arrivals, None, None)
    cached = simulate(w, calibration(enable_prefix_caching=True)).columns
    assert np.all(cached.outcome == OK)
    first, later = cached.cached[:6], cached.cached[6:]
    assert np.all(first == 0)
    # a later turn finds the turn before it: its 2·turn blocks of 16 tokens, in full blocks
    expected = np.repeat(np.arange(1, 4) * 2 * 16, 6)
    assert np.array_equal(later, expected)
    cold = simulate(build(WorkloadConfig(), arrivals, None, None), calibration()).columns
    assert np.all(cold.cached == 0)


def test_prefix_affinity_keeps_a_conversation_on_its_replica(tmp_path):
    arrivals = ArrivalConfig(trace=shared_trace(tmp_path, conversations=6), length_scale=1 / 32)
    shape = calibration(enable_prefix_caching=True)

    def run(router: str):
        w = build(WorkloadConfig(), arrivals, None, None)
        return simulate(w, shape, Fleet(replicas=4, router=router)).columns

    affinity, spread = run("prefix_affinity"), run("round_robin")
    conversation = np.tile(np.arange(6), 4)  # round robin moves them: 6 over 4 replicas
    for c in range(6):
        assert len(set(affinity.replica[conversation == c])) == 1
    assert affinity.cached.sum() == sum(2 * t * 16 for t in range(1, 4)) * 6
    assert spread.cached.sum() < affinity.cached.sum()  # a turn finds its history elsewhere
