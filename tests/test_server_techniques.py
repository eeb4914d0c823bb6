"""The latency techniques as `latlab serve` shows them: usage, refusals, metrics, health."""

from __future__ import annotations

import gc
import threading
import time

import httpx
import orjson
from engine_server import running_server
from processes import wait_until
from prometheus_client.parser import text_string_to_metric_families


def metrics(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics").text
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if not s.labels}


def stream_usage(url: str, body: dict) -> dict:
    """The final usage event of a streamed completion."""
    body = {"stream": True, "stream_options": {"include_usage": True}, **body}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        events = [orjson.loads(line[6:]) for line in r.iter_lines()
                  if line.startswith("data: {")]
    return events[-1]["usage"]


def test_prefix_caching_reports_cached_tokens_in_usage_and_metrics():
    with running_server(enable_prefix_caching=True) as s:
        body = {"prompt": list(range(10, 60)), "max_tokens": 3, "temperature": 0,
                "ignore_eos": True}
        assert stream_usage(s.url, body)["prompt_tokens_details"]["cached_tokens"] == 0
        again = httpx.post(s.url + "/v1/completions", json=body).json()["usage"]
        assert again["prompt_tokens_details"]["cached_tokens"] == 48   # 6 blocks of 8
        m = metrics(s.url)
        assert m["latlab_prefix_cache_queries_total"] == 100
        assert m["latlab_prefix_cache_hits_total"] == 48


def test_speculative_decoding_reports_accepted_and_rejected_drafts():
    with running_server(speculative_method="draft", speculative_model="tiny") as s:
        usage = stream_usage(s.url, {"prompt": "def main(", "max_tokens": 20, "temperature": 0,
                                     "ignore_eos": True})
        details = usage["completion_tokens_details"]
        assert details["accepted_prediction_tokens"] > 0
        assert details["rejected_prediction_tokens"] == 0     # the draft is the model itself
        m = metrics(s.url)
        assert m["latlab_spec_decode_num_accepted_tokens_total"] == \
            details["accepted_prediction_tokens"]
        assert m["latlab_request_spec_decode_acceptance_rate_count"] == 1
        plain = httpx.post(s.url + "/v1/completions", json={
            "prompt": "x", "max_tokens": 3, "temperature": 1.0}).json()["usage"]
        assert plain.get("completion_tokens_details") is None   # sampled: no drafts


def test_a_request_waiting_past_max_queue_delay_gets_503_with_retry_after():
    with running_server(max_num_seqs=1, max_queue_delay=0.1) as s:
        runner = s.engine.core.engine.runner
        execute = runner.execute

        # every step takes 0.2 s: the queue backs up, and the first request (17 steps) still
        # runs when both refusals (each at the step after 0.1 s of waiting) have come back
        def slow_execute(scheduled):
            time.sleep(0.2)
            return execute(scheduled)

        runner.execute = slow_execute
        first: dict = {}
        busy = threading.Thread(target=lambda: first.update(httpx.post(
            s.url + "/v1/completions", timeout=60,
            json={"prompt": "a", "max_tokens": 16, "ignore_eos": True}).json()))
        busy.start()
        wait_until(lambda: s.engine.stats.num_running == 1, what="the first request to run")
        for stream in (False, True):
            r = httpx.post(s.url + "/v1/completions", timeout=60, json={
                "prompt": "b", "max_tokens": 2, "stream": stream})
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] == "queue_timeout"
            assert int(r.headers["retry-after"]) >= 1
        busy.join(timeout=60)
        assert first["usage"]["completion_tokens"] == 16      # the running one is unharmed
        runner.execute = execute
        ok = httpx.post(s.url + "/v1/completions", timeout=60, json={
            "prompt": "c", "max_tokens": 2, "stream": True})
        assert ok.status_code == 200 and "[DONE]" in ok.text
        text = httpx.get(s.url + "/metrics").text
        assert 'latlab_requests_total{outcome="queue_timeout"} 2.0' in text


def test_idle_unload_scales_to_zero_and_the_next_request_reloads():
    with running_server(idle_unload=2.0) as s:  # long enough to be seen loaded first
        assert httpx.get(s.url + "/health").json()["model_loaded"] is True
        assert gc.get_freeze_count() > 0    # the loaded model is out of the collector's reach
        wait_until(lambda: httpx.get(s.url + "/health").json()["model_loaded"] is False,
                   what="the model to be unloaded")
        assert metrics(s.url)["latlab_model_loaded"] == 0
        assert gc.get_freeze_count() == 0   # unfrozen, so unloading could collect it
        r = httpx.post(s.url + "/v1/completions", timeout=60,
                       json={"prompt": "x", "max_tokens": 2})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
        assert gc.get_freeze_count() > 0    # frozen again once it loaded
        m = metrics(s.url)
        assert m["latlab_model_loads_total"] == 1 and m["latlab_model_load_seconds"] > 0


def test_the_tenant_comes_from_the_header_else_the_user_field():
    with running_server(fair_share=True) as s:
        seen = []
        add = s.engine.core.engine.add_request

        def spy(*args, **kwargs):
            seen.append(kwargs["tenant"])
            return add(*args, **kwargs)

        s.engine.core.engine.add_request = spy
        body = {"prompt": "x", "max_tokens": 1, "user": "alice"}
        httpx.post(s.url + "/v1/completions", json=body)
        httpx.post(s.url + "/v1/completions", json=body, headers={"X-Tenant-Id": "acme"})
        assert seen == ["alice", "acme"]
