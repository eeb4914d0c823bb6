"""Advice that knows the server: no finding recommends what the server already does, and
the server's own settings are recorded from what it exposes."""

import asyncio
from types import SimpleNamespace

from engine_server import running_server

from latlab.analysis import advice
from latlab.load.target.settings import _info_gauges, _llamacpp, _sglang, server_settings
from latlab.records.config import RunConfig, Target
from latlab.records.server import ServerSettings
from latlab.records.summary import CacheUse


def run(kind: str | None, embedded: bool = False, cache: float | None = None, **told):
    settings = ServerSettings(sources=["/test"], **told) if told else None
    config = RunConfig(target=Target(server_kind=kind, embedded=embedded, settings=settings))
    summary = SimpleNamespace(cache=CacheUse(share=cache, source="per request", cached_tokens=1,
                                             prompt_tokens=1) if cache is not None else None)
    return SimpleNamespace(config=config, summary=summary)


def test_chunked_prefill_already_on_is_advised_as_a_change_of_its_budget():
    on = advice.chunked_prefill(run("latlab", chunked_prefill=True, step_tokens=512))
    assert "is on at 512 tokens" in on and "128" in on and "--max-num-batched-tokens" in on
    assert "turn on" not in on and "if not already" not in on
    off = advice.chunked_prefill(run("vllm", chunked_prefill=False))
    assert off.startswith("turn on chunked prefill") and "--max-num-batched-tokens" in off
    unknown = advice.chunked_prefill(run("openai"))
    assert unknown.endswith("if not already on")
    llama = advice.chunked_prefill(run("llamacpp", max_num_seqs=4))
    assert "--ubatch-size" in llama and "turn on" not in llama


def test_prefix_caching_already_on_says_what_it_served():
    on = advice.prefix_caching(run("sglang", prefix_caching=True, cache=0.4))
    assert "prefix caching is on" in on and "40%" in on and "turn on" not in on
    assert advice.prefix_caching(run("latlab", prefix_caching=False)).startswith(
        "turn on prefix caching")
    assert advice.smaller_batches(run("latlab", max_num_seqs=32)).startswith(
        "smaller decode batches (now 32")


def test_what_each_server_exposes_becomes_the_same_settings():
    sglang = _sglang({"version": "0.5", "server_args": {"chunked_prefill_size": 8192,
                                                        "disable_radix_cache": False,
                                                        "max_running_requests": 128}})
    assert (sglang["chunked_prefill"], sglang["step_tokens"], sglang["prefix_caching"],
            sglang["max_num_seqs"]) == (True, 8192, True, 128)
    llama = _llamacpp({"total_slots": 4, "build_info": "b1",
                       "default_generation_settings": {"params": {"cache_prompt": True}}})
    assert (llama["max_num_seqs"], llama["prefix_caching"]) == (4, True)
    vllm = _info_gauges('# HELP vllm:cache_config_info x\n# TYPE vllm:cache_config_info gauge\n'
                        'vllm:cache_config_info{block_size="16",enable_prefix_caching="True"} 1.0\n')
    assert vllm["prefix_caching"] is True
    assert _sglang({"unrelated": 1}) == {} and _llamacpp({}) == {}


def test_latlab_serve_tells_its_settings():
    with running_server(max_num_batched_tokens=64, enable_prefix_caching=True) as server:
        settings = asyncio.run(server_settings(server.url))
    assert "/server_info" in settings.sources
    assert (settings.chunked_prefill, settings.step_tokens, settings.prefix_caching,
            settings.max_num_seqs) == (True, 64, True, 8)


def test_a_server_that_tells_nothing_is_no_error():
    settings = asyncio.run(server_settings("http://127.0.0.1:9"))  # nothing listens there
    assert not settings.known() and settings.sources == []
