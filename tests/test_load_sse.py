"""The SSE parser on raw bytes: framing, timestamps per read, token attribution."""

import pytest
from sse_server import DONE, chat, completion, usage_only

from latlab.load.request.sse import StreamFault, StreamParser
from latlab.records.timeline import Outcome, RequestTimeline


def usage(n: int) -> dict:
    return {"prompt_tokens": 3, "completion_tokens": n}


STREAM = (chat({"role": "assistant", "content": ""}, usage(0)) + chat({"content": "a"}, usage(1))
          + chat({"reasoning_content": "hm"}, usage(3))
          + chat({"tool_calls": [{"id": "x"}]}, usage(4))
          + chat({"content": ""}, usage(4)) + usage_only(3, 4, {"total": 9.5}) + DONE)


def parse(reads: list[bytes], chat_api: bool = True) -> RequestTimeline:
    r = RequestTimeline(id="r", index=0)
    p = StreamParser(r, chat_api)
    for t, data in enumerate(reads, start=1):
        p.feed(data, t)
    p.finish()
    return r


def test_one_read_shares_one_timestamp_and_counts_tokens_by_usage_growth():
    r = parse([STREAM])
    assert r.token_ns == [1, 1, 1] and r.token_counts == [1, 2, 1]
    assert (r.completion_tokens, r.usage_ns, r.done_ns, r.server.total) == (4, 1, 1, 9.5)


@pytest.mark.parametrize("size", [1, 7, 64])
def test_any_split_of_the_bytes_gives_the_same_events(size):
    reads = [STREAM[i:i + size] for i in range(0, len(STREAM), size)]
    r = parse(reads)
    assert r.token_counts == [1, 2, 1] and r.completion_tokens == 4
    # later reads, later times
    assert r.token_ns == sorted(r.token_ns) and len(set(r.token_ns)) == 3


def test_crlf_framing_split_between_reads():
    crlf = (completion("a") + completion("b") + usage_only(3, 2) + DONE).replace(b"\n", b"\r\n")
    reads = [crlf[i:i + 5] for i in range(0, len(crlf), 5)]
    r = parse(reads, chat_api=False)
    assert r.token_counts == [1, 1] and r.completion_tokens == 2


def test_usage_on_the_only_content_event_attributes_all_its_tokens():
    r = parse([completion("all of it", usage(5)) + DONE], chat_api=False)
    assert r.token_counts == [5]


def test_usage_first_seen_late_does_not_inflate_an_event():
    r = parse([completion("a") + completion("b") + completion("c", usage(3)) + DONE],
              chat_api=False)
    assert r.token_counts == [1, 1, 1]


def test_no_done_is_a_broken_stream_with_what_was_left():
    with pytest.raises(StreamFault) as e:
        parse([completion("a") + b'data: {"choices": [{"te'], chat_api=False)
    assert e.value.outcome == Outcome.STREAM_BROKEN and "unparsed" in str(e.value)


REASONING = [chat({"role": "assistant", "content": ""}),
             chat({"reasoning_content": "let me"}), chat({"reasoning": " think"}),
             chat({"content": "The"}), chat({"content": " answer"}),
             usage_only(3, 4) + DONE]


def test_reasoning_and_answer_tokens_are_stamped_apart():
    r = RequestTimeline(id="r", index=0)
    p = StreamParser(r, True, keep_text=True)
    for t, data in enumerate(REASONING, start=1):
        p.feed(data, t * 10)
    p.finish()
    assert r.token_ns == [20, 30, 40, 50] and r.first_token_ns == 20
    assert (r.first_reasoning_ns, r.first_answer_ns) == (20, 40)
    assert "".join(p.text) == "The answer"  # the answer a session carries on, not the thinking
    plain = parse([chat({"content": "a"}), usage_only(3, 1) + DONE])
    assert (plain.first_reasoning_ns, plain.first_answer_ns) == (None, None)  # nothing to split


def test_the_reasoning_summary():
    from latlab.metrics.summary import summarize

    records = []
    for i, (first_r, first_a, done) in enumerate([(10, 60, 100), (20, 120, 220)]):
        r = RequestTimeline(id=str(i), index=i, sent_ns=0, scheduled_ns=0, done_ns=done * 10**6,
                            first_token_ns=first_r * 10**6, last_token_ns=done * 10**6,
                            first_reasoning_ns=first_r * 10**6, first_answer_ns=first_a * 10**6,
                            token_ns=[first_r * 10**6], token_counts=[1])
        records.append(r)
    records.append(RequestTimeline(id="plain", index=2, sent_ns=0, scheduled_ns=0,
                                   done_ns=50 * 10**6, first_token_ns=10**6,
                                   token_ns=[10**6], token_counts=[1]))
    s = summarize(records).reasoning
    assert s.n == 2 and (s.ttfr.min, s.ttfr.max) == (10.0, 20.0)
    assert (s.ttfa.min, s.ttfa.max) == (60.0, 120.0)
    assert (s.thinking.min, s.thinking.max) == (50.0, 100.0)
    assert s.thinking_share == pytest.approx((50 / 100 + 100 / 220) / 2)


def test_cached_prompt_tokens_in_the_names_servers_use():
    from latlab.load.request.sse import apply_usage

    for usage, cached in (({"prompt_tokens_details": {"cached_tokens": 7}}, 7),
                          ({"prompt_cache_hit_tokens": 5, "prompt_cache_miss_tokens": 3}, 5),
                          ({"prompt_tokens_details": None}, None)):
        r = RequestTimeline(id="r", index=0)
        apply_usage(r, {"prompt_tokens": 8, "completion_tokens": 1} | usage)
        assert r.cached_tokens == cached


def test_tokens_without_text_count_where_the_servers_count_grew():
    """llama.cpp's last token can decode to no text: its chunk still says the count grew."""
    def timings(n: int) -> dict:
        return {"predicted_n": n, "prompt_ms": 1.0, "predicted_ms": 2.0 * n}

    r = parse([completion("", timings=timings(0)), completion("a", timings=timings(1)),
               completion("b", timings=timings(2)), completion("", timings=timings(4)),
               usage_only(3, 4) + DONE], chat_api=False)
    assert r.token_ns == [2, 3, 4] and r.token_counts == [1, 1, 2]
    assert sum(r.token_counts) == r.completion_tokens == 4
