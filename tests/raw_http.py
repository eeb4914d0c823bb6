"""A client over a bare socket: it can send part of a body, then wait or leave."""

from __future__ import annotations

import socket


def raw_post(url: str, sent: bytes = b'{"prompt": ', length: int = 100,
             path: str = "/v1/completions") -> socket.socket:
    """A connection whose POST announced `length` body bytes and sent `sent`."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {length}\r\n\r\n".encode() + sent)
    return sock


def status_of(sock: socket.socket) -> int:
    """The status of the response on `sock` (waits for it up to the socket's timeout)."""
    head = sock.recv(4096)
    return int(head.split(b" ", 2)[1])
