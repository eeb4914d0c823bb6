"""The order in which the scheduler serves requests: the scheduling policy and tenant shares.

* `fcfs`: first come, first served (a preempted request keeps its place: the front).
* `priority`: vLLM's convention, the lowest `priority` value first, then arrival order.
* Tenant fair share (either policy): among requests of equal priority, the tenant that was
  served the fewest tokens lately goes first, so a tenant with many requests in flight
  cannot hold the queue against one with a few. "Lately" decays: every step each tenant's
  count is multiplied by `FAIR_SHARE_DECAY`, which forgets usage after a few dozen steps.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Iterator
from typing import Literal

from latlab.engine.sequence import Sequence

FAIR_SHARE_DECAY = 0.9


class FairShare:
    """Recently served tokens per tenant (the `user` field or a header; None is a tenant)."""

    def __init__(self) -> None:
        self.served: dict[str | None, float] = {}

    def charge(self, tenant: str | None, tokens: int) -> None:
        self.served[tenant] = self.served.get(tenant, 0.0) + tokens

    def decay(self) -> None:
        self.served = {t: v * FAIR_SHARE_DECAY for t, v in self.served.items() if v >= 0.5}

    def usage(self, tenant: str | None) -> float:
        return self.served.get(tenant, 0.0)


class RequestQueue:
    """The waiting sequences; `peek` gives the one the policy serves next. Under plain FCFS
    they are kept in arrival order, so the order costs nothing per step however long the
    queue; a priority or fair-share order is sorted when asked for."""

    def __init__(self, policy: Literal["fcfs", "priority"] = "fcfs",
                 fair_share: bool = False) -> None:
        self.policy = policy
        self.fair_share = FairShare() if fair_share else None
        self._items: list[Sequence] = []
        self._arrivals: dict[int, int] = {}  # id(seq) -> arrival number, kept until finished
        self._next_arrival = 0
        self._kept_in_order = policy == "fcfs" and not fair_share

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    def __iter__(self) -> Iterator[Sequence]:
        """In no particular order (`ordered` for the policy's)."""
        return iter(self._items)

    def ordered(self) -> list[Sequence]:
        """The waiting sequences, the one to serve first first."""
        return list(self._items) if self._kept_in_order else sorted(self._items, key=self.key)

    def key(self, seq: Sequence) -> tuple[float, float, int]:
        """Sort key of a sequence, waiting or running: smaller is served first."""
        return (seq.priority if self.policy == "priority" else 0,
                self.fair_share.usage(seq.tenant) if self.fair_share else 0.0,
                self._arrivals[id(seq)])

    def add(self, seq: Sequence) -> None:
        """A new request, or a preempted one coming back (it keeps its arrival number)."""
        if id(seq) not in self._arrivals:
            self._arrivals[id(seq)] = self._next_arrival
            self._next_arrival += 1
        elif self._kept_in_order:  # preempted: back to its place
            insort(self._items, seq, key=lambda s: self._arrivals[id(s)])
            return
        self._items.append(seq)

    def peek(self) -> Sequence:
        return self._items[0] if self._kept_in_order else min(self._items, key=self.key)

    def remove(self, seq: Sequence) -> None:
        self._items.remove(seq)

    def forget(self, seq: Sequence) -> None:
        """The sequence has finished: drop what the queue kept about it."""
        self._arrivals.pop(id(seq), None)

    def pop_expired(self, enqueued_before_ns: int) -> list[Sequence]:
        """Take out the requests never scheduled that were enqueued before the deadline."""
        expired = [s for s in self._items if s.times.first_scheduled is None
                   and s.times.enqueued < enqueued_before_ns]
        for seq in expired:
            self._items.remove(seq)
        return expired

    def charge(self, seq: Sequence, tokens: int) -> None:
        if self.fair_share is not None:
            self.fair_share.charge(seq.tenant, tokens)

    def end_step(self) -> None:
        if self.fair_share is not None:
            self.fair_share.decay()
