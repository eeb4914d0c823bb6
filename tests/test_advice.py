"""Advice that knows the server: no finding recommends what the server already does or what
the run's own data rules out, each server gets its own flag, a host-bound server is not told
to take more steps, and the server's own settings are recorded from what it exposes."""

import asyncio
from types import SimpleNamespace

from engine_server import running_server

from latlab.analysis import advice
from latlab.analysis.findings import Change
from latlab.load.target.settings import _info_gauges, _llamacpp, _sglang, _tgi, server_settings
from latlab.records.bench import BenchConfig
from latlab.records.config import RunConfig, Target
from latlab.records.server import ServerSettings
from latlab.records.summary import CacheUse, HostLoad, Usage


def run(kind: str | None, embedded: bool = False, cache: float | None = None,
        prefix_tokens: int = 256, server_cores: float | None = None, in_flight: float = 64,
        launch: str | None = None, serve_args: str = "", **told):
    settings = ServerSettings(sources=["/test"], **told) if told else None
    bench = BenchConfig(url="http://127.0.0.1:8000", workload={"prefix_tokens": prefix_tokens},
                        serve_args=serve_args)
    config = RunConfig(bench=bench, target=Target(server_kind=kind, embedded=embedded,
                                                  settings=settings, launch=launch))
    summary = SimpleNamespace(cache=CacheUse(share=cache, source="per request", cached_tokens=1,
                                             prompt_tokens=1) if cache is not None else None,
                              throughput=SimpleNamespace(mean_concurrency=in_flight))
    host = None
    if server_cores is not None:
        usage = Usage(mean=server_cores, max=server_cores + 0.1)
        host = HostLoad(cpus=2, seconds=30, busy=usage, client=Usage(mean=0.2, max=0.3),
                        server=usage, other=Usage(mean=0, max=0))
    return SimpleNamespace(config=config, summary=summary,
                           client=SimpleNamespace(host=host) if host else None)


def test_chunked_prefill_already_on_is_advised_as_a_change_of_its_budget():
    on = advice.chunked_prefill(run("latlab", chunked_prefill=True, step_tokens=512))
    assert "is on at 512 tokens" in on.text and "--max-num-batched-tokens 128" in on.text
    assert on.change == Change("step_tokens", 128, "latlab", "--max-num-batched-tokens 128")
    off = advice.chunked_prefill(run("vllm", chunked_prefill=False))
    assert off.text.startswith("turn on chunked prefill") and "--max-num-batched-tokens" in off.text
    unknown = advice.chunked_prefill(run("openai"))
    assert unknown.text.endswith("if not already on") and unknown.change is None
    assert advice.chunked_prefill(run("latlab", chunked_prefill=True, step_tokens=16)) is None


def test_llamacpp_stalls_are_fixed_with_the_batch_not_the_ubatch():
    llama = advice.chunked_prefill(run("llamacpp", max_num_seqs=4))  # its default -b 2048
    assert llama.change.args == "-b 512 -ub 512" and "-b 512 -ub 512" in llama.text
    assert "-ub alone" in llama.text and "turn on" not in llama.text
    told = advice.chunked_prefill(run("llamacpp", step_tokens=512))
    assert told.change.args == "-b 128 -ub 128"
    # /props does not tell -b: the command latlab launched it with does (either spelling)
    template = "llama-server -m M --port {port} --batch-size=1024 {args}"
    launched = advice.chunked_prefill(run("llamacpp", launch=template))
    assert launched.change.args == "-b 256 -ub 256"
    assert advice.chunked_prefill(run("llamacpp", launch=template, serve_args="-np 4 -b 256")
                                  ).change.args == "-b 64 -ub 64"  # the side's {args} last


def test_advice_in_effect_or_contradicted_by_the_run_is_not_given():
    assert advice.prefix_caching(run("sglang", prefix_caching=True)) is None
    assert advice.prefix_caching(run("vllm")) is None  # on by default
    assert advice.prefix_caching(run("llamacpp")) is None  # cache_prompt is on by default
    # the run's prompt tokens came from the cache: it is on, whatever the server said
    assert advice.prefix_caching(run("openai", cache=0.089)) is None
    # prompts that share nothing: caching cannot help
    assert advice.prefix_caching(run("latlab", prefix_caching=False, prefix_tokens=0)) is None
    off = advice.prefix_caching(run("latlab", prefix_caching=False))
    assert off.text.startswith("turn on prefix caching") and off.change.args == \
        "--enable-prefix-caching"
    assert advice.prefix_caching(run("openai")).text.endswith("if not already on")
    fewer = advice.smaller_batches(run("latlab", max_num_seqs=32))
    assert fewer.change.args == "--max-num-seqs 16" and "now 32" in fewer.text
    assert advice.smaller_batches(run("latlab", max_num_seqs=1)) is None
    # 4 requests in flight never filled a batch of 32: halving the cap changes nothing
    assert advice.smaller_batches(run("latlab", max_num_seqs=32, in_flight=4)) is None
    text, tries = advice.joined("shorter prompts", None, fewer)
    assert text == f"shorter prompts; {fewer.text}" and tries[1] == fewer


def test_each_server_gets_its_own_flag():
    flags = {kind: advice.smaller_batches(run(kind, max_num_seqs=8)).text
             for kind in ("latlab", "vllm", "sglang", "llamacpp", "tgi", "ollama")}
    assert "--max-num-seqs 4" in flags["latlab"] and "--max-num-seqs 4" in flags["vllm"]
    assert "--max-running-requests 4" in flags["sglang"] and "-np 4" in flags["llamacpp"]
    assert "--max-batch-size 4" in flags["tgi"] and "OLLAMA_NUM_PARALLEL=4" in flags["ollama"]
    # an environment variable is no option `latlab ab` can pass
    assert advice.smaller_batches(run("ollama", max_num_seqs=8)).change is None
    tgi = advice.chunked_prefill(run("tgi", chunked_prefill=True, step_tokens=4096))
    assert tgi.change.args == "--max-batch-prefill-tokens 1024"


def test_a_host_bound_server_is_not_told_to_take_more_steps():
    gpu = run("latlab", chunked_prefill=True, step_tokens=512, device="cuda", server_cores=1.0)
    said = advice.chunked_prefill(gpu)
    assert "host-bound" in said.text and "100% of one core" in said.text
    assert said.change is None and advice.smaller_batches(gpu) is None
    # the same full core on the CPU is the model's own work: the budget advice stands
    cpu = run("latlab", chunked_prefill=True, step_tokens=512, device="cpu", server_cores=1.0)
    assert advice.chunked_prefill(cpu).change.value == 128
    # an engine spread over several cores computes on them
    many = run("vllm", chunked_prefill=True, step_tokens=512, server_cores=3.5)
    assert "host-bound" not in advice.chunked_prefill(many).text
    assert "host-bound" in advice.chunked_prefill(run("vllm", server_cores=0.95)).text


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
                        'vllm:cache_config_info{block_size="16",'
                        'enable_prefix_caching="True"} 1.0\n')
    assert vllm["prefix_caching"] is True
    tgi = _tgi({"model_id": "m", "max_concurrent_requests": 128, "max_batch_size": 8,
                "max_batch_prefill_tokens": 4096, "model_device_type": "cuda"})
    assert (tgi["max_num_seqs"], tgi["step_tokens"], tgi["device"]) == (8, 4096, "cuda")
    assert _sglang({"unrelated": 1}) == {} and _llamacpp({}) == {} and _tgi({"id": 1}) == {}


def test_latlab_serve_tells_its_settings():
    with running_server(max_num_batched_tokens=64, enable_prefix_caching=True) as server:
        settings = asyncio.run(server_settings(server.url))
    assert "/server_info" in settings.sources
    assert (settings.chunked_prefill, settings.step_tokens, settings.prefix_caching,
            settings.max_num_seqs, settings.device) == (True, 64, True, 8, "cpu")


def test_a_server_that_tells_nothing_is_no_error():
    settings = asyncio.run(server_settings("http://127.0.0.1:9"))  # nothing listens there
    assert not settings.known() and settings.sources == []
