"""Streams that reach the client in bursts (a proxy's buffer): the stall finding says so
instead of advising server settings, and a comparison does not judge the gaps between
tokens, which are the buffer's (synthetic runs; tests/test_gateway_real.py has real nginx)."""

import shutil
from pathlib import Path

import numpy as np
from timelines import timeline, write_run

from latlab.analysis import analyze
from latlab.analysis.ab import Sequential
from latlab.analysis.compare import compare
from latlab.analysis.delivery import bursts
from latlab.records.ab import ABConfig
from latlab.records.folder import RunFolder

KEY = "mean_itl_max"


def buffered(r, every: int = 16):
    """`r` as a buffer of `every` events passes it on: each event at its buffer's last."""
    times = r.token_ns
    r.token_ns = [times[min(len(times) - 1, (i // every + 1) * every - 1)]
                  for i in range(len(times))]
    return r


def run(tmp_path, name: str, through_buffer: bool, seed: int = 0):
    rng = np.random.default_rng(seed)
    records = []
    for i in range(12):
        r = timeline(i, i * 300, tokens=64, itl=30 * rng.uniform(0.9, 1.1),
                     stalls={int(rng.integers(2, 60)): 400.0})
        records.append(buffered(r) if through_buffer else r)
    return analyze(write_run(tmp_path / name, records))


def test_a_buffered_stream_is_named_and_gets_no_server_advice(tmp_path):
    direct, through = run(tmp_path, "d", False), run(tmp_path, "b", True)
    assert bursts(direct) is None
    found = bursts(through)
    assert found is not None and found.share > 0.9
    stalls = next(f for f in through.findings if f.rule == "decode_stalls")
    assert "bursts" in stalls.title and "proxy_buffering off" in stalls.fix
    assert stalls.changes == [] and stalls.metric is None  # no setting, no ab to run
    plain = next(f for f in direct.findings if f.rule == "decode_stalls")
    assert "bursts" not in plain.title


def test_a_comparison_does_not_judge_the_gaps_a_buffer_made(tmp_path):
    a, b = run(tmp_path, "a", False, 1), run(tmp_path, "b", True, 2)
    c = compare(a, b)
    for key in (KEY, "p50_itl", "p50_tpot"):
        change = c.change(key)
        assert change.delta is None and "bursts" in change.why, key
    assert c.change("p50_ttft").delta is not None  # what the user waits for is still timed
    assert any("B: " in line and "bursts" in line for line in c.conditions)


def test_an_ab_deciding_on_the_longest_pause_through_a_buffer_says_why_it_cannot(tmp_path):
    a = [run(tmp_path, f"a{i}", True, i) for i in range(3)]
    b = [run(tmp_path, f"b{i}", True, 10 + i) for i in range(3)]
    config = ABConfig(a="A", b="B", decide_on=(KEY,))
    comparison = Sequential(config, config.most_rounds, config.decide_on).look(a, b)
    assert Sequential.undecided(comparison, (KEY,)) == []  # more rounds would not help
    line = Sequential.look_line(comparison, (KEY,))
    assert "bursts" in line and "decided" not in line


def test_a_recorded_run_through_a_gzipping_nginx_is_in_bursts(tmp_path):
    """tests/fixtures/gateways/nginx-gzip: a real nginx held every stream in gzip's buffers."""
    recorded = Path(__file__).parent / "fixtures" / "gateways" / "nginx-gzip"
    shutil.copytree(recorded, tmp_path / "run")
    a = analyze(RunFolder.open(tmp_path / "run"))
    found = bursts(a)
    assert found is not None and found.share > 0.9 and found.through.startswith("nginx")
    stalls = [f for f in a.findings if f.rule == "decode_stalls"]
    assert stalls and "bursts" in stalls[0].title and not stalls[0].changes


def test_a_server_that_sends_each_answer_at_once_is_not_called_buffered(tmp_path):
    """Every event of a stream in one read, no gateway named: a fast server, not a buffer."""
    records = [timeline(i, i * 300, tokens=8, itl=0.0) for i in range(12)]
    a = analyze(write_run(tmp_path / "fast", records))
    assert bursts(a) is None
    assert not any("bursts" in f.title for f in a.findings)


def test_a_client_that_was_its_own_bottleneck_read_late_and_is_not_called_buffered(tmp_path):
    """Events in bursts with waits between them, no gateway named, the host calm but the
    load generator behind (its own event loop late): its late reads, not a proxy's buffer."""
    records = [buffered(timeline(i, i * 300, tokens=64, itl=30.0)) for i in range(12)]
    calm = analyze(write_run(tmp_path / "calm", records))
    assert bursts(calm) is not None  # the same streams from a client keeping up
    late = analyze(write_run(tmp_path / "late", records, client={
        "workers": 1, "bottleneck": True, "reasons": ["event-loop lag p99 80 ms"]}))
    assert bursts(late) is None


def test_events_merged_now_and_then_are_not_a_buffer(tmp_path):
    """Two events in three sharing a read (a client reading late, a gateway merging some):
    the gaps are still the server's pace, not a buffer's."""
    records = [buffered(timeline(i, i * 300, tokens=64, itl=30.0), every=3) for i in range(12)]
    a = analyze(write_run(tmp_path / "merged", records))
    gaps = a.requests.metrics.chunk_gaps.select(a.ok)
    assert 0.6 < np.mean(gaps <= 0) < 0.7
    assert bursts(a) is None
