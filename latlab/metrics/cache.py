"""The share of prompt tokens the server took from its prefix cache, from whatever it tells:
per request (usage `cached_tokens` / `prompt_tokens_details`, llama.cpp's `timings.cache_n`,
a span's `gen_ai.usage.cached_tokens`, SGLang's `cached_tokens`) or, when no request says,
the growth of its prefix-cache counters over the run (vLLM's `vllm:prefix_cache_hits` and
`vllm:prefix_cache_queries`, latlab's own; scraped when the load starts and when it ends)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from latlab.records.scrape import Scrape
from latlab.records.summary import CacheUse
from latlab.records.table import RequestTable


def cache_use(t: RequestTable, rows: np.ndarray, scrapes: Sequence[Scrape] = ()
              ) -> CacheUse | None:
    """The cache's share of the prompt tokens of the requests `rows` (a mask), or of the
    whole run by the counters; None when the server tells neither."""
    told = rows & ~np.isnan(t.cached_tokens) & (np.nan_to_num(t.prompt_tokens) > 0)
    if told.any():
        cached, prompts = float(t.cached_tokens[told].sum()), float(t.prompt_tokens[told].sum())
        return CacheUse(share=cached / prompts, source="per request", requests=int(told.sum()),
                        cached_tokens=cached, prompt_tokens=prompts)
    counted = [s for s in scrapes if {"prefix_cache_hits", "prefix_cache_queries"} <= set(s.values)]
    if len(counted) < 2:
        return None
    hits = counted[-1].values["prefix_cache_hits"] - counted[0].values["prefix_cache_hits"]
    queries = (counted[-1].values["prefix_cache_queries"]
               - counted[0].values["prefix_cache_queries"])
    if queries <= 0:
        return None
    return CacheUse(share=hits / queries, source="server counters (the whole run)",
                    cached_tokens=hits, prompt_tokens=queries)
