"""An observed service's traffic replayed with the prompt lengths its server saw: a chat call's
count includes the chat template, which a replay through the chat API must not add again."""

from pathlib import Path

import orjson
import pytest

from latlab.load.target.launch import embedded_engine
from latlab.load.workload.requests import Workload
from latlab.load.workload.traces import TraceError
from latlab.records.arrivals import ArrivalConfig
from latlab.records.bench import BenchConfig
from latlab.records.observe import TRACE_JSONL, ObserveConfig
from latlab.records.workload import WorkloadConfig
from latlab.services.bench import run_bench
from latlab.services.observe import run_observe

GENAI_SPANS = Path(__file__).parent / "fixtures" / "observe" / "genai_spans.jsonl"
REPLAYED = 12


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


def test_an_observed_services_trace_replays_with_the_prompt_lengths_its_server_saw(tmp_path):
    """The GenAI instrumentation's recorded calls (a RAG app's chat calls to latlab serve),
    observed, then their trace.jsonl replayed with --api chat against latlab serve: the
    server counts each prompt as it counted the observed one."""
    observed = run_observe(ObserveConfig(from_file=GENAI_SPANS, out=tmp_path / "observed"))
    rows = [orjson.loads(line) for line in
            (observed.run.path / TRACE_JSONL).read_bytes().splitlines()][:REPLAYED]
    assert rows and all(row["api"] == "chat" for row in rows)
    with embedded_engine(["--model", "tiny"]) as engine:
        result = run_bench(BenchConfig(
            url=engine.url, out=tmp_path / "replayed", requests=REPLAYED, warmup_s=0,
            cooldown_s=0, workload=WorkloadConfig(api="chat"),
            arrivals=ArrivalConfig(trace=observed.run.path / TRACE_JSONL, trace_speed=20.0)))
    records = sorted(result.run.read_records(), key=lambda r: r.trace.row)
    assert len(records) == REPLAYED and all(r.ok for r in records)
    for row, r in zip(rows, records):
        assert abs(r.prompt_tokens - row["prompt_tokens"]) <= 1  # not the template on top
