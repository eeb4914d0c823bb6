"""latlab's request fields beyond OpenAI's schema, and what a run learned about the server.

latlab asks more of a server than OpenAI's schema has words for: `ignore_eos` and `min_tokens`
(hold the output length), `priority`, llama.cpp's `timings_per_token`, and
`stream_options` with vLLM's `continuous_usage_stats` (tokens per chunk). latlab serve, vLLM,
SGLang and llama.cpp take them; a server that keeps to the schema (`transformers serve`,
OpenAI's own API, a gateway in front of a model) refuses them with a 400 or 422 naming them.
The first request so refused is the probe: the fields its error names are left out of every
later request of the run and it is sent again at once without them (its refused attempt's
time is client wait); the run notes it once, and the output length then rests on
`max_tokens` (the summary says when it was not held).

A stream that ends without `data: [DONE]` after its `finish_reason` is complete
(`sse.StreamParser`): counted here, noted once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from latlab.records.config import Gateway

# Most specific first: a refusal naming `stream_options.continuous_usage_stats` drops only
# the latter.
EXTENSIONS = ("continuous_usage_stats", "timings_per_token", "ignore_eos", "min_tokens",
              "priority", "stream_options")
REFUSED_STATUSES = (400, 422)
LENGTH_FIELDS = ("ignore_eos", "min_tokens")


def sent_extensions(body: dict[str, Any]) -> list[str]:
    """The extension fields `body` carries."""
    sent = [name for name in EXTENSIONS if name in body]
    options = body.get("stream_options")
    if isinstance(options, dict) and "continuous_usage_stats" in options:
        sent.append("continuous_usage_stats")
    return sent


def refused_fields(status: int | None, message: str, body: dict[str, Any]) -> list[str]:
    """The extension fields of `body` a 400/422 answer's `message` names ([] for any other
    answer, or one that names none of them)."""
    if status not in REFUSED_STATUSES:
        return []
    named = [name for name in sent_extensions(body)
             if re.search(rf"(?<![A-Za-z0-9_]){name}(?![A-Za-z0-9_])", message)]
    if "continuous_usage_stats" in named and "stream_options" in named:
        named.remove("stream_options")  # `stream_options.continuous_usage_stats`
    return named


def without(body: dict[str, Any], fields: set[str] | frozenset[str]) -> dict[str, Any]:
    """`body` less the extension `fields`."""
    out = {k: v for k, v in body.items() if k not in fields}
    options = out.get("stream_options")
    if "continuous_usage_stats" in fields and isinstance(options, dict):
        out["stream_options"] = {k: v for k, v in options.items()
                                 if k != "continuous_usage_stats"}
    return out


@dataclass
class Adaptations:
    """What a client learned about the server during a run, to say once: the fields it
    refused (with the answer that refused them), the requests sent again without them, the
    streams complete without [DONE], and the gateway its first answer's headers name."""

    refused: dict[str, str] = field(default_factory=dict)
    resent: int = 0
    without_done: int = 0
    gateway: Gateway | None = None

    def merge(self, other: Adaptations) -> Adaptations:
        return Adaptations({**other.refused, **self.refused}, self.resent + other.resent,
                           self.without_done + other.without_done,
                           self.gateway or other.gateway)

    def to_json(self) -> dict[str, Any]:
        return {"refused": dict(self.refused), "resent": self.resent,
                "without_done": self.without_done,
                "gateway": self.gateway.model_dump() if self.gateway else None}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Adaptations:
        if not data:
            return cls()
        gateway = data.get("gateway")
        return cls(data.get("refused") or {}, data.get("resent", 0), data.get("without_done", 0),
                   Gateway.model_validate(gateway) if gateway else None)

    def notes(self, streams: int | None = None) -> list[str]:
        """What the run's summary says about them."""
        notes = []
        if self.refused:
            names = ", ".join(sorted(self.refused))
            example = next(iter(self.refused.values()))
            note = (f"the server refused {names} ({example}): left out of the run after its "
                    f"first refusal ({self.resent} requests sent again without them, the "
                    "refused attempt's time counted as client wait)")
            if set(LENGTH_FIELDS) & set(self.refused):
                note += ("; output lengths rest on max_tokens alone (--no-ignore-eos asks "
                         "so from the start)")
            notes.append(note)
        if self.without_done:
            of = f" of {streams}" if streams else ""
            notes.append(f"{self.without_done}{of} streams ended without `data: [DONE]` after "
                         "their finish_reason: taken as complete, done at their last event")
        return notes
