"""What a server says of one request's stages: `ServerTiming`, durations on the server's
own clock (no clock synchronisation needed), read from whatever the server sends.

The server-timing protocol (latlab's own; docs/reference/server-timing.md): a streamed
response carries a top-level ``server_timing`` object (``{"preprocess": ms, "queue": ms,
"prefill": ms, "decode": ms, "postprocess": ms, "total": ms}``) in its final usage event, a
non-streamed one the same durations in a W3C ``Server-Timing`` header
(``prefill;dur=31.0, decode;dur=412.9, ...``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any

SERVER_TIMING_STAGES = ("preprocess", "queue", "prefill", "decode", "postprocess", "total")
# Durations other servers report that the protocol's stages do not name.
SERVER_DURATIONS = (*SERVER_TIMING_STAGES, "inference", "model_load", "model_call")
GATEWAY_DURATIONS = ("gateway_intake", "gateway_forward", "gateway_tail")  # telemetry/upstream


@dataclass(slots=True)
class ServerTiming:
    """Stage durations (ms) a server reports for one request, measured from its receipt.

    Whatever the server (`source`: the adapter that read them), the same stages; a stage the
    server does not report is None. `inference` is prefill + decode from a server that does
    not split them (TGI); `model_load` the time it spent loading the model for this request
    (Ollama's cold start); `model_call` the model's time as its caller saw it, where the model
    server itself said nothing (a GenAI client span without the server's spans: its stages
    and the network to it, unsplit)."""

    preprocess: float | None = None
    queue: float | None = None
    prefill: float | None = None
    decode: float | None = None
    postprocess: float | None = None
    total: float | None = None
    inference: float | None = None
    model_load: float | None = None
    model_call: float | None = None
    gateway_intake: float | None = None
    gateway_forward: float | None = None
    gateway_tail: float | None = None
    source: str | None = None
    # An application in front of the model (its own spans): ms per span name, and `other`,
    # its time outside them and outside the model server's `total`; `total` is then the
    # application's.
    application: dict[str, float] | None = None

    def to_json(self) -> dict[str, Any]:
        data = {k: v for k in _TIMING_FIELDS if (v := getattr(self, k)) is not None}
        if self.application is not None:
            data["application"] = dict(self.application)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any] | None, source: str | None = None
                  ) -> ServerTiming | None:
        """The durations of `data` (latlab's protocol names); None when it holds none."""
        if not isinstance(data, dict):
            return None
        values: dict[str, Any] = {}
        for name in (*SERVER_DURATIONS, *GATEWAY_DURATIONS):
            value = data.get(name)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
                values[name] = float(value)
        app = data.get("application")
        if isinstance(app, dict):
            values["application"] = {str(k): float(v) for k, v in app.items()
                                     if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if not values:
            return None
        source = source or data.get("source")
        return cls(**values, source=source if isinstance(source, str) else None)

    def to_header(self) -> str:
        return ", ".join(f"{k};dur={getattr(self, k):.3f}" for k in SERVER_TIMING_STAGES
                         if getattr(self, k) is not None)

    @classmethod
    def from_header(cls, header: str | None) -> ServerTiming | None:
        if not header:
            return None
        values: dict[str, float] = {}
        for metric in header.split(","):
            match = _SERVER_TIMING_METRIC.match(metric.strip())
            if match and match["name"] in SERVER_TIMING_STAGES:
                values[match["name"]] = float(match["dur"])
        return cls.from_json(values, "latlab")


_SERVER_TIMING_METRIC = re.compile(
    r'^(?P<name>[A-Za-z0-9_.-]+)\s*(?:;[^;]*?)*?;\s*dur\s*=\s*"?(?P<dur>[0-9.eE+-]+)"?'
)


_TIMING_FIELDS = tuple(f.name for f in fields(ServerTiming) if f.name != "application")
