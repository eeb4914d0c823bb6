"""Slow and stalled clients against latlab serve (`server.connections`): a request must
arrive within its deadline, extended while it makes progress; stalled ones are cut off (408)
and hold no waiting slot; connections are capped in total, per address and while arriving.
benchmarks/slow_clients.py runs the same with 1,100 stalled clients beside real traffic."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import httpx
import pytest
from engine_server import running_server
from processes import wait_until
from raw_http import raw_post, status_of

from latlab.server.openai_serving import RETRY_AFTER_MAX_S, retry_after_s

FAST = {"header_timeout_s": 0.5, "body_timeout_s": 0.5, "min_rate": 0}
COMPLETION = {"prompt": "hi", "max_tokens": 2}


def half_headers(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
    return sock


def cut_off(url: str) -> dict[str, float]:
    """latlab_requests_cut_off_total by reason."""
    found = {}
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith("latlab_requests_cut_off_total{"):
            reason = line.split('reason="')[1].split('"')[0]
            found[reason] = float(line.split()[-1])
    return found


def test_stalled_headers_and_bodies_get_408_and_hold_no_waiting_slot():
    with running_server(max_num_seqs=1, max_waiting=1, settings=FAST) as s:
        with half_headers(s.url) as headers, raw_post(s.url) as body, \
                socket.create_connection(("127.0.0.1", int(s.url.rsplit(":", 1)[1]))) as idle:
            # a stalled body is not waiting: a real request is served meanwhile
            r = httpx.post(s.url + "/v1/completions", json=COMPLETION)
            assert r.status_code == 200
            assert s.engine.num_waiting == 0
            idle.settimeout(30)
            assert [status_of(sock) for sock in (headers, body, idle)] == [408] * 3
            assert headers.recv(1) == b""  # and closed
        assert cut_off(s.url) == {"headers_timeout": 2, "body_timeout": 1, "evicted": 0}


def test_a_slow_client_that_keeps_sending_is_served():
    # 200 bytes/s against --min-rate 100: every byte buys more time than it took
    settings = {"header_timeout_s": 1.0, "body_timeout_s": 1.0, "min_rate": 100}
    body = b'{"prompt": "' + b"a " * 100 + b'", "max_tokens": 2}'
    with running_server(settings=settings) as s:
        host, port = s.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                         f"application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode())
            started = time.monotonic()
            for i in range(0, len(body), 20):
                sock.sendall(body[i:i + 20])
                time.sleep(0.1)
            assert time.monotonic() - started > settings["body_timeout_s"]
            assert status_of(sock) == 200


def test_a_stalled_request_on_a_kept_alive_connection_is_cut_off_too():
    with running_server(settings=FAST) as s, httpx.Client() as client:
        assert client.post(s.url + "/v1/completions", json=COMPLETION).status_code == 200
        (connection,) = client._transport._pool.connections
        sock = connection._connection._network_stream.get_extra_info("socket")
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\n")
        sock.settimeout(30)
        assert status_of(sock) == 408


def test_past_max_reading_the_longest_arriving_request_is_evicted():
    with running_server(settings={"max_reading": 2}) as s:
        first, second = half_headers(s.url), half_headers(s.url)
        wait_until(lambda: len(guard(s).reading) == 2,
                   what="two requests arriving")
        third = half_headers(s.url)
        first.settimeout(30)
        assert status_of(first) == 408  # the oldest, at once (the deadline is 5 s away)
        assert guard(s).cut["evicted"] == 1 and len(guard(s).reading) == 2
        second.setblocking(False)
        with pytest.raises(BlockingIOError):  # the younger ones still wait for their bytes
            second.recv(1)
        for sock in (first, second, third):
            sock.close()


def test_connections_are_capped_per_client_address_and_in_total():
    with running_server(settings={"max_connections": 3, "max_connections_per_client": 2}) as s:
        kept = [half_headers(s.url) for _ in range(2)]
        extra = half_headers(s.url)
        extra.settimeout(30)
        head = extra.recv(4096)
        assert head.startswith(b"HTTP/1.1 503") and b"--max-connections-per-client 2" in head
        try:  # another address (all of 127/8 is loopback) gets the last one, then none
            other = socket.create_connection(("127.0.0.1", int(s.url.rsplit(":", 1)[1])),
                                             source_address=("127.0.0.2", 0))
            fourth = socket.create_connection(("127.0.0.1", int(s.url.rsplit(":", 1)[1])),
                                              source_address=("127.0.0.3", 0))
        except OSError:
            pytest.skip("this machine routes only 127.0.0.1")
        fourth.settimeout(30)
        head = fourth.recv(4096)
        assert head.startswith(b"HTTP/1.1 503") and b"--max-connections 3" in head
        for sock in (*kept, extra, other, fourth):
            sock.close()
        wait_until(lambda: guard(s).open == 0, what="every connection released")


def guard(s):
    return s.server.config.app.state.connections


def test_retry_after_is_the_time_to_serve_what_waits():
    assert retry_after_s(30, 10.0) == 3
    assert retry_after_s(1, 10.0) == 1
    assert retry_after_s(10_000, 1.0) == RETRY_AFTER_MAX_S
    assert retry_after_s(5, None) == 1  # nothing finished yet: no rate to go by


def test_max_connections_follows_the_open_files_limit():
    code = ("import resource; resource.setrlimit(resource.RLIMIT_NOFILE, (300, 300)); "
            "from latlab.server.serve import connection_limit; print(connection_limit(2048))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert run.stdout.strip() == "172", run.stderr
    assert "--max-connections 2048 lowered to 172" in run.stderr
