"""Reading and tokenizing a request never stalls the event loop and ends within a bound; a
request takes a waiting slot once its body is in, not while it arrives."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from engine_server import running_server
from processes import wait_until
from raw_http import raw_post, status_of

from latlab.server.prompts import PromptBuilder


@pytest.fixture(scope="module")
def server():
    with running_server(max_model_len=1024, num_kv_blocks=300) as s:
        yield s


def test_a_4mb_prompt_is_refused_without_tokenizing_it(server, monkeypatch):
    calls = []
    monkeypatch.setattr(PromptBuilder, "_tokenize", lambda self, text: calls.append(text))
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "x" * 4_000_000}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert "4000000 characters" in r.json()["error"]["message"]
    assert calls == []
    assert httpx.get(server.url + "/health").status_code == 200


def test_health_answers_while_a_prompt_is_being_tokenized(server, monkeypatch):
    tokenizing, health_answered, answered_meanwhile = threading.Event(), threading.Event(), []
    tokenize = PromptBuilder._tokenize

    def held(self, text):
        tokenizing.set()
        answered_meanwhile.append(health_answered.wait(30))  # False: the loop was blocked
        return tokenize(self, text)

    monkeypatch.setattr(PromptBuilder, "_tokenize", held)
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(httpx.post, server.url + "/v1/completions",
                              json={"prompt": "word " * 20_000, "max_tokens": 2}, timeout=60)
        assert tokenizing.wait(30)
        health = httpx.get(server.url + "/health", timeout=60)
        health_answered.set()
        assert health.status_code == 200
        r = pending.result()
    assert answered_meanwhile == [True]
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"


def test_a_request_still_being_read_holds_no_waiting_slot():
    with running_server(max_num_seqs=1, max_waiting=1) as s:
        with raw_post(s.url):
            r = httpx.post(s.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
            assert r.status_code == 200
            assert s.engine.num_waiting == 0


def test_a_body_that_does_not_arrive_in_time_gets_408():
    with running_server(settings={"body_timeout_s": 0.2, "min_rate": 0}) as s:
        with raw_post(s.url) as slow:
            assert status_of(slow) == 408
        wait_until(lambda: s.engine.num_waiting == 0, what="the slot to be given back")
