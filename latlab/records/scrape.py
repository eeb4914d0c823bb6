"""The target's load context during a run: its Prometheus /metrics scraped at intervals
(`metrics.jsonl`, one scrape a line, appended as it is taken)."""

from __future__ import annotations

from pydantic import BaseModel

METRICS = "metrics.jsonl"
STAGES = ("queue", "prefill", "decode", "inference", "ttft", "e2e")  # histograms: _sum, _count
SERIES = ("running", "waiting", "kv_usage", "preemptions", "prefix_cache_queries",
          "prefix_cache_hits", "spec_draft_tokens", "spec_accepted_tokens",
          *(f"{stage}_{part}" for stage in STAGES for part in ("sum", "count")),
          "prompt_tokens", "generation_tokens")


class Scrape(BaseModel):
    """One scrape: when (the client's monotonic clock), the series latlab reads by name
    whatever the server calls them (`SERIES`), and every other unlabelled sample as is."""

    t_ns: int
    values: dict[str, float] = {}
    raw: dict[str, float] = {}
