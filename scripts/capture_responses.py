"""Record a server's real responses as test fixtures: the request, status, headers and body
of each exchange, one JSON file each, with the server's version inside.

Each fixture folder of tests/fixtures/servers/ was recorded by one of these (loopback only):

    # llama.cpp: the `default` preset as GGUF (`latlab model export DIR --gguf`), its
    # model.gguf copied to default-f32.gguf and served by `llama-server -m default-f32.gguf
    # --host 127.0.0.1 --port 8080 -c 1024 --metrics`
    python scripts/capture_responses.py llamacpp http://127.0.0.1:8080 \
        tests/fixtures/servers/llamacpp

    # transformers serve: `latlab model export DIR --model tiny`, then
    #   transformers serve --host 127.0.0.1 --port 8000 --device cpu DIR
    python scripts/capture_responses.py transformers http://127.0.0.1:8000 \
        tests/fixtures/servers/transformers --model DIR --server-version "transformers 5.23.0"

The exchanges are the ones latlab's adapters read. llama.cpp: streamed completions (also
with its `timings_per_token`), a non-streamed completion, streamed and non-streamed chat,
/v1/models and /metrics; its version comes from `GET /props`. transformers: streamed and
non-streamed completions and chat with OpenAI's fields only, the 422 that refuses latlab's
`ignore_eos` and `min_tokens`, and /v1/models (a 500 without a Hugging Face cache). The model name a
fixture asked for is written as `MODEL` in it, so a fixture does not carry a temporary path.
"""

from __future__ import annotations

import argparse
import http.client
import json
from pathlib import Path
from urllib.parse import urlparse

PROMPT = " the main loop of the program"
MESSAGES = [{"role": "user", "content": "hello there"}]
USAGE = {"include_usage": True}
LATLAB_FIELDS = {"ignore_eos": True, "min_tokens": 6,
                 "stream_options": USAGE | {"continuous_usage_stats": True}}


def llamacpp(model: str) -> dict[str, tuple[str, str, dict | None]]:
    stream = {"model": model, "prompt": PROMPT, "max_tokens": 6, "stream": True} | LATLAB_FIELDS
    chat = {k: v for k, v in stream.items() if k != "prompt"} | {"messages": MESSAGES}
    return {
        "stream_completions": ("POST", "/v1/completions", stream),
        "stream_timings_per_token": ("POST", "/v1/completions",
                                     stream | {"timings_per_token": True}),
        "nonstream_completions": ("POST", "/v1/completions", stream | {"stream": False}),
        "stream_chat": ("POST", "/v1/chat/completions", chat),
        "nonstream_chat": ("POST", "/v1/chat/completions", chat | {"stream": False}),
        "models": ("GET", "/v1/models", None),
        "metrics": ("GET", "/metrics", None),
    }


def transformers(model: str) -> dict[str, tuple[str, str, dict | None]]:
    stream = {"model": model, "prompt": PROMPT, "max_tokens": 6, "stream": True,
              "stream_options": USAGE}
    chat = {k: v for k, v in stream.items() if k != "prompt"} | {"messages": MESSAGES}
    return {
        "stream_completions": ("POST", "/v1/completions", stream),
        "nonstream_completions": ("POST", "/v1/completions", stream | {"stream": False}),
        "stream_chat": ("POST", "/v1/chat/completions", chat),
        "nonstream_chat": ("POST", "/v1/chat/completions", chat | {"stream": False}),
        "refused_fields": ("POST", "/v1/completions", stream | LATLAB_FIELDS),
        "models": ("GET", "/v1/models", None),
    }


SERVERS = {"llamacpp": llamacpp, "transformers": transformers}


def exchange(host: str, port: int, method: str, path: str, body: dict | None) -> dict:
    conn = http.client.HTTPConnection(host, port, timeout=120)
    data = json.dumps(body).encode() if body is not None else None
    conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    text = resp.read().decode("utf-8", "replace")
    conn.close()
    return {"request": {"method": method, "path": path, "body": body}, "status": resp.status,
            "headers": dict(resp.getheaders()), "body": text}


def llamacpp_version(host: str, port: int) -> str:
    try:
        return json.loads(exchange(host, port, "GET", "/props", None)["body"]).get(
            "build_info", "unknown")
    except (OSError, ValueError):
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("server", choices=sorted(SERVERS))
    parser.add_argument("url", help="the server's root, http://127.0.0.1:PORT")
    parser.add_argument("folder", type=Path)
    parser.add_argument("--model", default="m", help="the model name requests take")
    parser.add_argument("--server-version", help="the version to record (llama.cpp: /props)")
    args = parser.parse_args()
    url = urlparse(args.url)
    if url.hostname not in ("127.0.0.1", "::1", "localhost"):
        parser.error("loopback targets only")
    version = args.server_version or (llamacpp_version(url.hostname, url.port)
                                      if args.server == "llamacpp" else "unknown")
    args.folder.mkdir(parents=True, exist_ok=True)
    for name, (method, path, body) in SERVERS[args.server](args.model).items():
        record = exchange(url.hostname, url.port, method, path, body)
        record["server_version"] = version
        text = json.dumps(record, indent=1) + "\n"
        if args.model != "m":
            text = text.replace(json.dumps(args.model)[1:-1], "MODEL")
        (args.folder / f"{name}.json").write_text(text)
        print(f"{name}: HTTP {record['status']}, {len(record['body'])} bytes")


if __name__ == "__main__":
    main()
