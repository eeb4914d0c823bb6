"""`latlab serve --engine-core process`: the engine's loop in a process of its own serves what
the thread serves, frees what aborted requests held, and its end is never silent."""

from __future__ import annotations

import os
import signal

import httpx
import orjson
import pytest
from engine_server import running_server
from processes import wait_until

from latlab.engine.loader import ModelLoadError
from latlab.records.engine import EngineConfig, ServeConfig
from latlab.server.serve import build_server, core_kind

PROCESS = {"engine_core": "process"}
THREAD = {"engine_core": "thread"}  # `auto` is a process on CUDA
GREEDY = {"prompt": "the engine core", "max_tokens": 24, "temperature": 0.0,
          "ignore_eos": True}


def streamed_text(url: str, body: dict) -> str:
    with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True},
                      timeout=60) as r:
        assert r.status_code == 200
        events = [line.removeprefix("data: ") for line in r.iter_lines() if line]
    assert events[-1] == "[DONE]"
    return "".join(orjson.loads(e)["choices"][0]["text"] for e in events[:-1])


def test_a_process_engine_serves_what_a_thread_engine_serves():
    with running_server(settings=THREAD) as thread:
        assert thread.engine.core.kind == "thread"
        expected = httpx.post(thread.url + "/v1/completions", json=GREEDY,
                              timeout=60).json()["choices"][0]["text"]
    with running_server(settings=PROCESS) as s:
        process = s.engine.core._process
        assert s.engine.core.kind == "process" and process.pid != os.getpid()
        response = httpx.post(s.url + "/v1/completions", json=GREEDY, timeout=60)
        assert response.json()["choices"][0]["text"] == expected
        assert streamed_text(s.url, GREEDY) == expected
        assert s.engine.stats.num_steps >= 2 * 24  # the stats come over with each step
        info = httpx.get(s.url + "/server_info").json()["engine"]
        assert info["num_kv_blocks"] == thread.engine.info.num_kv_blocks
        # A stream left halfway is aborted in the engine's process: every block comes back.
        body = {**GREEDY, "max_tokens": 200, "stream": True}
        with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=60) as r:
            next(line for line in r.iter_lines() if line)
        stats = lambda: s.engine.stats  # noqa: E731
        wait_until(lambda: stats().num_running == 0
                   and stats().num_free_blocks == stats().num_blocks, what="the abort")
    assert not process.is_alive()  # stopped with the server


def test_an_engine_process_that_dies_fails_its_streams_and_the_health_check():
    with running_server(settings=PROCESS, max_model_len=1024, num_kv_blocks=130) as s:
        body = {**GREEDY, "max_tokens": 1000, "stream": True}
        with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=60) as r:
            lines = (line for line in r.iter_lines() if line)
            assert next(lines).startswith("data: {")
            os.kill(s.engine.core._process.pid, signal.SIGKILL)
            rest = list(lines)
        assert rest[-1] == "data: [DONE]"
        assert "the engine process exited" in rest[-2], rest[-2]
        health = httpx.get(s.url + "/health")
        assert health.status_code == 503 and "exit code -9" in health.json()["error"]
        refused = httpx.post(s.url + "/v1/completions", json=GREEDY)
        assert refused.status_code == 503


def test_a_model_the_engine_process_cannot_load_is_refused_as_the_thread_refuses_it(tmp_path):
    serve = ServeConfig(engine=EngineConfig(model=str(tmp_path / "missing")), **PROCESS)
    with pytest.raises(ModelLoadError, match="not a preset"):
        build_server(serve)


def test_auto_is_a_process_on_cuda_and_a_thread_on_the_cpu(monkeypatch):
    import torch

    cpu = ServeConfig(engine=EngineConfig(device="cpu"))
    assert core_kind(cpu) == "thread"
    assert core_kind(cpu.model_copy(update=PROCESS)) == "process"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert core_kind(ServeConfig(engine=EngineConfig(device="auto"))) == "process"
