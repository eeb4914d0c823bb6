"""Sessions end to end against in-test servers on 127.0.0.1: chats whose every turn carries the
history with the model's real answers, think times, agent tasks with a real HTTP tool and
their budget, dataset conversations replayed turn by turn, the request budget, the findings
about turns, and the options' errors."""

import asyncio
import json

import numpy as np
import orjson
import pytest
from aiohttp import web
from sse_server import DONE, Server, chat, usage_only
from typer.testing import CliRunner

from latlab.cli import app
from latlab.load.workload.conversation import Conversation
from latlab.load.workload.datasets import load_dataset
from latlab.load.workload.requests import Workload
from latlab.records.arrivals import ArrivalConfig
from latlab.records.bench import BenchConfig
from latlab.records.lengths import LengthDistribution
from latlab.records.workload import SessionConfig, WorkloadConfig
from latlab.services.bench import run_bench
from latlab.tokenizer import Tokenizer

FIXED = LengthDistribution.parse


def answering(per_message_ms: float = 0.0, cached: bool = False):
    """A chat server that answers every request with "answer-<n>" (n counts the requests it
    got), after a first-token delay of `per_message_ms` per message in the request, and
    reports every prompt token but the last message's as cached when `cached`."""
    count = {"n": 0}

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        count["n"] += 1
        messages = body["messages"]
        prompt = sum(len(str(m["content"]).split()) for m in messages)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await asyncio.sleep(per_message_ms * len(messages) / 1e3)
        await resp.write(chat({"role": "assistant", "content": f" answer-{count['n']}"}))
        await resp.write(chat({"content": " done"}))
        new = len(str(messages[-1]["content"]).split())
        await resp.write(usage_only(prompt, 2, cached=prompt - new if cached else None))
        await resp.write(DONE)
        return resp

    return handle


def session_config(url: str, tmp_path, sessions: SessionConfig, **kw) -> BenchConfig:
    """A chat (or agent) run; a chat's think time 20 ms unless the test sets one (the
    default, about 3 s a turn, is for real runs)."""
    if sessions.kind == "chat" and "think_s" not in sessions.model_fields_set:
        sessions = sessions.model_copy(update={"think_s": FIXED("0.02", "--think-time")})
    workload = WorkloadConfig(api="chat", prompt_tokens=FIXED("8", "p"),
                              output_tokens=FIXED("2", "o"), sessions=sessions,
                              **kw.pop("workload", {}))
    return BenchConfig(url=url, workload=workload, out=tmp_path, **kw)


def test_a_chat_carries_its_history_and_the_models_answers(tmp_path):
    think = FIXED("0.05", "--think-time")
    with Server(answering()) as server:
        result = run_bench(session_config(
            server.url, tmp_path, SessionConfig(turns=FIXED("3", "t"), think_s=think),
            requests=6, duration_s=None, arrivals=ArrivalConfig(users=1)))
        bodies = [r["body"]["messages"] for r in server.received]
    records = sorted(result.run.read_records(), key=lambda r: r.scheduled_ns)
    assert [r.session.turn for r in records] == [1, 2, 3, 1, 2, 3]
    assert len({r.session.id for r in records}) == 2 and all(r.ok for r in records)
    # turn t sends 2t - 1 messages: every earlier question with the answer it really got
    assert [len(b) for b in bodies] == [1, 3, 5, 1, 3, 5]
    assert bodies[2][1] == {"role": "assistant", "content": " answer-1 done"}
    assert bodies[2][3] == {"role": "assistant", "content": " answer-2 done"}
    assert bodies[2][:3] == bodies[1]  # the history is resent as it was
    for r in records:
        if r.session.turn > 1:
            gap = (r.scheduled_ns - r.session.after_ns) / 1e6
            assert gap == pytest.approx(50.0, abs=0.01)  # the think time, exactly scheduled
    s = result.summary.sessions
    assert (s.kind, s.sessions, s.complete) == ("chat", 2, 2)
    assert [t.turn for t in s.per_turn] == [1, 2, 3] and all(t.n == 2 for t in s.per_turn)
    assert s.per_turn[0].prompt_tokens < s.per_turn[2].prompt_tokens
    assert s.think.mean == pytest.approx(50.0, abs=0.01)
    assert s.duration.n == 2 and s.duration.min >= 100.0  # two think times at least
    page = result.run.report_path.read_text()
    assert "<h2>Sessions</h2>" in page and "TTFT turn by turn" in page


def test_requests_bound_whole_sessions_and_the_started_ones_finish(tmp_path):
    with Server(answering()) as server:
        result = run_bench(session_config(
            server.url, tmp_path, SessionConfig(turns=FIXED("3", "t")), requests=7,
            duration_s=None, arrivals=ArrivalConfig(users=2)))
    records = result.run.read_records()
    assert len(records) == 6 and result.summary.sessions.complete == 2
    with Server(answering(per_message_ms=5)) as server:  # open loop: the arrivals end first
        result = run_bench(session_config(
            server.url, tmp_path, SessionConfig(turns=FIXED("3", "t")), requests=6,
            duration_s=None, arrivals=ArrivalConfig(process="constant", rate=100)))
    assert len(result.run.read_records()) == 6 and result.summary.sessions.complete == 2


def test_ttft_that_grows_with_turns_is_found(tmp_path):
    with Server(answering(per_message_ms=40)) as server:
        result = run_bench(session_config(
            server.url, tmp_path, SessionConfig(turns=FIXED("4", "t")), requests=16,
            duration_s=None, arrivals=ArrivalConfig(users=2)))
    turns = result.summary.sessions.per_turn
    assert turns[-1].ttft["p50"] > 3 * turns[0].ttft["p50"]
    finding = next(f for f in result.analysis.findings if f.rule == "ttft_grows_with_turns")
    assert "re-prefilled" in finding.title and "prefix caching" in finding.fix
    with Server(answering(per_message_ms=40, cached=True)) as server:
        cached = run_bench(session_config(
            server.url, tmp_path, SessionConfig(turns=FIXED("4", "t")), requests=16,
            duration_s=None, arrivals=ArrivalConfig(users=2)))
    assert cached.summary.sessions.per_turn[-1].cached_share > 0.5
    finding = next(f for f in cached.analysis.findings if f.rule == "ttft_grows_with_turns")
    assert "cached" in finding.title and str(finding.severity) == "info"


class Tool:
    """A local HTTP tool that takes `delay_ms` and answers with what it was asked, upper-cased."""

    def __init__(self, delay_ms: float) -> None:
        self.delay_ms, self.calls = delay_ms, []

    async def __call__(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(body)
        await asyncio.sleep(self.delay_ms / 1e3)
        return web.Response(text=f"tool says {body['input'].upper()}")


def test_an_agent_task_with_a_real_tool_and_its_budget(tmp_path):
    tool = Tool(40)
    with Server(answering()) as server, Server(tool) as tool_server:
        result = run_bench(session_config(
            server.url, tmp_path, SessionConfig(kind="agent", turns=FIXED("3", "t"),
                                                tool_url=tool_server.url + "/v1/completions"),
            requests=6, duration_s=None, arrivals=ArrivalConfig(users=1)))
        bodies = [r["body"]["messages"] for r in server.received]
    assert [c["step"] for c in tool.calls] == [1, 2, 1, 2]
    assert bodies[1][-1]["content"] == "tool says  ANSWER-1 DONE"  # the tool's output
    records = result.run.read_records()
    later = [r for r in records if r.session.turn > 1]
    assert all((r.session.tool_end_ns - r.session.tool_start_ns) / 1e6 >= 40 for r in later)
    assert all(r.session.after_ns <= r.session.tool_start_ns <= r.session.tool_end_ns
               <= r.scheduled_ns for r in later)
    tasks = result.analysis.tasks
    assert tasks.n == 2 and [s.step for s in tasks.steps] == [1, 2, 3]
    assert tasks.tool >= 80  # two tool steps of ≥ 40 ms each
    assert tasks.model_total + tasks.tool + tasks.orchestration == pytest.approx(tasks.total)
    s = result.summary.sessions
    assert s.kind == "agent" and s.tool_ms == pytest.approx(tasks.tool)
    assert s.duration.mean == pytest.approx(tasks.total)
    assert any(f.rule == "tool_time" for f in result.analysis.findings)
    assert "An agent task, step by step" in result.run.report_path.read_text()


def test_a_tool_that_fails_is_recorded_and_the_task_goes_on(tmp_path):
    with Server(answering()) as server:
        result = run_bench(session_config(
            server.url, tmp_path, SessionConfig(kind="agent", turns=FIXED("2", "t"),
                                                tool_url=server.url + "/nowhere"),
            requests=2, duration_s=None, arrivals=ArrivalConfig(users=1)))
    second = next(r for r in result.run.read_records() if r.session.turn == 2)
    assert second.ok and second.session.tool_error.startswith("HTTP 404")


SHAREGPT = [{"conversations": [{"from": "human", "value": "first question"},
                               {"from": "gpt", "value": "one two three"},
                               {"from": "human", "value": "second question"},
                               {"from": "gpt", "value": "four five"},
                               {"from": "human", "value": "third, unanswered"}]},
            {"conversations": [{"from": "human", "value": "alone"},
                               {"from": "gpt", "value": "reply"}]}]


def test_dataset_conversations_are_replayed_turn_by_turn(tmp_path):
    path = tmp_path / "sharegpt.json"
    path.write_bytes(orjson.dumps(SHAREGPT))
    (first, second) = load_dataset(path)
    assert [(t.user, t.reply) for t in first.turns] == [("first question", "one two three"),
                                                       ("second question", "four five")]
    jsonl = tmp_path / "chats.jsonl"
    jsonl.write_text(json.dumps({"messages": [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]}) + "\n")
    (entry,) = load_dataset(jsonl)
    assert entry.system == "be brief" and [(t.user, t.reply) for t in entry.turns] == [
        ("a", "b"), ("c", None)]
    with Server(answering()) as server:
        result = run_bench(session_config(
            server.url, tmp_path, SessionConfig(turns=None), requests=3, duration_s=None,
            arrivals=ArrivalConfig(users=1), workload={"dataset": path, "prompts": "seed"}))
        bodies = [r["body"] for r in server.received]
        fresh = run_bench(session_config(
            server.url, tmp_path, SessionConfig(turns=None), requests=3, duration_s=None,
            arrivals=ArrivalConfig(users=1), workload={"dataset": path}))
        salted = [r["body"] for r in server.received[len(bodies):]]
    assert fresh.summary.ok == 3
    assert [len(b["messages"]) for b in salted] == [1, 3, 1]  # fresh words, the same turns
    assert salted[1]["messages"][0]["content"].endswith(" first question")
    assert salted[1]["messages"][0]["content"] != "first question"
    assert [len(b["messages"]) for b in bodies] == [1, 3, 1]
    assert bodies[1]["messages"][0]["content"] == "first question"
    assert bodies[1]["messages"][2]["content"] == "second question"
    reply = len(Tokenizer.load(None).encode("four five"))
    assert bodies[1]["max_tokens"] == reply  # the dataset's reply length
    assert result.summary.sessions.sessions == 2


def test_a_conversation_is_the_same_for_the_same_seed():
    config = WorkloadConfig(api="completions", prompt_tokens=FIXED("uniform:4,40", "p"),
                            sessions=SessionConfig(turns=FIXED("uniform:1,6", "t")))
    workload = Workload(config)
    a, b = Conversation(workload, 3, "s3"), Conversation(workload, 3, "s3")
    assert a.turns == b.turns
    one, two = a.request(1, 0), b.request(1, 0)
    assert one.prompt == two.prompt and one.prompt_tokens == len(
        workload.tokenizer.encode(one.prompt))
    a.answered(" reply", None)
    assert a.request(2, 1).prompt.startswith(one.prompt + " reply")
    assert {Conversation(workload, i, "x").turns for i in range(40)} == set(range(1, 7))
    later = Workload(config.model_copy(update={"sessions": SessionConfig(
        turns=FIXED("2", "t"), message_tokens=FIXED("fixed:3", "m"))}))
    conv = Conversation(later, 0, "s0")
    first = conv.request(1, 0)
    assert 4 <= first.prompt_tokens <= 40  # --prompt-tokens: the first message
    conv.answered("", 0)
    assert conv.request(2, 1).prompt_tokens == first.prompt_tokens + 3  # --message-tokens


@pytest.mark.parametrize("args, fragment", [
    (["--turns", "3", "--agent-steps", "2"], "exclude each other"),
    (["--think-time", "1"], "give --turns or --agent-steps"),
    (["--turns", "3", "--tool-latency", "fixed:5"], "go with --agent-steps"),
    (["--agent-steps", "3", "--think-time", "1"], "goes with --turns"),
    (["--turns", "all"], "give --dataset"),
    (["--turns", "3", "--requests", "2"], "fewer than one session's"),
    (["--agent-steps", "2", "--tool-url", "localhost:9"], "--tool-url"),
    (["--turns", "nope:3"], "--turns"),
])
def test_session_options_that_do_not_fit_are_refused(tmp_path, args, fragment):
    result = CliRunner().invoke(app, ["bench", "--url", "http://127.0.0.1:9", "--out",
                                      str(tmp_path), *args])
    assert result.exit_code == 2 and fragment in result.output, result.output


def test_the_default_think_time_scales_with_the_run():
    config = BenchConfig(url="http://127.0.0.1:9", duration_s=10,
                         workload={"sessions": {"turns": "3"}})
    think = config.workload.sessions.think_s
    assert (think.kind, think.a) == ("lognormal", 1.0)
    draws = [think.draw(np.random.default_rng(i)) for i in range(200)]
    assert 0.8 < float(np.mean(draws)) < 1.2
