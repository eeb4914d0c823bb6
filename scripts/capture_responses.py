"""Record a server's real responses as test fixtures: the request, status, headers and body
of each exchange, one JSON file each.

    python scripts/capture_responses.py http://127.0.0.1:8080 tests/fixtures/servers/llamacpp

Loopback only. The exchanges are the ones latlab's adapters read: streamed completions (with
llama.cpp's `timings_per_token`), a non-streamed completion, a streamed chat, /v1/models and
/metrics. The server's version goes into each file (`GET /props` when it answers).
"""

from __future__ import annotations

import http.client
import json
import sys
from pathlib import Path
from urllib.parse import urlparse

PROMPT = " the main loop of the program"
STREAM = {"model": "m", "prompt": PROMPT, "max_tokens": 6, "stream": True, "ignore_eos": True,
          "min_tokens": 6, "stream_options": {"include_usage": True,
                                              "continuous_usage_stats": True}}
EXCHANGES = {
    "stream_completions": ("POST", "/v1/completions", STREAM),
    "stream_timings_per_token": ("POST", "/v1/completions", STREAM | {"timings_per_token": True}),
    "nonstream_completions": ("POST", "/v1/completions", STREAM | {"stream": False}),
    "stream_chat": ("POST", "/v1/chat/completions",
                    {k: v for k, v in STREAM.items() if k != "prompt"}
                    | {"messages": [{"role": "user", "content": "hello there"}]}),
    "models": ("GET", "/v1/models", None),
    "metrics": ("GET", "/metrics", None),
}


def exchange(host: str, port: int, method: str, path: str, body: dict | None) -> dict:
    conn = http.client.HTTPConnection(host, port, timeout=30)
    data = json.dumps(body).encode() if body is not None else None
    conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    text = resp.read().decode("utf-8", "replace")
    conn.close()
    return {"request": {"method": method, "path": path, "body": body}, "status": resp.status,
            "headers": dict(resp.getheaders()), "body": text}


def main(url: str, folder: Path) -> None:
    parsed = urlparse(url)
    assert parsed.hostname in ("127.0.0.1", "::1", "localhost"), "loopback targets only"
    folder.mkdir(parents=True, exist_ok=True)
    try:
        version = exchange(parsed.hostname, parsed.port, "GET", "/props", None)["body"]
        version = json.loads(version).get("build_info", "unknown")
    except (OSError, ValueError):
        version = "unknown"
    for name, (method, path, body) in EXCHANGES.items():
        record = exchange(parsed.hostname, parsed.port, method, path, body)
        record["server_version"] = version
        (folder / f"{name}.json").write_text(json.dumps(record, indent=1) + "\n")
        print(f"{name}: HTTP {record['status']}, {len(record['body'])} bytes")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
