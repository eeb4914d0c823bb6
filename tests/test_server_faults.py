"""One request never takes the engine down: bad sampling fields are refused at the edge,
and a request whose processing fails in the engine ends alone while the others go on."""

from __future__ import annotations

import asyncio

import httpx
import orjson
import pytest
import torch
from engine_server import running_server
from processes import wait_until

from latlab.engine.sampling import Sampler
from latlab.engine.sampling_params import SamplingParams
from latlab.engine.sequence import Sequence, StageTimes

POISON_SEED = 666


def engine_idle(server) -> bool:
    stats = server.engine.stats
    return (stats.num_running == 0 and stats.num_waiting == 0
            and stats.num_free_blocks == stats.num_blocks)


@pytest.fixture(scope="module")
def server():
    with running_server(max_model_len=1024, num_kv_blocks=300) as s:
        yield s


@pytest.mark.parametrize("fields, status", [
    ({"seed": 1 << 63}, 400),
    ({"seed": -(1 << 63) - 1}, 400),
    ({"seed": (1 << 64) + 5}, 400),
    ({"seed": -(1 << 63)}, 200),
    ({"top_k": 1180591620717411303424}, 200),  # above the vocabulary: every token
    ({"top_k": -2}, 400),
    ({"temperature": 2.5}, 400),
    ({"temperature": 1e-300}, 200),  # greedy, not inf/NaN logits
    ({"top_p": 0}, 400),
    ({"top_p": 1.5}, 400),
    ({"min_tokens": 5, "max_tokens": 2}, 400),
    ({"min_tokens": 1 << 70}, 400),
    ({"max_tokens": 1 << 70}, 400),
    ({"stop": [""]}, 400),
])
def test_sampling_fields_are_checked_at_the_edge(server, fields, status):
    r = httpx.post(server.url + "/v1/completions",
                   json={"prompt": "x", "max_tokens": 3, **fields}, timeout=30)
    assert r.status_code == status, r.text
    health = httpx.get(server.url + "/health")
    assert health.status_code == 200 and health.json() == {"status": "ok"}


def test_top_k_above_the_vocabulary_next_to_a_small_one_in_one_batch():
    logits = torch.randn(3, 50)
    seqs = [Sequence(str(k), [1], SamplingParams(top_k=k), StageTimes(0, 0))
            for k in (5, 10000, 1 << 70)]
    tokens = Sampler(0, [])(logits, seqs)
    assert tokens[0] in logits[0].topk(5).indices.tolist()
    assert all(0 <= t < 50 for t in tokens[1:])


async def test_top_k_5_and_10000_served_together(server):
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        long = {"prompt": "x", "max_tokens": 1000, "ignore_eos": True, "stream": True,
                "top_k": 5}
        async with client.stream("POST", "/v1/completions", json=long) as first:
            lines = first.aiter_lines()
            assert (await anext(lines)).startswith("data: {")  # it is running
            r = await client.post("/v1/completions", json={
                "prompt": "y", "max_tokens": 5, "ignore_eos": True, "top_k": 10000})
            assert r.status_code == 200, r.text
            assert server.engine.stats.num_running == 1  # the first ran all along beside it
    wait_until(lambda: engine_idle(server), what="the engine to drain")
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}


@pytest.fixture
def poisoned_sampling(monkeypatch):
    """Sampling raises for any batch holding a sequence seeded POISON_SEED."""
    sample = Sampler.sample

    def poisoned(self, logits, seqs):
        if any(seq.params.seed == POISON_SEED for seq in seqs):
            raise RuntimeError("injected sampling failure")
        return sample(self, logits, seqs)

    monkeypatch.setattr(Sampler, "sample", poisoned)


async def test_a_failure_in_one_requests_sampling_fails_that_request_only(
        server, poisoned_sampling):
    body = {"prompt": "x", "max_tokens": 40, "ignore_eos": True}
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:

        async def stream(fields: dict) -> list[str]:
            async with client.stream("POST", "/v1/completions",
                                     json={**body, **fields, "stream": True}) as r:
                assert r.status_code == 200
                return [line async for line in r.aiter_lines() if line]

        healthy = [client.post("/v1/completions", json={**body, "seed": i}) for i in range(3)]
        results = await asyncio.gather(
            *healthy, stream({"seed": 7}),
            client.post("/v1/completions", json={**body, "seed": POISON_SEED}),
            stream({"seed": POISON_SEED}))
        *ok, ok_stream, bad, bad_stream = results
        for r in ok:
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 40
        assert ok_stream[-1] == "data: [DONE]" and '"finish_reason":"length"' in ok_stream[-2]
        assert bad.status_code == 500 and bad.json()["error"]["type"] == "server_error"
        assert "injected sampling failure" in bad.json()["error"]["message"]
        assert bad_stream[-1] == "data: [DONE]"
        assert orjson.loads(bad_stream[-2].removeprefix("data: "))["error"]["type"] == (
            "server_error")
        assert (await client.get("/health")).json() == {"status": "ok"}
        after = await client.post("/v1/completions", json={**body, "seed": 1})
        assert after.status_code == 200
    wait_until(lambda: engine_idle(server), what="every KV block to come back")
