"""/openapi.json describes what the server takes, and what a fuzzer makes of it: schemathesis
cases, valid and invalid, against `latlab serve --model tiny` get no 5xx."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest
from engine_server import running_server
from processes import wait_until
from schema_fuzz import fuzz

FUZZ_CASES = 1000


def test_openapi_json_has_the_request_bodies():
    with running_server() as s:
        schema = httpx.get(s.url + "/openapi.json").json()
    components = schema["components"]["schemas"]
    for path, model in (("/v1/completions", "CompletionRequest"),
                        ("/v1/chat/completions", "ChatCompletionRequest")):
        post = schema["paths"][path]["post"]
        ref = post["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        assert ref == f"#/components/schemas/{model}"
        assert set(post["responses"]) >= {"200", "400", "415", "429", "500"}
    seed = components["CompletionRequest"]["properties"]["seed"]["anyOf"][0]
    assert (seed["minimum"], seed["maximum"]) == (-(1 << 63), (1 << 63) - 1)
    assert "ChatMessage" in components and "ErrorResponse" in components


@pytest.fixture
def serve() -> Iterator[str]:
    """`latlab serve --model tiny` in its own process, with a short context so that valid
    cases finish quickly."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", "latlab", "serve", "--model", "tiny", "--port", str(port),
         "--max-model-len", "64", "--block-size", "8", "--num-kv-blocks", "64",
         "--max-num-seqs", "4", "--max-num-batched-tokens", "64"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert process.stdout.readline().startswith("latlab serve: ready")
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=30)


def used_blocks(url: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith("latlab_kv_cache_used_blocks "):
            return float(line.split()[1])
    raise AssertionError("no latlab_kv_cache_used_blocks in /metrics")


@pytest.mark.timeout(180)
def test_schemathesis_finds_no_server_error(serve):
    # Valid and invalid cases for each of the two POST routes, one for each GET route.
    result = fuzz(serve, cases_per_mode=FUZZ_CASES // 4)
    assert result.cases >= FUZZ_CASES, result.statuses
    assert result.server_errors == []
    assert result.statuses[200] > 0 and result.statuses[400] > 0
    assert httpx.get(serve + "/health").json() == {"status": "ok"}
    r = httpx.post(serve + "/v1/completions", json={"prompt": "x", "max_tokens": 3})
    assert r.status_code == 200
    wait_until(lambda: used_blocks(serve) == 0, what="every KV block to come back")
