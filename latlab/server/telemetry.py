"""Prometheus metrics of `latlab serve` (names follow vLLM's where there is one)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from latlab.engine.outputs import EngineStats
from latlab.engine.sequence import StageTimes

if TYPE_CHECKING:
    from latlab.server.tracing import RequestTracer

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5,
                   0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
PREFIX = "latlab"
FINISHED_KEPT = 256  # finished requests the finish rate is measured over

disable_created_metrics()  # no `_created` series: they double the page and nobody reads them


class _EngineCollector(Collector):
    """Gauges and counters read from the engine's latest stats at scrape time."""

    def __init__(self, stats: Callable[[], EngineStats], settings: dict[str, Any]) -> None:
        self._stats = stats
        self._settings = {k: str(v) for k, v in settings.items() if v is not None}

    def collect(self) -> Iterator[Metric]:
        yield InfoMetricFamily(f"{PREFIX}_engine_config", "The engine's settings.",
                               value=self._settings)
        s = self._stats()
        yield GaugeMetricFamily(f"{PREFIX}_num_requests_running",
                                "Requests in the running batch.", value=s.num_running)
        yield GaugeMetricFamily(f"{PREFIX}_num_requests_waiting",
                                "Requests waiting to be scheduled.", value=s.num_waiting)
        yield GaugeMetricFamily(f"{PREFIX}_kv_cache_usage_perc",
                                "Fraction of KV-cache blocks in use (0-1).", value=s.kv_usage)
        yield GaugeMetricFamily(f"{PREFIX}_kv_cache_used_blocks",
                                "KV-cache blocks held by requests.",
                                value=s.num_blocks - s.num_free_blocks)
        yield CounterMetricFamily(f"{PREFIX}_num_preemptions",
                                  "Requests preempted for lack of KV blocks.",
                                  value=s.num_preemptions)
        yield CounterMetricFamily(f"{PREFIX}_engine_steps", "Engine steps run.",
                                  value=s.num_steps)
        yield CounterMetricFamily(f"{PREFIX}_prefix_cache_queries", "Prompt tokens looked up "
                                  "in the prefix cache.", value=s.prefix_cache_queries)
        yield CounterMetricFamily(f"{PREFIX}_prefix_cache_hits", "Prompt tokens found in the "
                                  "prefix cache (prefill skipped).", value=s.prefix_cache_hits)
        yield CounterMetricFamily(f"{PREFIX}_spec_decode_num_draft_tokens", "Speculative "
                                  "tokens proposed and verified.", value=s.num_draft_tokens)
        yield CounterMetricFamily(f"{PREFIX}_spec_decode_num_accepted_tokens", "Speculative "
                                  "tokens accepted.", value=s.num_accepted_tokens)
        yield GaugeMetricFamily(f"{PREFIX}_model_loaded", "1 while the model is loaded, 0 "
                                "after --idle-unload unloaded it.", value=int(s.model_loaded))
        yield CounterMetricFamily(f"{PREFIX}_model_loads", "Reloads of the model after an "
                                  "unload (cold starts).", value=s.num_model_loads)
        if s.last_load_s is not None:
            yield GaugeMetricFamily(f"{PREFIX}_model_load_seconds", "Duration of the latest "
                                    "reload.", value=s.last_load_s)


class Telemetry:
    """The Prometheus metrics, and the per-request trace when one is kept."""

    def __init__(self, stats: Callable[[], EngineStats], tracer: RequestTracer | None = None,
                 settings: dict[str, Any] | None = None) -> None:
        self.tracer = tracer
        self.registry = CollectorRegistry()

        def histogram(name: str, doc: str) -> Histogram:
            return Histogram(f"{PREFIX}_{name}_seconds", doc, buckets=LATENCY_BUCKETS,
                             registry=self.registry)

        self.ttft = histogram("time_to_first_token", "Receipt to first token computed.")
        self.itl = histogram("inter_token_latency", "Gap between consecutive tokens computed.")
        self.e2e = histogram("e2e_request_latency", "Receipt to response complete.")
        self.queue = histogram("request_queue_time", "Enqueued to first scheduled.")
        self.prefill = histogram("request_prefill_time", "First scheduled to first token.")
        self.decode = histogram("request_decode_time", "First token to last token.")
        self.prompt_tokens = Counter(f"{PREFIX}_prompt_tokens", "Prompt tokens of finished "
                                     "requests.", registry=self.registry)
        self.generation_tokens = Counter(f"{PREFIX}_generation_tokens", "Tokens generated.",
                                         registry=self.registry)
        self.requests = Counter(f"{PREFIX}_requests", "Requests by outcome: stop, length, "
                                "abort, rejected (429), invalid (4xx), error (500), "
                                "unavailable (503), queue_timeout (503 after --max-queue-delay).",
                                ["outcome"], registry=self.registry)
        self.spec_acceptance = Histogram(
            f"{PREFIX}_request_spec_decode_acceptance_rate", "Per request: speculative tokens "
            "accepted / proposed.", buckets=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0),
            registry=self.registry)
        self.registry.register(_EngineCollector(stats, settings or {}))
        self.finished: deque[float] = deque(maxlen=FINISHED_KEPT)  # monotonic, latest last

    def finish_rate(self) -> float | None:
        """Requests finished per second lately: over the latest `FINISHED_KEPT`, up to now
        (so a stalled engine's rate falls); None before any has finished."""
        if not self.finished:
            return None
        return len(self.finished) / max(time.monotonic() - self.finished[0], 1e-3)

    def observe_request(self, request_id: str, times: StageTimes, prompt_tokens: int,
                        completion_tokens: int, outcome: str,
                        drafts: tuple[int, int] = (0, 0)) -> None:
        """Record a request that reached the engine, when its response is complete;
        `drafts` is (accepted, proposed) speculative tokens."""
        if drafts[1]:
            self.spec_acceptance.observe(drafts[0] / drafts[1])
        for histogram, start, end in (
            (self.ttft, times.received, times.first_token),
            (self.e2e, times.received, times.completed),
            (self.queue, times.enqueued, times.first_scheduled),
            (self.prefill, times.first_scheduled, times.first_token),
            (self.decode, times.first_token, times.last_token),
        ):
            if start is not None and end is not None:
                histogram.observe((end - start) / 1e9)
        self.finished.append(time.monotonic())
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(completion_tokens)
        self.requests.labels(outcome).inc()
        if self.tracer is not None:
            self.tracer.record(request_id, times, prompt_tokens, completion_tokens, outcome)

    def render(self) -> bytes:
        return generate_latest(self.registry)
