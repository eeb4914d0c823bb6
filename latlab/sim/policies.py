"""Fleet policies: where a request goes (the router) and how many replicas serve (the
autoscaler), and what the fleet paid for them (`fleet_outcome`).

Routers, as in production gateways (vLLM's router, llm-d, Envoy): `round_robin`; `random`
(each request to a replica drawn uniformly: Poisson arrivals split into independent Poisson
streams, each replica's load that of one server at rate / N);
`least_outstanding` (the replica with the fewest requests in flight, ties to the lowest
number); `prefix_affinity` (requests that share a prompt prefix go to the replica the
prefix hashes to — rendezvous hashing, so a replica joining or leaving moves only its own
prefixes — unless that replica holds more than `BOUND` × the mean in flight (+1), the
"consistent hashing with bounded loads" rule; requests without a shared prefix go to the
least outstanding).
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence
from typing import Protocol

from latlab.records.simulation import Autoscale, FleetOutcome

BOUND = 1.25


class Paid(Protocol):
    """A simulated replica as the fleet pays for it (`replica.SimReplica`)."""

    started: float
    stopped: float | None
    last_end: float
    reloads: int


def fleet_outcome(replicas: Sequence[Paid], ready_timeline: Sequence[tuple[float, int]],
                  ready_now: int, end: float, scale_ups: int, scale_downs: int
                  ) -> FleetOutcome:
    """The replica-seconds paid up to `end` (a replica scaled down still finishes what it
    holds), and how many served when (`ready_timeline`: (t, replicas ready))."""
    paid = 0.0
    for r in replicas:
        stop = r.stopped if r.stopped is not None else end
        paid += max(0.0, max(stop, r.last_end) - r.started)
    counts = [n for _, n in ready_timeline] or [ready_now]
    return FleetOutcome(replica_seconds=paid, mean_replicas=paid / end if end > 0 else 0,
                        peak_replicas=max(counts), scale_ups=scale_ups, scale_downs=scale_downs,
                        reloads=sum(r.reloads for r in replicas),
                        timeline=[(round(t, 3), n) for t, n in ready_timeline])


class Routable(Protocol):
    name: int
    outstanding: int

    @property
    def num_waiting(self) -> int: ...


def _score(prefix: int, replica: int) -> int:
    digest = hashlib.blake2b(f"{prefix}:{replica}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class Router:
    def __init__(self, policy: str, seed: int = 0) -> None:
        self.policy = policy
        self._next = 0
        self._rng = random.Random(seed)

    def route(self, ready: Sequence[Routable], prefix: int | None) -> Routable:
        if self.policy == "round_robin":
            self._next += 1
            return ready[(self._next - 1) % len(ready)]
        if self.policy == "random":
            return ready[self._rng.randrange(len(ready))]
        least = min(ready, key=lambda r: r.outstanding)
        if self.policy == "least_outstanding" or prefix is None:
            return least
        home = max(ready, key=lambda r: _score(prefix, r.name))
        mean = sum(r.outstanding for r in ready) / len(ready)
        return home if home.outstanding <= BOUND * mean + 1 else least


class Autoscaler:
    """Decides, every `interval_s`, how many replicas should serve (see `Autoscale`)."""

    def __init__(self, policy: Autoscale) -> None:
        self.policy = policy
        self._low_since: float | None = None

    def desired(self, now: float, ready: Sequence[Routable], booting: int) -> int:
        """The replica count wanted now: more than ready + booting starts replicas, fewer
        than ready (for `scale_down_after_s`) drains them."""
        p = self.policy
        if not ready:
            return max(p.min_replicas, booting)
        load = sum(r.outstanding if p.metric == "concurrency" else r.num_waiting
                   for r in ready) / len(ready)
        want = min(p.max_replicas, max(p.min_replicas,
                                       math.ceil(len(ready) * load / p.target - 1e-9)))
        if want >= len(ready):
            self._low_since = None
            return max(want, len(ready) + booting)
        if self._low_since is None:
            self._low_since = now
        if now - self._low_since >= p.scale_down_after_s:
            self._low_since = None
            return want
        return len(ready) + booting
