"""How two compared runs differ beyond the setting compared: the workload settings that
differ, the prefix cache serving their prompts unlike, one side through a gateway the other
went without, a side's streams in bursts (a buffering proxy's: their gaps are not the
server's)."""

from __future__ import annotations

from typing import Any

from latlab.analysis.delivery import Bursts
from latlab.analysis.run_analysis import RunAnalysis
from latlab.records.config import RunConfig

# Workload settings that may differ between comparable runs: where the load goes, not what.
NOT_WORKLOAD = {"url", "model", "api_key", "serve_args", "out", "name", "tags", "workers",
                "timeout_s", "drain_s", "slos", "seed", "tokenizer", "keepalive", "server_kind",
                "otlp_port", "span_wait_s", "scrape_interval_s", "prompt_salt",
                "context_tokens", "api_key_file", "headers", "ca_cert", "insecure",
                "server_url"}


def buffered(burst: tuple[Bursts | None, Bursts | None]) -> str | None:
    """Which side's streams came in bursts (`delivery.bursts`), if either's did."""
    found = [side for side, came in zip("AB", burst) if came is not None]
    if not found:
        return None
    return f"{' and '.join(found)}'s streams arrived in bursts (a buffering proxy?)"


def workload_differences(a: RunConfig, b: RunConfig) -> list[str]:
    """The workload settings (what was sent, how, for how long) that differ between runs."""
    flat_a, flat_b = (_flatten(c.bench.model_dump(mode="json") if c.bench else {})
                      for c in (a, b))
    differences = []
    for key in sorted(flat_a.keys() | flat_b.keys()):
        if NOT_WORKLOAD.intersection(key.split(".")):
            continue
        shown = _shown(flat_a.get(key)), _shown(flat_b.get(key))
        if shown[0] != shown[1]:  # one float's last bits are no other workload
            differences.append(f"{key}: {shown[0]} vs {shown[1]}")
    return differences


def _shown(value: Any) -> str:
    """A setting as a user wrote it: a derived float's binary noise (0.15000000000000002)
    rounded away."""
    return repr(round(value, 9) if isinstance(value, float) else value)


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat |= _flatten(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


CACHE_DIFFERENCE = 0.05  # of prompt tokens: sides whose caches served more differently


def conditions(a: RunAnalysis, b: RunAnalysis,
               burst: tuple[Bursts | None, Bursts | None]) -> list[str]:
    """How the two sides ran unlike each other beyond their settings: the server's prefix
    cache serving different shares of their prompts; one side through a gateway the other
    went without (or through another); a side's streams in bursts (`burst`)."""
    out = []
    ca, cb = a.summary.cache, b.summary.cache
    if ca is not None and cb is not None and abs(ca.share - cb.share) >= CACHE_DIFFERENCE:
        out.append(f"the prefix cache served {100 * ca.share:.0f}% of A's prompt tokens and "
                   f"{100 * cb.share:.0f}% of B's: a TTFT change may be the cache's")
    through = [g.name if g is not None else "no gateway"
               for g in (a.config.target.gateway, b.config.target.gateway)]
    if through[0] != through[1]:
        out.append(f"A went through {through[0]}, B through {through[1]}: the gateway's hop "
                   "is part of the change")
    for side, came in zip("AB", burst):
        if came is not None:
            out.append(f"{side}: {came.line()}; the metrics timed by those gaps are not "
                       "compared")
    return out
