"""The server-timing protocol's stage durations of one request, from the engine's stamps,
and the request's W3C `traceparent` (set per request by the app's outermost middleware)."""

from __future__ import annotations

import contextvars

from latlab.engine.sequence import StageTimes
from latlab.records.timeline import ServerTiming, ms_between

TRACEPARENT: contextvars.ContextVar[str | None] = contextvars.ContextVar("traceparent",
                                                                          default=None)


def server_timing(times: StageTimes) -> ServerTiming:
    """Each stage's duration (ms); a stage that did not happen is None."""
    return ServerTiming(
        preprocess=ms_between(times.enqueued, times.received),
        queue=ms_between(times.first_scheduled, times.enqueued),
        prefill=ms_between(times.first_token, times.first_scheduled),
        decode=ms_between(times.last_token, times.first_token),
        postprocess=ms_between(times.completed, times.last_token),
        total=ms_between(times.completed, times.received),
    )
