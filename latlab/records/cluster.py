"""Where a distributed run's load came from (`latlab bench --ray`): the Ray cluster, its nodes
and each node's clock against the driver's, in `config.json` → `ray`."""

from __future__ import annotations

from pydantic import BaseModel


class NodeClock(BaseModel):
    """One node that ran workers, and its monotonic clock against the driver's.

    `offset_ns` is the node's clock minus the driver's, estimated before the run from the
    round trip with the smallest delay (Cristian's method): the true offset lies within
    `offset_ns ± uncertainty_ns` (half that round trip). `offset_after_ns` is the same
    estimate after the run; the difference is the drift the run's records may carry."""

    node: str
    node_id: str
    host: str
    workers: list[int]
    offset_ns: int
    uncertainty_ns: int
    offset_after_ns: int | None = None
    uncertainty_after_ns: int | None = None
    lost: bool = False  # the node (or its worker) died during the run


class RayCluster(BaseModel):
    """The cluster a `--ray` run used: the address asked for, whether latlab started it
    itself (a local one), and the nodes that ran workers."""

    address: str
    started: bool = False
    nodes: list[NodeClock] = []
