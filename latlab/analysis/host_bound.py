"""A host-bound server: its accelerator waits on the host. The serving process spends a full
core (its Python scheduler, the kernel launches) and each step costs about the same whatever
its tokens, so advice that adds steps (a smaller token budget, smaller batches) only makes it
slower: on an H200 a budget of 128 instead of 512 took TTFT p50 from 38 ms to 2.3 s."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from latlab.analysis.run_analysis import RunAnalysis

FULL_CORE = 0.85  # of one core, on average over the run
ONE_THREAD = 1.3  # cores: more is a multi-threaded engine computing on the CPU
ACCELERATED_SERVERS = ("vllm", "sglang", "tgi")  # servers that run on an accelerator


@dataclass(frozen=True)
class HostBound:
    """Why the server is host-bound, in a few words, and the evidence."""

    summary: str
    evidence: tuple[str, ...]


def host_bound(a: RunAnalysis) -> HostBound | None:
    """The serving process at a full core (and no more: one thread drives the engine) while
    the engine runs on an accelerator; None when the run does not show both (the server's
    process was not found on this host, or it computes on the CPU, where a full core is the
    model's own work)."""
    client = a.client
    host = client.host if client is not None else None
    if host is None or host.server is None:
        return None
    used = host.server.mean
    if not FULL_CORE <= used <= ONE_THREAD:
        return None
    target = a.config.target
    settings = target.settings
    device = settings.device if settings is not None else None
    kind = str(target.server_kind) if target.server_kind is not None else None
    if device is not None:
        if device == "cpu":
            return None
        on = f"the engine runs on {device}"
    elif kind in ACCELERATED_SERVERS:
        on = f"{kind} runs on an accelerator"
    else:
        return None
    return HostBound(summary=f"its process at {100 * used:.0f}% of one core",
                     evidence=(f"the serving process used {used:.2f} cores on average (at most "
                               f"{host.server.max:.2f}) and {on}: the host, not the "
                               "accelerator, sets the step time",))
