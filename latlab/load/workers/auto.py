"""`--workers auto`: as many client processes as the offered load needs.

The offered token events per second: an open loop's rate times its mean output length (each
token its own event, the worst case), a closed loop's users (and a cap's slots) times
`STREAM_EVENTS_PER_S` each (a 10 ms inter-token latency: a fast server's decode). What one
process holds comes from `benchmarks/client.py` on the reference machine (2 cores, one of
them the benchmark's server's, nothing else running): at 256 streams, 25,600 events/s, one
process kept 99.7% of the ideal event rate and added 0.41 ms to ITL and 0.90 ms to TTFT at
p99; at 1,024 it fell behind. It is scaled by this machine's speed: a short self-check times
the SSE parser, the per-event path, here and compares it with the reference machine's time
in the same run.
"""

from __future__ import annotations

import math
import os
import time

from latlab.load.request.sse import StreamParser
from latlab.load.workload.requests import Workload
from latlab.load.workload.traces import survey
from latlab.records.bench import BenchConfig
from latlab.records.timeline import RequestTimeline

STREAM_EVENTS_PER_S = 100.0
REFERENCE_EVENTS_PER_S = 25_600.0  # benchmarks/client.py (1): one process at 256 streams
REFERENCE_PARSE_NS = 1_733  # the self-check's time per event in that run
SAMPLE_REQUESTS = 200
CHECK_EVENTS = 4000
EVENT = (b'data: {"id":"cmpl-check","object":"text_completion","created":0,"model":"check",'
         b'"choices":[{"index":0,"text":" token","logprobs":null,"finish_reason":null}],'
         b'"usage":null}\n\n')


def auto_workers(config: BenchConfig, workload: Workload, remote: bool = False) -> tuple[int, str]:
    """The number of processes for `config`'s offered load, and a line saying why. Without
    `remote` (a Ray cluster) it is at most this machine's cores, and never more than the
    users or concurrency slots it shares."""
    offered = offered_events_per_s(config, workload)
    per_process = REFERENCE_EVENTS_PER_S * REFERENCE_PARSE_NS / parse_ns_per_event()
    needed = max(1, math.ceil(offered / per_process))
    count = needed if remote else min(needed, os.cpu_count() or 1)
    a = config.arrivals
    count = min(count, a.users if not a.open_loop else count, a.max_concurrency or count)
    why = (f"--workers auto: {count} for about {offered:,.0f} token events/s offered; one process "
           f"holds about {per_process:,.0f}/s on this machine")
    if count < needed:
        why += f" ({needed} would be needed: the self-check will say if the client falls behind)"
    return count, why


def offered_events_per_s(config: BenchConfig, workload: Workload) -> float:
    """Token events per second the run asks for at its peak (see the module's doc)."""
    a = config.arrivals
    if not a.open_loop:
        return a.users * STREAM_EVENTS_PER_S
    streams = a.max_concurrency or (config.requests if a.rate == math.inf else None)
    if a.process == "trace":
        window = survey(a, config.duration_s, config.requests)
        rate = window.requests / max(window.span_s, 1e-3) if window.requests > 1 else 1.0
    else:
        rate = a.rate
    count = min(config.requests or SAMPLE_REQUESTS, SAMPLE_REQUESTS)
    tokens = sum(workload.request(i).max_tokens for i in range(count)) / count
    events = rate * tokens
    return min(events, streams * STREAM_EVENTS_PER_S) if streams else events


def parse_ns_per_event(events: int = CHECK_EVENTS) -> float:
    """CPU time per token event through the SSE parser here (best of three)."""
    best = math.inf
    for _ in range(3):
        parser = StreamParser(RequestTimeline(id="check", index=0), chat=False)
        start = time.process_time_ns()
        for t in range(events):
            parser.feed(EVENT, t)
        best = min(best, (time.process_time_ns() - start) / events)
    return best
