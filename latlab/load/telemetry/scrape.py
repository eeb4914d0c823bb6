"""Poll the target's Prometheus /metrics during a run, in a thread, parsing with
prometheus-client's parser, and append each scrape to metrics.jsonl as it is taken.

The series latlab reads are named differently by every server; `NAMES` maps them:

| series | vLLM | SGLang | TGI | llama.cpp | latlab |
|---|---|---|---|---|---|
| running | `vllm:num_requests_running` | `sglang:num_running_reqs` | `tgi_batch_current_size` | `llamacpp:requests_processing` | `latlab_num_requests_running` |
| waiting | `vllm:num_requests_waiting` | `sglang:num_queue_reqs` | `tgi_queue_size` | `llamacpp:requests_deferred` | `latlab_num_requests_waiting` |
| kv_usage | `vllm:kv_cache_usage_perc` (`gpu_cache_usage_perc`) | `sglang:token_usage` | | `llamacpp:kv_cache_usage_ratio` | `latlab_kv_cache_usage_perc` |
| preemptions | `vllm:num_preemptions_total` | | | | `latlab_num_preemptions_total` |

and the counters an A/B explains its change with (vLLM's and latlab's names): prefix-cache
queries and hits (tokens), speculative draft and accepted tokens. The server's per-request
histograms (seconds) are kept as their `_sum` and `_count`, by stage (`STAGE_HISTOGRAMS`:
vLLM's `vllm:e2e_request_latency_seconds`, `request_queue_time_seconds`,
`request_prefill_time_seconds`, `request_decode_time_seconds`,
`request_inference_time_seconds`, `time_to_first_token_seconds`; SGLang's and latlab's of the
same meaning), with its prompt and generation token counters: the run's server view
(`analysis.server_view`) compares them with the client's records.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from pathlib import Path
from ssl import SSLContext

import orjson
from prometheus_client.parser import text_string_to_metric_families

from latlab.records.scrape import Scrape

NAMES = {
    "running": ("vllm:num_requests_running", "sglang:num_running_reqs", "tgi_batch_current_size",
                "llamacpp:requests_processing", "latlab_num_requests_running"),
    "waiting": ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "tgi_queue_size",
                "llamacpp:requests_deferred", "latlab_num_requests_waiting"),
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage",
                 "llamacpp:kv_cache_usage_ratio", "latlab_kv_cache_usage_perc"),
    "preemptions": ("vllm:num_preemptions_total", "vllm:num_preemptions",
                    "latlab_num_preemptions_total", "latlab_num_preemptions"),
    "prefix_cache_queries": ("vllm:prefix_cache_queries_total",
                             "latlab_prefix_cache_queries_total"),
    "prefix_cache_hits": ("vllm:prefix_cache_hits_total", "latlab_prefix_cache_hits_total"),
    "spec_draft_tokens": ("vllm:spec_decode_num_draft_tokens_total",
                          "latlab_spec_decode_num_draft_tokens_total"),
    "spec_accepted_tokens": ("vllm:spec_decode_num_accepted_tokens_total",
                             "latlab_spec_decode_num_accepted_tokens_total"),
}
STAGE_HISTOGRAMS = {
    "e2e": ("vllm:e2e_request_latency_seconds", "sglang:e2e_request_latency_seconds",
            "latlab_e2e_request_latency_seconds"),
    "queue": ("vllm:request_queue_time_seconds", "sglang:queue_time_seconds",
              "latlab_request_queue_time_seconds"),
    "prefill": ("vllm:request_prefill_time_seconds", "latlab_request_prefill_time_seconds"),
    "decode": ("vllm:request_decode_time_seconds", "latlab_request_decode_time_seconds"),
    "inference": ("vllm:request_inference_time_seconds",),
    "ttft": ("vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds",
             "latlab_time_to_first_token_seconds"),
}
NAMES |= {f"{stage}_{part}": tuple(f"{name}_{part}" for name in names)
          for stage, names in STAGE_HISTOGRAMS.items() for part in ("sum", "count")}
NAMES |= {
    "prompt_tokens": ("vllm:prompt_tokens_total", "sglang:prompt_tokens_total",
                      "latlab_prompt_tokens_total", "llamacpp:prompt_tokens_total"),
    "generation_tokens": ("vllm:generation_tokens_total", "sglang:generation_tokens_total",
                          "latlab_generation_tokens_total", "llamacpp:tokens_predicted_total"),
}
MAX_BYTES = 16 << 20  # of one scrape: a server cannot take the client's memory
TIMEOUT_S = 2.0


def parse(text: str, t_ns: int) -> Scrape:
    """One scrape of Prometheus text: the known series and every unlabelled sample."""
    raw: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.labels or set(sample.labels) <= {"model_name", "engine"}:
                raw[sample.name] = raw.get(sample.name, 0.0) + float(sample.value)
    values = {series: next(raw[n] for n in names if n in raw)
              for series, names in NAMES.items() if any(n in raw for n in names)}
    return Scrape(t_ns=t_ns, values=values, raw=raw)


def scrape_once(url: str, headers: dict[str, str] | None = None,
                tls: SSLContext | None = None) -> Scrape:
    """GET `url` (a /metrics endpoint) and parse it; raises on any failure."""
    t = time.perf_counter_ns()
    request = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(request, timeout=TIMEOUT_S, context=tls) as resp:
        body = resp.read(MAX_BYTES + 1)
    if len(body) > MAX_BYTES:
        raise ValueError(f"{url} answered more than {MAX_BYTES >> 20} MiB")
    return parse(body.decode("utf-8", "replace"), t)


class Scraper:
    """Scrapes `url` when the load starts, every `interval_s` during it (None: not between)
    and when it ends: the counters' growth over the run, and the time series when asked for.
    Failures are counted, not fatal."""

    def __init__(self, url: str, path: Path, interval_s: float | None,
                 headers: dict[str, str] | None = None, tls: SSLContext | None = None) -> None:
        self.url, self.path, self.interval_s, self.tls = url, path, interval_s, tls
        self.headers = headers or {}
        self.count = self.failures = 0
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="latlab-scrape")

    def __enter__(self) -> Scraper:
        if self.interval_s is not None:
            self._thread.start()
        else:
            self._scrape()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.interval_s is not None:
            self._stop.set()
            self._thread.join(TIMEOUT_S + 1)
        self._scrape()

    def _run(self) -> None:
        while not self._stop.is_set():
            due = time.monotonic() + self.interval_s
            self._scrape()
            self._stop.wait(max(0.0, due - time.monotonic()))

    def _scrape(self) -> None:
        try:
            scrape = scrape_once(self.url, self.headers, self.tls)
        except Exception as e:  # noqa: BLE001 - a missed scrape is a gap, not a failed run
            self.failures += 1
            self.last_error = f"{type(e).__name__}: {e}"
            return
        with open(self.path, "ab") as f:  # one write a line: a reader never sees half
            f.write(orjson.dumps(scrape.model_dump()) + b"\n")
        self.count += 1
