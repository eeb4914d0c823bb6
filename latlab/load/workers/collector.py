"""Python's garbage collector kept out of the measured token gaps.

The load path makes no reference cycles: every request's objects are freed by reference
counting (a 5,700-request run left about 100 unreachable objects, all from start-up). Yet the
cyclic collector walks the objects of every request in flight (about 50 each) several times
a second: at 256 streams its middle generation stalled the event loop about 6 ms once a
second and a full collection over 100 ms (CPU time; `benchmarks/client.py` prints them), and
every token that arrives meanwhile is stamped late. So during a load the collector is off
and what exists is frozen; `sweep_if_piled` collects only when tracked objects have piled up
since the last collection (cycles after all, from some failure path), which costs one stall
instead of a leak.
"""

from __future__ import annotations

import asyncio
import functools
import gc
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

PILE_UP = 100_000  # tracked objects allocated and not freed since the last collection
SWEEP_INTERVAL_S = 0.5
T = TypeVar("T")


def without_collector(run: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """An async function run with the collector paused, a pile swept every half second."""

    @functools.wraps(run)
    async def paused(*args: Any, **kwargs: Any) -> T:
        with collector_paused():
            sweeper = asyncio.get_running_loop().create_task(_sweep_every(SWEEP_INTERVAL_S))
            try:
                return await run(*args, **kwargs)
            finally:
                sweeper.cancel()

    return paused


async def _sweep_every(interval_s: float) -> None:
    while True:
        await asyncio.sleep(interval_s)
        sweep_if_piled()


@contextmanager
def collector_paused() -> Iterator[None]:
    """The collector off for the block, with the objects that exist now frozen."""
    was_enabled = gc.isenabled()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.unfreeze()
        if was_enabled:
            gc.enable()


def sweep_if_piled(limit: int = PILE_UP) -> bool:
    """Collect if more than `limit` tracked objects piled up; whether it did."""
    if gc.isenabled() or gc.get_count()[0] <= limit:
        return False
    gc.collect()
    return True
