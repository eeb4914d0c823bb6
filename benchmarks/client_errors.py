"""What a client added to the latency it measured, for `client.py`: its stamps of each token
event against the server's writes of them (the same CLOCK_MONOTONIC)."""

from __future__ import annotations

import numpy as np

ADDED = ("events_per_s", "itl_p50", "itl_p99", "ttft_p50", "ttft_p99", "send_p99",
         "delivery_p99")


def added_errors(streams: list[tuple[str, list[int], int | None]], sends: dict[str, dict],
                 start_ns: int, end_ns: int) -> dict:
    """ITL and TTFT errors (ms) of `streams` (request id, the client's token stamps, its
    send stamp), counting events and requests inside [start_ns, end_ns); and the TTFT
    error's two sides: `send` (the server's read of the request − the client's send stamp,
    which includes the server's own delay) and `delivery` (the client's stamp of an event −
    the server's write of it)."""
    itl, ttft, send, delivery, events = [], [], [], [], 0
    for rid, stamps, sent in streams:
        t = np.asarray(stamps, dtype=np.int64)
        inside = (t >= start_ns) & (t < end_ns)
        events += int(inside.sum())
        server = sends.get(rid)
        if server is None or len(server["t"]) != len(t) or not len(t):
            continue
        written = np.asarray(server["t"], dtype=np.int64)
        itl.extend(((np.diff(t) - np.diff(written)) / 1e6)[inside[1:]])
        delivery.extend(((t - written) / 1e6)[inside])
        if sent is not None and start_ns <= sent < end_ns:
            ttft.append(((t[0] - sent) - (written[0] - server["r"])) / 1e6)
            send.append((server["r"] - sent) / 1e6)
    out = {"events_per_s": events / ((end_ns - start_ns) / 1e9)}
    for name, values in (("itl", itl), ("ttft", ttft), ("send", send), ("delivery", delivery)):
        v = np.asarray(values) if values else np.asarray([np.nan])
        out[f"{name}_p50"], out[f"{name}_p99"] = np.percentile(v, 50), np.percentile(v, 99)
    return out
