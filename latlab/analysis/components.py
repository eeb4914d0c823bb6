"""The components a request's time splits into (`decompose` states how each is measured):
their names, what a person calls them, the buckets they are read in, and the quality of
each measurement."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum


class Quality(StrEnum):
    EXACT = "exact"  # one measured interval
    DERIVED = "derived"  # differences of measured intervals
    ESTIMATED = "estimated"  # a proxy for an interval nobody measured
    UNAVAILABLE = "unavailable"  # not measured; its time sits in another component


COMPONENTS = ("client_wait", "connect", "tls", "network", "gateway_intake", "intake", "preprocess",
              "queue", "model_load", "prefill", "decode", "inference", "model_call", "postprocess",
              "gateway_tail", "ttft_unsplit", "unattributed")
GATEWAY = ("gateway_intake", "gateway_tail")  # a gateway's hop around the engine
SERVER_STAGES = ("preprocess", "queue", "prefill", "decode")
BEFORE_FIRST_TOKEN = ("preprocess", "model_load", "prefill")

LABELS = {
    "client_wait": "client wait", "connect": "connect", "tls": "TLS handshake",
    "network": "network",
    "intake": "server intake", "preprocess": "preprocess", "queue": "queue",
    "model_load": "model load", "prefill": "prefill", "decode": "decode",
    "inference": "prefill + decode (unsplit)", "postprocess": "postprocess",
    "ttft_unsplit": "first token (unsplit)", "unattributed": "unattributed",
    "gateway_intake": "gateway intake", "gateway_tail": "gateway tail",
    "model_call": "model server (unsplit)",
}

APP = "app:"  # an application component's prefix: `app:retrieval`, `app:other`

# The buckets a person reads first; the unsplit ones only appear when a server does not split,
# the application when an application's spans gave its components.
BUCKETS: dict[str, tuple[str, ...]] = {
    "network": ("connect", "tls", "network"),
    "gateway": GATEWAY,
    "queue & overhead": ("client_wait", "intake", "preprocess", "queue", "model_load",
                         "postprocess", "unattributed"),
    "application": (),  # every `app:` component
    "prefill": ("prefill",),
    "decode": ("decode",),
    "prefill + decode (unsplit)": ("inference",),
    "first token (unsplit)": ("ttft_unsplit",),
    "model server (unsplit)": ("model_call",),
}


def label(component: str) -> str:
    """What a person calls a component: `app:retrieval` is "retrieval"."""
    if component == APP + "other":
        return "application, other"
    return component[len(APP):] if component.startswith(APP) else LABELS[component]


def members(bucket: str, components: Iterable[str]) -> list[str]:
    """The components of `components` that belong to `bucket`."""
    if bucket == "application":
        return [c for c in components if c.startswith(APP)]
    return list(BUCKETS[bucket])


@dataclass(frozen=True, slots=True)
class Component:
    ms: float | None
    quality: Quality


QUALITIES = tuple(Quality)  # quality codes index this; −1: the component does not apply
UNAVAILABLE = QUALITIES.index(Quality.UNAVAILABLE)
EXACT, DERIVED, ESTIMATED = (QUALITIES.index(q) for q in (Quality.EXACT, Quality.DERIVED,
                                                           Quality.ESTIMATED))
