"""A trace replayed: its prompts (equal hash ids give equal text, a new salt new text), its
lengths under --length-scale, its sessions' turns in order, what each record keeps; through
the load generator against an in-test server."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from sse_server import DONE, Server, Step, completion, stream, usage_only

from latlab.load.workload.requests import Workload
from latlab.load.workload.traces import TraceError
from latlab.records.arrivals import ArrivalConfig
from latlab.records.bench import BenchConfig
from latlab.records.lengths import LengthDistribution, WorkloadError
from latlab.records.workload import SessionConfig, WorkloadConfig
from latlab.services.bench import run_bench

MOONCAKE = Path(__file__).parent / "fixtures" / "traces" / "mooncake.jsonl"
SHARING = (42, 49)  # rows 42 and 49 of the fixture share their first 57 blocks


def workload(**kw) -> Workload:
    arrivals = ArrivalConfig(trace=kw.pop("trace", MOONCAKE),
                             length_scale=kw.pop("scale", 1 / 32))
    return Workload(WorkloadConfig(**kw), arrivals)


def test_equal_hash_ids_give_equal_text_and_lengths_follow_the_trace():
    w = workload()
    a, b = (w.request(i) for i in SHARING)
    assert (a.trace.row, a.trace.prompt_tokens, a.trace.output_tokens) == (42, 30575, 8)
    assert (a.prompt_tokens, a.max_tokens) == (round(30575 / 32), 1)  # 8/32 → at least 1
    for spec in (a, b):
        assert len(w.tokenizer.encode(spec.prompt)) == spec.prompt_tokens
    ids_a, ids_b = (w.tokenizer.encode(s.prompt) for s in (a, b))
    shared = 57 * 16  # 57 blocks of 512/32 tokens
    assert ids_a[:shared] == ids_b[:shared] and ids_a[shared] != ids_b[shared]
    fresh = w.request(43)  # its own blocks: nothing in common with row 42 beyond chance
    assert w.tokenizer.encode(fresh.prompt)[:16] != ids_a[:16]


def test_a_run_salt_draws_other_text_for_the_same_blocks():
    plain, same, other = (workload(prompt_salt=s) for s in (None, None, 7))
    one = plain.request(SHARING[0]).prompt
    assert same.request(SHARING[0]).prompt == one
    salted = other.request(SHARING[0]).prompt
    assert salted != one and len(other.tokenizer.encode(salted)) == round(30575 / 32)
    a, b = (other.request(i).prompt for i in SHARING)
    assert a.split()[:57 * 16] == b.split()[:57 * 16]  # shared within the salted run


def test_chat_prompts_and_labels_from_a_latlab_trace(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text('{"timestamp": 0, "prompt_tokens": 40, "output_tokens": 12, '
                    '"session": "u1", "tenant": "gold", "priority": 3}\n'
                    '{"timestamp": 1, "prompt_tokens": 60, "session": "u1"}\n'
                    '{"timestamp": 2}\n')
    w = workload(trace=path, scale=1.0, api="chat",
                 output_tokens=LengthDistribution(kind="fixed", a=5))
    first, second, bare = (w.request(i) for i in range(3))
    assert first.messages[0]["content"] and first.prompt is None
    assert (first.max_tokens, first.tenant, first.priority) == (12, "gold", 3)
    assert (first.session.id, first.session.turn, first.session.turns) == ("u1", 1, 2)
    assert (second.session.turn, second.prompt_tokens, second.max_tokens) == (2, 60, 5)
    assert bare.trace.row == 2 and bare.trace.prompt_tokens is None  # drawn lengths
    assert bare.session is None and bare.prompt_tokens >= 1


def test_synthetic_sessions_do_not_mix_with_a_trace_that_has_lengths():
    with pytest.raises(WorkloadError, match="drop them"):
        workload(sessions=SessionConfig(turns=LengthDistribution(kind="fixed", a=2)))


def test_the_trace_settings_need_a_trace_and_survive_config_json():
    with pytest.raises(ValueError, match="--length-scale shapes a trace replay"):
        ArrivalConfig(rate=1.0, length_scale=0.5)
    a = ArrivalConfig(trace=MOONCAKE, trace_speed=2.0, length_scale=0.1)
    back = ArrivalConfig.model_validate(orjson.loads(orjson.dumps(a.model_dump(mode="json"))))
    assert (back.process, back.trace_speed, back.length_scale) == ("trace", 2.0, 0.1)
    plain = ArrivalConfig(rate=2.0)
    assert ArrivalConfig.model_validate(plain.model_dump(mode="json")).rate == 2.0
    assert ArrivalConfig.under({"trace": "t.jsonl", "trace_speed": 2.0}, {"rate": 1.0}) == {}


def echo() -> list[Step]:
    return [Step(0.005, completion("a", {"prompt_tokens": 1, "completion_tokens": 1})),
            Step(0.005, completion("b", {"prompt_tokens": 1, "completion_tokens": 2})),
            Step(0, usage_only(1, 2)), Step(0, DONE)]


def test_a_mooncake_slice_replays_its_times_lengths_and_sharing(tmp_path):
    with Server(stream(echo())) as server:
        result = run_bench(BenchConfig(
            url=server.url, out=tmp_path, requests=60, warmup_s=0, cooldown_s=0,
            arrivals=ArrivalConfig(trace=MOONCAKE, trace_speed=20.0, length_scale=1 / 64)))
        received = {int(r["headers"]["X-Request-Id"].rsplit("-", 1)[1]): r["body"]["prompt"]
                    for r in server.received}
    run = result.run
    records = sorted(run.read_records(), key=lambda r: r.index)
    assert [r.trace.row for r in records] == list(range(60))
    t0 = run.read_config().clock.t0_ns
    offsets = [(r.scheduled_ns - t0) / 1e9 for r in records]
    asked = [r.trace.time_s / 20.0 for r in records]
    assert offsets == pytest.approx(asked, abs=1e-6)
    assert [r.prompt_tokens_planned for r in records] == [
        max(1, round(r.trace.prompt_tokens / 64)) for r in records]
    long = [text for text in received.values() if len(text.split()) >= 8]  # a one-word
    assert len(long) > 30 and len(set(long)) == len(long)  # prompt may draw another's word;
    # every longer prompt its own text ...
    a, b = (received[i].split() for i in SHARING)
    assert a[:57 * 8] == b[:57 * 8] and a[57 * 8] != b[57 * 8]  # ... but where blocks are equal
    assert received[15].split()[:5 * 8] == received[58].split()[:5 * 8]  # rows 15, 58: 5 blocks


def test_a_sessions_turns_go_in_order_on_one_worker(tmp_path):
    path = tmp_path / "chat.jsonl"
    lines = []
    for s in range(4):  # 4 sessions of 3 turns, each turn due 10 ms after the last
        for turn in range(3):
            lines.append({"timestamp": s * 0.002 + turn * 0.01, "prompt_tokens": 20 + turn,
                          "output_tokens": 2, "session": f"s{s}"})
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in lines))
    slow = [Step(0.05, completion("a", {"prompt_tokens": 1, "completion_tokens": 1})),
            Step(0, usage_only(1, 1)), Step(0, DONE)]  # longer than the trace's gaps
    with Server(stream(slow)) as server:
        result = run_bench(BenchConfig(url=server.url, out=tmp_path, workers=2, warmup_s=0,
                                       cooldown_s=0, arrivals=ArrivalConfig(trace=path)))
    records = result.run.read_records()
    assert len(records) == 12 and all(r.ok for r in records)
    for s in range(4):
        turns = sorted((r for r in records if r.session.id == f"s{s}"),
                       key=lambda r: r.session.turn)
        assert [r.session.turn for r in turns] == [1, 2, 3]
        assert all(r.session.turns == 3 for r in turns)
        assert len({r.worker for r in turns}) == 1
        for before, after in zip(turns, turns[1:]):
            assert after.session.after_ns == before.end_ns
            assert after.scheduled_ns >= before.end_ns  # waited for the answer
            assert after.sent_ns >= before.done_ns


def test_a_window_past_the_trace_is_refused_before_the_run(tmp_path):
    from latlab.load import BenchError

    with Server(stream(echo())) as server, pytest.raises(BenchError, match="no request in the"):
        run_bench(BenchConfig(url=server.url, out=tmp_path, arrivals=ArrivalConfig(
            trace=MOONCAKE, trace_start_s=1e6)))
    with pytest.raises(TraceError):
        Workload(WorkloadConfig(), ArrivalConfig(trace=tmp_path / "none.jsonl"))


def test_the_context_check_reads_no_further_than_the_window():
    w = workload(context_tokens=1000)  # 209 requests: fewer than the 1,000 checked
    over, longest, checked = w.prompts_too_long(1000)
    assert checked == 209 and longest == round(82831 / 32) and over == sum(
        1 for i in range(209) if w.request(i).prompt_tokens + 2 > 1000)
