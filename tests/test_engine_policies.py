"""Who the scheduler serves first: priorities, tenants, step limits, queue delay."""

from __future__ import annotations

import time

from scheduler_helpers import plan, run, scheduler, seq

from latlab.engine.sequence import FinishReason, SequenceStatus


def test_fcfs_ignores_priority():
    s = scheduler(max_num_seqs=1)
    s.add(seq("low", 2, priority=5))
    s.add(seq("high", 2, priority=-5))
    assert plan(run(s)) == [("low", 2)]


def test_priority_orders_the_queue_lowest_value_first_then_arrival():
    s = scheduler(scheduling_policy="priority", max_num_seqs=3, max_num_batched_tokens=6)
    for name, priority in [("a", 1), ("b", 0), ("c", 1), ("d", -1)]:
        s.add(seq(name, 2, priority=priority))
    assert plan(run(s)) == [("d", 2), ("b", 2), ("a", 2)]
    assert [q.request_id for q in s.waiting] == ["c"]


def test_an_urgent_request_preempts_the_least_urgent_running_one():
    s = scheduler(scheduling_policy="priority", max_num_seqs=2)
    s.add(seq("low-old", 3, priority=5))
    s.add(seq("low-new", 3, priority=5))
    run(s)
    s.add(seq("urgent", 3, priority=0))
    out = run(s)
    assert [q.request_id for q in out.preempted] == ["low-new"]
    assert plan(out) == [("low-old", 1), ("urgent", 3)]
    assert s.waiting.peek().request_id == "low-new"
    s.add(seq("equal", 3, priority=5))               # no more urgent than anyone: waits
    out = run(s)
    assert out.preempted == [] and plan(out) == [("low-old", 1), ("urgent", 1)]


def test_when_the_pool_runs_dry_priority_preempts_the_least_urgent():
    s = scheduler(num_blocks=4, block_size=4, scheduling_policy="priority")
    s.add(seq("low", 8, priority=9))
    s.add(seq("high", 8, priority=1))
    assert plan(run(s)) == [("high", 8), ("low", 8)]
    out = run(s)                                     # both need a third block: one fits
    assert [q.request_id for q in out.preempted] == ["low"] and plan(out) == [("high", 1)]


def test_fair_share_serves_the_light_tenant_before_the_heavy_tenants_backlog():
    s = scheduler(fair_share=True, max_num_seqs=2, max_num_batched_tokens=8)
    for i in range(6):
        s.add(seq(f"heavy{i}", 4, tenant="heavy"))
    run(s)                                            # heavy0, heavy1 run
    s.add(seq("light", 4, tenant="light"))
    s.finish(s.running[0], FinishReason.STOP)
    out = run(s)
    assert ("light", 4) in plan(out)                  # ahead of heavy2..5, who came first


def test_without_fair_share_the_light_tenant_waits_its_turn():
    s = scheduler(max_num_seqs=2, max_num_batched_tokens=8)
    for i in range(6):
        s.add(seq(f"heavy{i}", 4, tenant="heavy"))
    run(s)
    s.add(seq("light", 4, tenant="light"))
    s.finish(s.running[0], FinishReason.STOP)
    assert ("heavy2", 4) in plan(run(s))


def test_fair_share_splits_prefill_work_between_tenants():
    s = scheduler(fair_share=True, max_num_seqs=4, max_num_batched_tokens=8)
    s.add(seq("h0", 40, tenant="heavy"))
    s.add(seq("h1", 40, tenant="heavy"))
    run(s)                                            # h0 takes the whole budget
    s.add(seq("light", 6, tenant="light"))
    assert plan(run(s))[0] == ("light", 6)            # before h0's next chunk


def test_decodes_go_first_and_the_decode_cap_rotates_them():
    s = scheduler(max_num_seqs=4, max_num_batched_tokens=16, max_decode_tokens=2)
    for name in "abc":
        s.add(seq(name, 2))
    run(s)
    s.add(seq("p", 30))
    assert plan(run(s)) == [("a", 1), ("b", 1), ("p", 14)]
    assert plan(run(s)) == [("c", 1), ("a", 1), ("p", 14)]
    assert plan(run(s)) == [("b", 1), ("c", 1), ("p", 2)]


def test_the_prefill_cap_keeps_steps_short():
    s = scheduler(max_prefill_tokens=5)
    s.add(seq("a", 12))
    s.add(seq("b", 3))
    assert plan(run(s)) == [("a", 5)]
    assert plan(run(s)) == [("a", 5)]
    assert plan(run(s)) == [("a", 2), ("b", 3)]
    assert plan(run(s)) == [("a", 1), ("b", 1)]


def test_requests_never_scheduled_expire_after_the_queue_delay():
    s = scheduler(max_num_seqs=1, max_queue_delay=5.0)  # "fresh" stays fresh on a slow machine
    now = time.perf_counter_ns()
    s.add(seq("running", 2, enqueued=now))
    run(s)
    s.add(seq("stale", 2, enqueued=now - 10 * 10**9))
    s.add(seq("fresh", 2, enqueued=now))
    out = run(s)
    assert [q.request_id for q in out.refused] == ["stale"]
    assert out.refused[0].finish_reason is FinishReason.QUEUE_TIMEOUT
    assert out.refused[0].status is SequenceStatus.FINISHED
    assert [q.request_id for q in s.waiting] == ["fresh"]


def test_a_preempted_request_goes_back_before_the_requests_that_came_after_it():
    """FCFS keeps its queue in arrival order (no sort per step): a preempted sequence is put
    back at its arrival's place, and the queue's order is the policy's."""
    from latlab.engine.request_queue import RequestQueue

    q = RequestQueue()
    a, b, c, d = (seq(name, 2) for name in "abcd")
    for s in (a, b, c, d):
        q.add(s)
    q.remove(a)
    q.remove(c)
    q.add(c)  # preempted: back before d, which came after it
    q.add(a)
    assert [s.request_id for s in q.ordered()] == ["a", "b", "c", "d"]
    assert q.peek() is a
    assert q.ordered() == sorted(q, key=q.key)
