"""Clients that leave: the request is aborted, its KV blocks come back, and the log gets at
most one line for it, never a traceback."""

from __future__ import annotations

import httpx
import orjson
from engine_server import running_server
from processes import wait_until
from raw_http import raw_post
from server_logs import server_logs, tracebacks


def engine_idle(server) -> bool:
    stats = server.engine.stats
    return (stats.num_running == 0 and stats.num_waiting == 0
            and stats.num_free_blocks == stats.num_blocks)


def abort_count(server) -> float:
    for line in httpx.get(server.url + "/metrics").text.splitlines():
        if line.startswith('latlab_requests_total{outcome="abort"}'):
            return float(line.split()[-1])
    return 0.0


def test_a_client_leaving_a_non_streamed_request_gets_the_499_path():
    # uvicorn configures its loggers when the server is built: listen only after that.
    with running_server(max_num_seqs=1, max_model_len=1024, num_kv_blocks=130) as s, \
            server_logs() as records:
        body = {"prompt": "x", "max_tokens": 1000, "ignore_eos": True}
        data = orjson.dumps(body)
        with raw_post(s.url, data, len(data)):
            wait_until(lambda: s.engine.stats.num_running == 1, what="the request to run")
        wait_until(lambda: engine_idle(s), timeout_s=10, what="every KV block to come back")
        wait_until(lambda: abort_count(s) == 1, what="the abort to be counted")
        assert s.engine.stats.num_steps < 1000  # cut short, not run to the end
        assert httpx.get(s.url + "/health").status_code == 200
    assert tracebacks(records) == []


def test_a_client_leaving_mid_body_logs_one_line():
    with running_server() as s, server_logs() as records:
        raw_post(s.url).close()  # the head and a part of the body are on their way
        wait_until(lambda: records, what="a line about it")
        wait_until(lambda: s.engine.num_waiting == 0, what="the slot to be given back")
        assert httpx.get(s.url + "/health").status_code == 200
    assert tracebacks(records) == []
    assert len(records) == 1, [r.getMessage() for r in records]
    assert "the client left before sending the whole body" in records[0].getMessage()
