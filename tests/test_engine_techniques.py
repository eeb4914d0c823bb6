"""The latency techniques change how the engine computes, never what it computes."""

from __future__ import annotations

import pytest
import torch

from latlab.engine.block_manager import BlockManager
from latlab.engine.engine import LLMEngine
from latlab.engine.loader import load_model, save_checkpoint
from latlab.engine.quantization import Int8Linear
from latlab.engine.sampling_params import SamplingParams
from latlab.engine.sequence import FinishReason, Sequence, StageTimes
from latlab.engine.spec_decode import NgramProposer
from latlab.records.engine import ConfigError, EngineConfig

GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
BASE = dict(model="tiny", max_model_len=128, block_size=4, num_kv_blocks=128, max_num_seqs=6,
            max_num_batched_tokens=32)


def prompts(lengths: list[int], seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 8192, (n,), generator=g).tolist() for n in lengths]


def engine(**options: object) -> LLMEngine:
    return LLMEngine(EngineConfig(**{**BASE, **options}))


SYSTEM = prompts([37], seed=7)[0]      # 9 full blocks of 4 and one token
BATCH = [SYSTEM + p for p in prompts([5, 20, 3, 11, 1])] + prompts([9, 30], seed=2)


@pytest.fixture(scope="module")
def reference() -> list[list[int]]:
    return [s.output_token_ids for s in engine().generate(BATCH, GREEDY)]


def assert_no_leaks(e: LLMEngine) -> None:
    bm = e.block_manager
    assert not e.has_unfinished() and not e.sequences
    assert bm.num_free_blocks == bm.num_blocks
    assert all(b.ref_count == 0 for b in bm.blocks)


@pytest.mark.parametrize("options", [
    {},
    {"num_kv_blocks": 40},                      # preemptions: recomputed from the cache
    {"speculative_method": "ngram"},
])
def test_prefix_caching_keeps_greedy_output_and_counts_cached_tokens(reference, options):
    e = engine(enable_prefix_caching=True, **options)
    first = e.generate(BATCH, GREEDY)
    assert [s.output_token_ids for s in first] == reference
    again = e.generate(BATCH, GREEDY)
    assert [s.output_token_ids for s in again] == reference
    if "num_kv_blocks" not in options:
        # The second time every prompt finds its full blocks but the one holding its last token.
        assert [s.num_cached_tokens for s in again] == [(len(p) - 1) // 4 * 4 for p in BATCH]
        stats = e.stats()
        assert stats.prefix_cache_hits == sum(s.num_cached_tokens for s in first + again)
        assert stats.prefix_cache_queries == 2 * sum(map(len, BATCH))
    else:
        assert e.stats().num_preemptions > 0
    assert_no_leaks(e)


def test_the_shared_system_prompt_is_computed_once():
    e = engine(enable_prefix_caching=True)
    head = e.generate([BATCH[0]], GREEDY)[0]
    assert head.num_cached_tokens == 0
    rest = e.generate(BATCH[1:5], GREEDY)
    assert [s.num_cached_tokens for s in rest] == [36] * 4   # SYSTEM's 9 full blocks
    assert_no_leaks(e)


def test_free_cached_blocks_are_evicted_least_recently_used_first():
    bm = BlockManager(num_blocks=6, block_size=2, enable_caching=True)

    def run(tokens: list[int]) -> Sequence:
        """Prefill `tokens` as the engine does, and finish."""
        seq = Sequence(str(tokens), list(tokens), GREEDY, StageTimes(0, 0))
        bm.take_cached_prefix(seq)
        bm.allocate(seq, seq.num_uncomputed_tokens)
        before, seq.num_computed_tokens = seq.num_computed_tokens, seq.num_tokens
        bm.cache_full_blocks(seq, before)
        bm.free(seq)
        return seq

    a, b, c = [1, 2, 3, 4, 5], [6, 7, 8, 9, 10], [11, 12, 13, 14, 15]
    run(a)
    run(b)                                      # two full blocks each, cached once free
    assert run(a).num_cached_tokens == 4        # a is now the more recently used
    assert bm.num_evictions == 0
    run(c)                                      # 3 fresh blocks: b's tail, then b's cached
    assert bm.num_evictions == 2
    assert run(a).num_cached_tokens == 4        # a's blocks were newer: kept
    assert run(b).num_cached_tokens == 0
    assert bm.num_free_blocks == 6 and all(blk.ref_count == 0 for blk in bm.blocks)


def test_aborting_a_request_that_shares_blocks_frees_only_its_own():
    e = engine(enable_prefix_caching=True)
    e.generate([BATCH[0]], GREEDY)
    e.add_request("x", BATCH[1], GREEDY)
    e.add_request("y", BATCH[2], GREEDY)
    e.step()
    shared = e.sequences["x"].block_table[0]
    assert e.block_manager.blocks[shared].ref_count == 2
    e.abort("x")
    assert e.block_manager.blocks[shared].ref_count == 1
    while e.has_unfinished():
        e.step()
    assert_no_leaks(e)


@pytest.mark.parametrize("options", [
    {"speculative_method": "ngram", "num_speculative_tokens": 3},
    {"speculative_method": "ngram", "num_kv_blocks": 40},   # with preemption
    {"speculative_method": "draft", "speculative_model": "tiny"},  # the same model: all accepted
])
def test_speculative_decoding_gives_plain_greedy_output(reference, options):
    e = engine(**options)
    seqs = e.generate(BATCH, GREEDY)
    assert [s.output_token_ids for s in seqs] == reference
    stats = e.stats()
    assert 0 < stats.num_accepted_tokens <= stats.num_draft_tokens
    assert sum(s.num_draft_tokens for s in seqs) == stats.num_draft_tokens
    if options.get("speculative_model"):
        assert stats.num_accepted_tokens == stats.num_draft_tokens
    # Several tokens came out of one step: they share a timestamp.
    assert any(len(set(s.token_times)) < len(s.token_times) for s in seqs)
    assert_no_leaks(e)


def test_a_draft_model_that_disagrees_is_rolled_back(reference, tmp_path):
    other = save_checkpoint(load_model("tiny", torch.float32, seed=99), tmp_path / "draft")
    e = engine(speculative_method="draft", speculative_model=str(other),
               num_speculative_tokens=5)
    seqs = e.generate(BATCH, GREEDY)
    assert [s.output_token_ids for s in seqs] == reference
    stats = e.stats()
    assert stats.num_accepted_tokens < stats.num_draft_tokens   # rejections happened
    assert_no_leaks(e)
    assert e.runner.proposer.block_manager.num_free_blocks > 0


def test_speculation_respects_min_tokens_max_tokens_and_sampling():
    e = engine(speculative_method="ngram")
    plain = engine()
    p = [5, 6, 7, 8] * 6
    for params in (SamplingParams(max_tokens=7, temperature=0.0),
                   SamplingParams(max_tokens=9, temperature=0.0, min_tokens=9),
                   SamplingParams(max_tokens=9, temperature=0.0, stop_token_ids=(7,))):
        assert (e.generate([p], params)[0].output_token_ids
                == plain.generate([p], params)[0].output_token_ids)
    sampled = e.generate([p], SamplingParams(max_tokens=5, temperature=1.0, seed=3))[0]
    assert sampled.num_draft_tokens == 0 and sampled.num_output_tokens == 5


def test_ngram_proposer_finds_the_latest_longest_match():
    proposer = NgramProposer(k=3, min_n=1, max_n=3, max_model_len=100)
    seq = engine().add_request("r", [1, 2, 3, 9, 1, 2, 3, 8, 7, 1, 2], GREEDY)
    seq.num_computed_tokens = seq.num_tokens - 1
    seq.status = seq.status.RUNNING
    proposer.propose([seq])
    assert seq.spec_token_ids == [3, 8, 7]      # after the latest "1 2", not the first
    seq.token_ids[-1] = 5                        # "5" never occurred before: no proposal
    proposer._tokens.clear()
    proposer.propose([seq])
    assert seq.spec_token_ids == []


def test_int8_quantization_is_close_to_float32():
    fp32 = load_model("default", torch.float32, seed=0)
    int8 = load_model("default", torch.float32, seed=0, quantization="int8")
    assert isinstance(int8.model.layers[0].mlp.down_proj, Int8Linear)
    assert isinstance(int8.model.lm_head, Int8Linear)
    weight = fp32.model.layers[0].mlp.down_proj.weight
    dequantized = int8.model.layers[0].mlp.down_proj.dequantized()
    assert (dequantized - weight).abs().max() <= weight.abs().max() / 127
    ids = torch.tensor(prompts([40])[0])
    with torch.inference_mode():
        expected = fp32.model.compute_logits(fp32.model(ids, torch.arange(40)))
        actual = int8.model.compute_logits(int8.model(ids, torch.arange(40)))
    error = (actual - expected).abs().max() / expected.abs().max()
    assert error < 0.05
    e = engine(quantization="int8", device="cpu")  # a CPU kernel, run on the CPU anywhere
    assert e.generate([BATCH[0]], GREEDY)[0].num_output_tokens == 24


def test_sleep_unloads_and_the_next_step_reloads_the_same_model(reference):
    e = engine(enable_prefix_caching=True)
    assert e.generate([BATCH[0]], GREEDY)[0].output_token_ids == reference[0]
    e.sleep()
    assert e.is_sleeping and not e.stats().model_loaded
    assert e.block_manager.cached_block_ids == {}
    assert e.generate([BATCH[0]], GREEDY)[0].output_token_ids == reference[0]
    stats = e.stats()
    assert stats.model_loaded and stats.num_model_loads == 1 and stats.last_load_s > 0
    e.add_request("busy", BATCH[1], GREEDY)
    with pytest.raises(RuntimeError, match="in flight"):
        e.sleep()


def test_a_request_waiting_past_max_queue_delay_is_refused():
    e = engine(max_queue_delay=0.001, max_num_seqs=1)
    e.add_request("first", BATCH[0], GREEDY)
    e.step()                                     # first is running: the slot is taken
    e.add_request("late", BATCH[1], GREEDY, enqueued_ns=1)   # enqueued long ago
    outputs = e.step()
    refused = [o for o in outputs if o.request_id == "late"]
    assert refused and refused[0].finish_reason is FinishReason.QUEUE_TIMEOUT
    assert "late" not in e.sequences and e.stats().num_queue_timeouts == 1
    while e.has_unfinished():
        e.step()
    assert_no_leaks(e)


@pytest.mark.parametrize("options, message", [
    ({"scheduling_policy": "lottery"}, "--scheduling-policy must be fcfs or priority"),
    ({"speculative_method": "draft"}, "needs --speculative-model"),
    ({"speculative_method": "medusa"}, "--speculative-method must be ngram or draft"),
    ({"num_speculative_tokens": 0}, "--num-speculative-tokens must be between 1 and 16"),
    ({"quantization": "int4"}, "--quantization must be int8"),
    ({"max_queue_delay": 0}, "--max-queue-delay must be a positive number of seconds"),
    ({"idle_unload": -1}, "--idle-unload must be a positive number of seconds"),
    ({"max_decode_tokens": 0}, "--max-decode-tokens must be at least 1"),
    ({"speculative_method": "ngram", "batching": "static"}, "needs --batching continuous"),
])
def test_bad_technique_settings_are_refused_clearly(options, message):
    with pytest.raises(ConfigError, match=message):
        engine(**options)
