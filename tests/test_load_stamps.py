"""Token events are stamped when their bytes are read from the socket, not when the reading
coroutine gets the event loop back."""

import asyncio
import socket
import sys
import time
from collections import deque
from contextlib import contextmanager
from types import SimpleNamespace

from sse_server import DONE, Server, Step, completion, stream
from test_load_client import send, spec

from latlab.load.request import stamps
from latlab.load.request.sse import StreamParser
from latlab.load.request.stamps import kernel_rtt_ns, split_at_reads

MS = 1_000_000


@contextmanager
def busy_loop(hold_s: float):
    """A callback that holds the running loop `hold_s` at every turn; yields the list of
    (start, end) it held it."""
    loop = asyncio.get_running_loop()
    held, busy = [], [True]

    def hog():
        start = time.perf_counter_ns()
        time.sleep(hold_s)
        held.append((start, time.perf_counter_ns()))
        if busy[0]:
            loop.call_soon(hog)

    loop.call_soon(hog)
    try:
        yield held
    finally:
        busy[0] = False


def test_a_chunk_is_cut_where_each_read_ended():
    reads = deque([(100, 3), (200, 7), (300, 12)])
    assert split_at_reads(b"abcdefghij", 0, reads) == [(b"abc", 100), (b"defg", 200),
                                                        (b"hij", 300)]
    assert reads == deque([(300, 12)])  # that read's last two bytes are still to come
    assert split_at_reads(b"kl", 10, reads) == [(b"kl", 300)]
    assert not reads
    assert split_at_reads(b"mn", 12, reads) == [(b"mn", None)]  # no stamp: the caller's now


async def test_stamps_are_the_socket_reads_even_when_the_loop_is_busy(monkeypatch):
    """A callback that holds the loop 15 ms every turn stands between each read and the
    coroutine that parses it; the token stamps are still the reads' times."""
    read_ns, fed = [], []
    handler_received = stamps.StampedHandler.data_received

    def recorded(self, data):
        handler_received(self, data)
        if self.stamps:
            read_ns.append(self.stamps[-1][0])

    parser_feed = StreamParser.feed

    def feed(self, chunk, t):
        fed.append((t, time.perf_counter_ns()))
        parser_feed(self, chunk, t)

    monkeypatch.setattr(stamps.StampedHandler, "data_received", recorded)
    monkeypatch.setattr(StreamParser, "feed", feed)
    steps = [Step(0.03, completion(c)) for c in "abcd"] + [Step(0, DONE)]
    with Server(stream(steps)) as server, busy_loop(0.015):
        r = await send(server.url, spec())
    assert r.ok, r.error
    assert len(r.token_ns) == 4
    assert set(r.token_ns) <= set(read_ns)
    late = [parsed - t for t, parsed in fed if t in r.token_ns]
    assert min(late) >= 10 * MS  # the hog ran between each read and its parsing


async def test_sent_is_when_the_body_is_written_not_when_the_connection_was_ready():
    """On Python < 3.12 aiohttp writes the body in a task of its own, one loop turn after the
    connection is ready; `sent` is taken at the write, so a turn held by another callback is
    client wait, not time to first token."""
    arrived = []
    handle = stream([Step(0, completion("a")), Step(0, DONE)])

    async def stamped(request):
        arrived.append(time.perf_counter_ns())
        return await handle(request)

    with Server(stamped) as server, busy_loop(0.1) as held:
        r = await send(server.url, spec())
    assert r.ok, r.error
    assert r.sent_ns <= arrived[0]
    assert not [h for h in held if r.sent_ns <= h[0] and h[1] <= arrived[0]]


def test_the_kernels_round_trip_is_read_on_linux_only(monkeypatch):
    """The offset read is Linux's struct tcp_info's: elsewhere (macOS's is another struct)
    the round trip is unknown, never another field read as one."""
    with socket.create_server(("::1", 0), family=socket.AF_INET6) as server, \
            socket.create_connection(server.getsockname()[:2]) as sock:
        transport = SimpleNamespace(get_extra_info=lambda name: sock)
        if sys.platform == "linux":
            assert kernel_rtt_ns(transport) > 0  # IPv6 too
        monkeypatch.setattr(sys, "platform", "darwin")
        assert kernel_rtt_ns(transport) is None
