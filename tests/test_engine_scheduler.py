"""Bookkeeping of the KV blocks and of the scheduler, without a model."""

from __future__ import annotations

from scheduler_helpers import plan, run, scheduler, seq

from latlab.engine.block_manager import BlockManager
from latlab.engine.sequence import FinishReason, SequenceStatus


def test_block_manager_allocates_and_frees_whole_blocks():
    bm = BlockManager(num_blocks=10, block_size=4)
    a = seq("a", 9)
    assert bm.blocks_needed(a, 9) == 3
    bm.allocate(a, 9)
    assert len(a.block_table) == 3 and bm.num_free_blocks == 7
    a.num_computed_tokens = 9
    assert bm.blocks_needed(a, 3) == 0 and bm.blocks_needed(a, 4) == 1
    assert not bm.can_allocate(a, 4 * 8)
    bm.free(a)
    assert a.block_table == [] and bm.num_free_blocks == 10 and bm.usage == 0.0
    assert all(b.ref_count == 0 for b in bm.blocks)


def test_budget_running_first_then_waiting_fcfs_with_chunks():
    s = scheduler()
    for name, n in [("a", 3), ("b", 20), ("c", 5)]:
        s.add(seq(name, n))
    assert plan(run(s)) == [("a", 3), ("b", 13)]     # b's prompt is cut to fit the budget
    assert plan(run(s)) == [("a", 1), ("b", 7), ("c", 5)]   # a decodes first, b finishes
    assert plan(run(s)) == [("a", 1), ("b", 1), ("c", 1)]
    assert [q.status for q in s.running] == [SequenceStatus.RUNNING] * 3


def test_max_num_seqs_holds_back_the_queue():
    s = scheduler(max_num_seqs=2)
    for i in range(4):
        s.add(seq(f"r{i}", 2))
    assert plan(run(s)) == [("r0", 2), ("r1", 2)]
    s.finish(s.running[0], FinishReason.STOP)
    assert plan(run(s)) == [("r1", 1), ("r2", 2)]


def test_without_chunked_prefill_a_long_prompt_waits_for_a_whole_budget():
    s = scheduler(max_num_batched_tokens=16, enable_chunked_prefill=False, max_model_len=16)
    s.add(seq("a", 4))
    s.add(seq("b", 16))
    assert plan(run(s)) == [("a", 4)]
    assert plan(run(s)) == [("a", 1)]                # 1 + 16 > 16: b must not be cut
    s.finish(s.running[0], FinishReason.STOP)
    assert plan(run(s)) == [("b", 16)]


def test_the_newest_running_sequence_is_preempted_and_recomputed():
    s = scheduler(num_blocks=4, block_size=4)
    old, new = seq("old", 8), seq("new", 8)
    s.add(old)
    s.add(new)
    assert plan(run(s)) == [("old", 8), ("new", 8)]  # 2 blocks each: the pool is full
    out = run(s)                                     # old needs a 3rd block: no room
    assert out.preempted == [new] and plan(out) == [("old", 1)]
    assert new.status is SequenceStatus.WAITING and new.num_computed_tokens == 0
    assert new.block_table == [] and list(s.waiting) == [new]
    assert new.num_tokens == 9                       # its generated token is kept
    s.finish(old, FinishReason.STOP)
    assert plan(run(s)) == [("new", 9)]              # recomputed: prompt and output
    assert s.num_preemptions == 1


def test_a_sequence_alone_preempts_itself_rather_than_crash():
    s = scheduler(num_blocks=2, block_size=4)
    a = seq("a", 8)
    s.add(a)
    run(s)
    out = run(s)
    assert out.preempted == [a] and out.scheduled == []


def test_static_batching_admits_nobody_until_the_batch_is_done():
    s = scheduler(batching="static", max_num_seqs=2)
    s.add(seq("a", 2))
    s.add(seq("b", 2))
    s.add(seq("c", 2))
    assert plan(run(s)) == [("a", 2), ("b", 2)]
    s.finish(s.running[0], FinishReason.STOP)
    assert plan(run(s)) == [("b", 1)]                # c waits although there is room
    s.finish(s.running[0], FinishReason.STOP)
    assert plan(run(s)) == [("c", 2)]


def test_finish_frees_blocks_of_running_and_waiting_sequences():
    s = scheduler(num_blocks=10)
    a, b = seq("a", 5), seq("b", 5)
    s.add(a)
    run(s)
    s.add(b)
    s.finish(b, FinishReason.ABORT)
    s.finish(a, FinishReason.ABORT)
    assert not s.has_unfinished() and s.block_manager.num_free_blocks == 10
    assert a.finish_reason is FinishReason.ABORT and a.is_finished
