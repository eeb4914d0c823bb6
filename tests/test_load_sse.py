"""The SSE parser on raw bytes: framing, timestamps per read, token attribution."""

import pytest

from latlab.load.sse import StreamFault, StreamParser
from latlab.records.timeline import Outcome, RequestTimeline
from sse_server import DONE, chat, completion, usage_only


def usage(n: int) -> dict:
    return {"prompt_tokens": 3, "completion_tokens": n}


STREAM = (chat({"role": "assistant", "content": ""}, usage(0)) + chat({"content": "a"}, usage(1))
          + chat({"reasoning_content": "hm"}, usage(3)) + chat({"tool_calls": [{"id": "x"}]}, usage(4))
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
    assert r.token_ns == sorted(r.token_ns) and len(set(r.token_ns)) == 3  # later reads, later times


def test_crlf_framing_split_between_reads():
    crlf = (completion("a") + completion("b") + usage_only(3, 2) + DONE).replace(b"\n", b"\r\n")
    reads = [crlf[i:i + 5] for i in range(0, len(crlf), 5)]
    r = parse(reads, chat_api=False)
    assert r.token_counts == [1, 1] and r.completion_tokens == 2


def test_usage_on_the_only_content_event_attributes_all_its_tokens():
    r = parse([completion("all of it", usage(5)) + DONE], chat_api=False)
    assert r.token_counts == [5]


def test_usage_first_seen_late_does_not_inflate_an_event():
    r = parse([completion("a") + completion("b") + completion("c", usage(3)) + DONE], chat_api=False)
    assert r.token_counts == [1, 1, 1]


def test_no_done_is_a_broken_stream_with_what_was_left():
    with pytest.raises(StreamFault) as e:
        parse([completion("a") + b'data: {"choices": [{"te'], chat_api=False)
    assert e.value.outcome == Outcome.STREAM_BROKEN and "unparsed" in str(e.value)
