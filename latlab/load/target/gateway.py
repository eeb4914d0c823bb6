"""A gateway or proxy in front of the engine, told from the headers it adds to its answers.

    LiteLLM   x-litellm-version, x-litellm-call-id, x-litellm-model-id, ...
    Envoy     server: envoy, x-envoy-upstream-service-time
    Kong      via: kong/..., x-kong-proxy-latency
    nginx     server: nginx/...
    any       via: ... (RFC 9110: every proxy should add one)

An engine answering by itself adds none of them (uvicorn, llama-server, vLLM say
`server: uvicorn` or nothing). `--server-url` says there is one even when its headers do not.
"""

from __future__ import annotations

from collections.abc import Mapping

from latlab.records.config import Gateway

PREFIXED = (("x-litellm-", "LiteLLM"), ("x-envoy-", "Envoy"), ("x-kong-", "Kong"))
VERSIONS = {"LiteLLM": "x-litellm-version"}
SERVERS = ("envoy", "nginx", "openresty", "caddy", "traefik", "kong")  # `server:` header prefixes


def detect(headers: Mapping[str, str]) -> Gateway | None:
    """The gateway whose headers `headers` (an answer's, any case) carry, or None."""
    lower = {k.lower(): v for k, v in headers.items()}
    for prefix, name in PREFIXED:
        found = sorted(k for k in lower if k.startswith(prefix))
        if found:
            version = lower.get(VERSIONS.get(name, ""))
            return Gateway(name=f"{name} {version}" if version else name,
                           evidence=f"its answers carry {', '.join(found[:3])}")
    server = lower.get("server", "")
    for token in SERVERS:
        if server.lower().startswith(token):
            return Gateway(name=server, evidence=f"server: {server}")
    if "via" in lower:
        return Gateway(name=lower["via"], evidence=f"via: {lower['via']}")
    return None


def named(server_url: str) -> Gateway:
    """A gateway the user named by giving the engine behind it."""
    return Gateway(name="a gateway", evidence=f"--server-url {server_url}")
