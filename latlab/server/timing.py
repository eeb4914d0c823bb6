"""The server-timing protocol's stage durations of one request, from the engine's stamps."""

from __future__ import annotations

from latlab.engine.sequence import StageTimes
from latlab.records.timeline import ServerTiming, ms_between


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
