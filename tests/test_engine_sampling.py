"""Sampling options and incremental detokenization."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from latlab.engine.detokenizer import Detokenizer
from latlab.engine.engine import LLMEngine
from latlab.engine.sampling import Sampler, inverse_cdf
from latlab.engine.sampling_params import SamplingParams
from latlab.engine.sequence import FinishReason, Sequence, StageTimes
from latlab.records.engine import EngineConfig
from latlab.tokenizer import Tokenizer

PROMPT = Tokenizer.default().encode("def fibonacci(n):\n    return")


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    return LLMEngine(EngineConfig(model="tiny", max_model_len=128, block_size=8,
                                  num_kv_blocks=64, max_num_seqs=4, max_num_batched_tokens=64))


def one(engine: LLMEngine, **params: object) -> Sequence:
    return engine.generate([PROMPT], SamplingParams(**params))[0]


def test_seeded_sampling_is_reproducible_whatever_shares_the_batch(engine):
    alone = one(engine, max_tokens=20, seed=7, ignore_eos=True).output_token_ids
    crowd = engine.generate([PROMPT, PROMPT[:3], PROMPT],
                            SamplingParams(max_tokens=20, seed=7, ignore_eos=True))
    assert crowd[0].output_token_ids == alone == crowd[2].output_token_ids
    other = one(engine, max_tokens=20, seed=8, ignore_eos=True).output_token_ids
    assert other != alone


def test_top_k_1_and_a_tiny_top_p_are_greedy(engine):
    greedy = one(engine, max_tokens=15, temperature=0.0, ignore_eos=True).output_token_ids
    assert one(engine, max_tokens=15, top_k=1, ignore_eos=True).output_token_ids == greedy
    assert one(engine, max_tokens=15, top_p=1e-6, ignore_eos=True).output_token_ids == greedy
    sampled = one(engine, max_tokens=15, temperature=1.0, seed=1, ignore_eos=True)
    assert sampled.output_token_ids != greedy


def test_top_k_keeps_only_the_k_best():
    sampler = Sampler(seed=0, stop_token_ids=[])
    logits = torch.tensor([[0.0, 5.0, 4.0, 3.0, 2.0]]).repeat(200, 1)
    seqs = [Sequence(str(i), [1], SamplingParams(top_k=2, temperature=2.0), StageTimes(0, 0))
            for i in range(200)]
    drawn = sampler(logits.clone(), seqs)
    assert set(drawn) == {1, 2}


def test_stop_strings_cut_the_text_and_end_the_request(engine):
    full = one(engine, max_tokens=30, temperature=0.0, ignore_eos=True)
    text = full.detokenizer.text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert stop and text.count(stop) >= 1
    seq = one(engine, max_tokens=30, temperature=0.0, stop=(stop,))
    assert seq.finish_reason is FinishReason.STOP
    assert seq.detokenizer.text == text[: text.index(stop)]
    assert seq.num_output_tokens < full.num_output_tokens


def test_eos_stops_unless_ignored_and_min_tokens_forbids_it(engine):
    greedy = one(engine, max_tokens=12, temperature=0.0, ignore_eos=True).output_token_ids
    fake_eos = greedy[4]
    first = greedy.index(fake_eos)
    saved = engine.stop_token_ids, engine.runner.sampler.stop_token_ids
    engine.stop_token_ids, engine.runner.sampler.stop_token_ids = {fake_eos}, [fake_eos]
    try:
        stopped = one(engine, max_tokens=12, temperature=0.0)
        assert stopped.finish_reason is FinishReason.STOP
        assert stopped.output_token_ids == greedy[: first + 1]
        ignored = one(engine, max_tokens=12, temperature=0.0, ignore_eos=True)
        assert ignored.finish_reason is FinishReason.LENGTH
        assert ignored.output_token_ids == greedy
        held = one(engine, max_tokens=12, temperature=0.0, min_tokens=8)
        assert held.num_output_tokens >= 8
        assert fake_eos not in held.output_token_ids[:8]
    finally:
        engine.stop_token_ids, engine.runner.sampler.stop_token_ids = saved


def streamed(tokenizer: Tokenizer, ids: list[int]) -> list[str]:
    """The text a detokenizer releases after each token, then at the end."""
    detok = Detokenizer(tokenizer)
    pieces = []
    for token in ids:
        detok.push(token)
        pieces.append(detok.release())
    return [*pieces, detok.release(final=True)]


def test_streamed_text_is_the_decoded_text():
    tokenizer = Tokenizer.default()
    text = "naïve café — 日本語 ok\n\tdone"
    ids = tokenizer.encode(text)
    pieces = streamed(tokenizer, ids)
    assert "".join(pieces) == tokenizer.decode(ids) == text
    assert "" in pieces  # multi-byte characters are held until complete


@pytest.mark.parametrize("seed", range(3))
def test_any_token_sequence_streams_the_decoded_text(seed):
    """Random ids (what random weights sample): lone bytes, specials, broken characters."""
    tokenizer = Tokenizer.default()
    ids = np.random.default_rng(seed).integers(0, tokenizer.vocab_size, 400).tolist()
    assert "".join(streamed(tokenizer, ids)) == tokenizer.decode(ids)


def test_a_first_token_is_released_in_its_own_step_unless_it_begins_a_character():
    tokenizer = Tokenizer.default()
    late = []
    for token in range(tokenizer.vocab_size):
        detok = Detokenizer(tokenizer)
        detok.push(token)
        if not detok.release():
            late.append(tokenizer.token_bytes[token])
    # only specials (no text) and the beginnings of a UTF-8 character waiting for the rest
    assert late and all(b == b"" or _incomplete_character(b) for b in late)
    assert len(late) < 100  # continuation bytes (0x80-0xBF) go out at once, as "�"


def _incomplete_character(b: bytes) -> bool:
    try:
        b.decode()
    except UnicodeDecodeError as e:
        return e.reason == "unexpected end of data"
    return False


def test_text_that_may_start_a_stop_string_is_held_back():
    tokenizer = Tokenizer.default()
    detok = Detokenizer(tokenizer, stop=("STOP",))
    released = ""
    for token in tokenizer.encode("abc ST"):
        assert not detok.push(token)
        released += detok.release()
    assert released == "abc "  # only "ST" may begin the stop string
    hit = any(detok.push(t) for t in tokenizer.encode("OP!"))
    assert hit and detok.text == "abc " and detok.release(final=True) == ""


def test_invalid_sampling_params_name_the_field():
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(max_tokens=2, min_tokens=3)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)


def test_greedy_and_sampled_requests_share_a_batch(engine):
    greedy = one(engine, max_tokens=10, temperature=0.0, ignore_eos=True).output_token_ids
    seeded = one(engine, max_tokens=10, seed=3, ignore_eos=True).output_token_ids
    a = engine.add_request("mixed-greedy", PROMPT, SamplingParams(max_tokens=10, temperature=0.0,
                                                                  ignore_eos=True))
    b = engine.add_request("mixed-seeded", PROMPT, SamplingParams(max_tokens=10, seed=3,
                                                                  ignore_eos=True))
    c = engine.add_request("mixed-other", PROMPT[:4], SamplingParams(max_tokens=10))
    while engine.has_unfinished():
        engine.step()
    assert a.output_token_ids == greedy and b.output_token_ids == seeded
    assert c.is_finished


def test_the_two_level_inverse_cdf_draws_what_one_running_sum_draws():
    g = torch.Generator().manual_seed(3)
    for columns in (1, 127, 128, 8192, 8200):
        weights = torch.rand(64, columns, generator=g, dtype=torch.float64)
        weights[weights < 0.3] = 0.0  # zero-weight columns are never drawn
        weights[:, 0] += 1e-3  # no row without weight
        uniform = torch.rand(64, 1, generator=g, dtype=torch.float64)
        cdf = weights.cumsum(dim=-1)
        expected = torch.searchsorted(cdf, uniform * cdf[:, -1:], right=True)
        drawn = inverse_cdf(weights, uniform)
        assert torch.equal(drawn, expected.clamp_max(columns - 1)), columns
        assert bool((weights.gather(1, drawn) > 0).all())


def test_sampling_runs_as_many_operations_for_64_rows_as_for_2():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops += 1
            return func(*args, **(kwargs or {}))

    def ops(rows: int, **params: object) -> int:
        sampler = Sampler(seed=0, stop_token_ids=[2])
        seqs = [Sequence(str(i), [1], SamplingParams(max_tokens=9, **params), StageTimes(0, 0))
                for i in range(rows)]
        with Count() as count:
            sampler.sample(torch.randn(rows, 300), seqs)
        return count.ops

    for params in ({"min_tokens": 9, "stop_token_ids": (5, 6)}, {"temperature": 0.0},
                   {"top_p": 0.9, "top_k": 20, "min_tokens": 3}):
        assert ops(64, **params) == ops(2, **params), params
