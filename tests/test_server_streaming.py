"""The SSE side of a streamed response: what a step's wakeup finds queued goes out in one
write, one event per step as before, and an error after text still sends the text first."""

from __future__ import annotations

import asyncio

import orjson

from latlab.engine.outputs import EngineStats, RequestOutput
from latlab.engine.sequence import FinishReason, StageTimes
from latlab.server.async_engine import RequestFailed, RequestStream
from latlab.server.schemas import CompletionRequest
from latlab.server.streaming import StreamEvents
from latlab.server.telemetry import Telemetry

STATS = EngineStats(num_running=0, num_waiting=0, num_free_blocks=1, num_blocks=1,
                    kv_usage=0.0, num_preemptions=0, num_steps=0)


class NoEngine:
    def _abort(self, request_id: str) -> None:
        raise AssertionError("a finished stream is never aborted")


def output(i: int, text: str, finished: bool = False) -> RequestOutput:
    return RequestOutput("0", text, 3, 0, i, 1_000_000 * i,
                         FinishReason.LENGTH if finished else None, StageTimes(0, 0))


def writes(groups: list[list[RequestOutput | Exception]]) -> list[bytes]:
    """The body writes of a stream that finds `groups[0]` queued when it starts and each
    next group queued at once after a write (as a step's event queues a step's outputs)."""
    async def run() -> list[bytes]:
        stream = RequestStream(NoEngine(), "0")
        body = CompletionRequest(prompt="hi", stream=True)
        events = StreamEvents("completion", "cmpl-1", "m", body, stream,
                              Telemetry(lambda: STATS), 3)
        waiting = list(groups)
        out = []
        for item in waiting.pop(0):
            stream._put(item)
        async for chunk in events.sse():
            out.append(chunk)
            for item in waiting.pop(0) if waiting else []:
                stream._put(item)
        return out

    return asyncio.run(asyncio.wait_for(run(), 10))


def texts(chunk: bytes) -> list[str]:
    return [orjson.loads(line[6:])["choices"][0]["text"] for line in chunk.split(b"\n\n")
            if line.startswith(b"data: {") and b'"choices":[]' not in line]


def test_outputs_queued_together_go_out_in_one_write_one_event_each():
    a, b, empty, c, d = (output(1, "a"), output(2, "b"), output(3, ""), output(4, "c"),
                         output(5, "d", finished=True))
    together = writes([[a, b, empty], [c], [d]])
    assert [texts(chunk) for chunk in together] == [["a", "b"], ["c"], ["d"], []]
    assert together[-1] == b"data: [DONE]\n\n"
    apart = writes([[a], [b], [empty, c], [d]])
    assert [texts(chunk) for chunk in apart] == [["a"], ["b"], ["c"], ["d"], []]


def test_an_error_queued_after_text_sends_the_text_then_the_error():
    chunks = writes([[output(1, "a"), RequestFailed("boom")]])
    assert texts(chunks[0]) == ["a"]
    assert b"the engine failed this request: boom" in chunks[1]
    assert chunks[-1] == b"data: [DONE]\n\n"
