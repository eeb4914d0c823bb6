"""An observed service's traffic replayed with the prompt lengths its server saw: a chat call's
count includes the chat template, which a replay through the chat API must not add again."""

from pathlib import Path

import orjson
import pytest

from latlab.load.workload.requests import Workload
from latlab.load.workload.traces import TraceError
from latlab.records.arrivals import ArrivalConfig
from latlab.records.workload import WorkloadConfig


def replayed(trace: Path, api: str):
    w = Workload(WorkloadConfig(api=api), ArrivalConfig(trace=trace))
    return w, [w.request(i) for i in range(3)]


def test_a_chat_calls_prompt_replays_at_the_length_its_server_counted(tmp_path):
    trace = tmp_path / "trace.jsonl"
    rows = [{"timestamp": 0, "prompt_tokens": 180, "output_tokens": 8, "api": "chat"},
            {"timestamp": 1, "prompt_tokens": 35, "output_tokens": 8, "api": "completions"},
            {"timestamp": 2, "prompt_tokens": 64, "output_tokens": 8}]  # no api: as it says
    trace.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    w, (chat, completion, bare) = replayed(trace, "chat")
    tok = w.tokenizer

    def served(spec) -> int:  # what the server counts: the template around the messages
        return len(tok.encode(tok.apply_chat_template(spec.messages)))

    assert w.chat_template_tokens > 0
    assert abs(served(chat) - 180) <= 1  # not 180 + the template
    assert abs(served(completion) - 35) <= 1  # a completion's prompt, sent as chat
    assert served(bare) == 64 + w.chat_template_tokens
    w, (chat, completion, _) = replayed(trace, "completions")
    assert len(tok.encode(chat.prompt)) == 180  # the whole prompt as the model saw it
    assert len(tok.encode(completion.prompt)) == 35


def test_a_bad_api_in_a_trace_row_is_named(tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"timestamp": 0, "prompt_tokens": 10, "output_tokens": 2, "api": "x"}\n')
    with pytest.raises(TraceError, match="line 1.*api"):
        replayed(trace, "chat")
