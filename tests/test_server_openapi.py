"""/openapi.json describes what the server takes and answers: schemathesis with every check,
valid and invalid cases against `latlab serve --model tiny`, finds no mismatch and no 5xx."""

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
from schema_fuzz import check_all

FUZZ_EXAMPLES = 10  # per operation and phase, beside the coverage phase


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


@pytest.mark.timeout(600)
def test_schemathesis_with_every_check_finds_nothing(serve):
    # Its coverage phase (bounds, types, missing fields) and fuzzing, valid and invalid
    # bodies: statuses, content types, headers and bodies as documented, no 5xx, valid
    # requests accepted (but for what the schema cannot state: `schema_hooks`).
    run = check_all(serve, examples=FUZZ_EXAMPLES)
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-2000:]
    assert "No issues found" in run.stdout
    assert httpx.get(serve + "/health").json() == {"status": "ok"}
    r = httpx.post(serve + "/v1/completions", json={"prompt": "x", "max_tokens": 3})
    assert r.status_code == 200
    wait_until(lambda: used_blocks(serve) == 0, what="every KV block to come back")
