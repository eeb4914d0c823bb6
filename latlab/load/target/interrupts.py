"""Ctrl-C and SIGTERM while latlab runs servers: both raise KeyboardInterrupt, so the cleanup
that stops the servers latlab started runs for either, and a Ctrl-C that Python swallowed is
remembered (`PRESSED`) until a point where stopping is safe."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager

PRESSED: list[int] = []  # Ctrl-Cs seen under `remembered_interrupts`


def interrupt_on_sigterm() -> None:
    """Make SIGTERM raise KeyboardInterrupt like Ctrl-C, so the cleanup that stops the servers
    latlab started runs for it too (main thread only; an event loop's own handlers replace it
    while they are installed)."""
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    try:
        signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread
        pass


@contextmanager
def remembered_interrupts() -> Iterator[Callable[[], bool]]:
    """Ctrl-C raises KeyboardInterrupt as always, and is remembered: one that Python swallowed
    (raised inside a weakref callback or a `__del__`, which can only print it) is found by
    `pressed()` at the next point where stopping is safe, and ends a server's wait for
    readiness. Main thread only."""
    pressed = PRESSED

    def interrupt(signum: int, frame: object) -> None:
        pressed.append(signum)
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGINT, interrupt)
    except ValueError:  # not the main thread
        yield lambda: False
        return
    interrupt.remembers = True  # type: ignore[attr-defined]
    try:
        yield lambda: bool(pressed)
    finally:
        signal.signal(signal.SIGINT, previous)
        if not getattr(previous, "remembers", False):  # the outermost forgets them
            pressed.clear()
