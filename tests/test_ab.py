"""latlab ab: the identical workload against two settings, alternated over rounds, pooled
per side and compared; the server counters that explain the change."""

import json

import pytest
from sse_server import DONE, Server, Step, caching, completion, stream, usage_only
from typer.testing import CliRunner

from latlab.analysis.ab import counter_deltas, explain, pooled_throughput
from latlab.cli import app
from latlab.records.scrape import Scrape
from latlab.records.summary import Throughput
from latlab.store import RunStore
from latlab.tokenizer import Tokenizer


def answer(first_token_s: float):
    return stream([Step(first_token_s, completion("a")), Step(0.002, completion("b")),
                   Step(0, usage_only(16, 2)), Step(0, DONE)])


def counters(server: Server) -> str:
    """A prefix cache that hits half of each request's 16 prompt tokens."""
    n = len(server.received)
    return (f"# TYPE latlab_prefix_cache_queries counter\nlatlab_prefix_cache_queries_total "
            f"{16 * n}\n# TYPE latlab_prefix_cache_hits counter\n"
            f"latlab_prefix_cache_hits_total {8 * n}\n")


def test_ab_alternates_the_sides_on_the_same_workload_and_finds_the_slower(tmp_path):
    with Server(answer(0.002), metrics=counters) as fast, Server(answer(0.500)) as slow:
        result = CliRunner().invoke(app, [
            "ab", "--a", fast.url, "--b", slow.url, "--requests", "12", "--users", "2",
            "--rounds", "3", "--max-rounds", "3", "--warmup-rounds", "1", "--prompt-tokens",
            "16", "--output-tokens", "2", "--out", str(tmp_path), "--json"])
        prompts = [[r["body"]["prompt"] for r in s.received] for s in (fast, slow)]
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert [(r["side"], r["round"]) for r in record["rounds"]] == [
        ("A", 0), ("B", 0),  # a warm-up round each, left out
        ("A", 1), ("B", 1), ("B", 2), ("A", 2), ("A", 3), ("B", 3)]  # ABBA: order cancels out
    # identical workloads, fresh words in every round of each side: no cache can hold them
    tokens = Tokenizer.load(None)
    assert sorted(len(tokens.encode(p)) for p in prompts[0]) == sorted(
        len(tokens.encode(p)) for p in prompts[1])
    assert len(set(prompts[0] + prompts[1])) == 96
    ttft = next(c for c in record["changes"] if c["key"] == "p50_ttft")
    # B's server waits 498 ms longer for the first token: hundreds of times A's, which a
    # busy spell slowing a round by a few hundred ms does not hide on the log scale; a busy
    # machine delays both sides, so the bound on the far side is loose (a unit error would
    # be off by 1000x)
    assert ttft["verdict"] == "worse" and 400 < ttft["b"] - ttft["a"] < 900, ttft
    assert ttft["low"] > 1 and ttft["decided_at"] == 3 and record["looks"]
    assert record["counters"]["A"]["prefix-cache hit rate"] == pytest.approx(0.5)
    assert record["counters"]["B"] == {}  # no /metrics: nothing to explain with
    with RunStore(tmp_path) as store:
        tags = sorted(tag for run in store.list() for tag in run.tags)
    assert tags == ["ab:A"] * 4 + ["ab:B"] * 4


def test_bad_ab_options_are_usage_errors(tmp_path):
    cli = CliRunner()
    missing = cli.invoke(app, ["ab", "--a", "--model tiny"])
    assert missing.exit_code == 2 and "--b" in missing.output
    rounds = cli.invoke(app, ["ab", "--a", "http://127.0.0.1:1", "--b", "http://127.0.0.1:2",
                              "--rounds", "0", "--out", str(tmp_path)])
    assert rounds.exit_code == 2 and "--rounds 0" in rounds.output
    most = cli.invoke(app, ["ab", "--a", "http://127.0.0.1:1", "--b", "http://127.0.0.1:2",
                            "--rounds", "4", "--max-rounds", "2", "--out", str(tmp_path)])
    assert most.exit_code == 2 and "--max-rounds 2 is below --rounds 4" in most.output
    from latlab.records.ab import ABConfig
    assert ABConfig(a="", b="", rounds=12).most_rounds == 12  # not refused: 10 is a default
    assert ABConfig(a="", b="").most_rounds == 10


def test_rounds_pool_their_rates_by_window():
    def rates(window_s: float, achieved: float) -> Throughput:
        return Throughput(window_s=window_s, offered_rate=None, sent_rate=None,
                          achieved_rate=achieved, output_tokens_per_s=10 * achieved,
                          total_tokens_per_s=20 * achieved, mean_concurrency=2.0,
                          backlog_growth=1, fell_behind=False)
    pooled = pooled_throughput([rates(10.0, 4.0), rates(30.0, 8.0)])
    assert pooled.window_s == 40.0 and pooled.achieved_rate == pytest.approx(7.0)
    assert pooled.offered_rate is None and pooled_throughput([rates(1, 1), None]) is None


def test_counters_explain_with_ratios_of_their_growth():
    def scrape(**values: float) -> Scrape:
        return Scrape(t_ns=0, values=values)
    rounds = [(scrape(spec_draft_tokens=100, spec_accepted_tokens=50, preemptions=1),
               scrape(spec_draft_tokens=300, spec_accepted_tokens=170, preemptions=3)),
              (scrape(spec_draft_tokens=300, spec_accepted_tokens=170, preemptions=3),
               scrape(spec_draft_tokens=500, spec_accepted_tokens=250, preemptions=3))]
    assert explain(counter_deltas(rounds)) == {"draft acceptance rate": pytest.approx(0.5),
                                               "preemptions": 2.0}


def test_behind_a_gateway_ab_reads_the_engines_counters_not_the_gateways():
    from latlab.records.bench import BenchConfig
    from latlab.services.ab import _scrape

    with Server(answer(0.001), metrics=counters) as engine, Server(answer(0.001)) as gateway:
        scraped = _scrape(BenchConfig(url=gateway.url, server_url=engine.url))
    assert scraped is not None and scraped.values["prefix_cache_queries"] == 0


def test_a_server_ab_starts_has_no_engine_behind_it_from_a_gateway_run():
    """The advice's ab of a run through a gateway (`--config RUN --launch ...`): each side's
    server is started by ab and measured alone; the run's --server-url (the engine behind
    the gateway) is not scraped for it. Two URLs keep it: the engine both go to."""
    from latlab.records.ab import ABConfig
    from latlab.records.bench import BenchConfig

    bench = BenchConfig(url="http://127.0.0.1:4000", server_url="http://127.0.0.1:8000",
                        launch="server --port {port} {args}", model="gateway-alias")
    launched = ABConfig(a="-np 4", b="-np 4 -b 512", bench=bench).sides()
    assert all(side.url is None and side.server_url is None for side in launched.values())
    assert all(side.model is None for side in launched.values())  # the server's own, asked
    through = BenchConfig(url="http://127.0.0.1:4000", server_url="http://127.0.0.1:8000")
    urls = ABConfig(a="http://127.0.0.1:4000", b="http://127.0.0.1:4001", bench=through)
    assert {s.server_url for s in urls.sides().values()} == {"http://127.0.0.1:8000"}


def ab_json(tmp_path, url: str, *more: str) -> dict:
    result = CliRunner().invoke(app, [
        "ab", "--a", url, "--b", url, "--requests", "12", "--users", "2", "--rounds", "3",
        "--max-rounds", "3",
        "--prompt-tokens", "16", "--output-tokens", "2", "--out", str(tmp_path), "--json",
        *more])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_an_a_a_ab_against_a_caching_server_finds_no_change(tmp_path):
    """One server against itself, with a prefix cache its usage never reports: fresh prompts
    keep every round cold, and after a warm-up round a side (whatever runs first pays for
    it) no verdict says better or worse. With the seed's prompts and no warm-up every round
    but A's first is served from the cache: B looks faster, but A's rounds disagree (cold,
    then warm), and that spread keeps it from a false 'better'."""
    with Server(caching(cold_s=0.040, warm_s=0.002)) as server:
        fresh = ab_json(tmp_path / "fresh", server.url)
        # no warm-up: it would take the one cold round the cache gives
        cached = ab_json(tmp_path / "seed", server.url, "--prompts", "seed", "--warmup-rounds",
                         "0")
    called = [(c["key"], c["a"], c["b"], c["low"], c["high"]) for c in fresh["changes"]
              if c["verdict"] in ("better", "worse")]
    assert not called
    assert "rounds" in fresh["evidence"]
    # 12 requests a round: a round's p99 is its largest request, whether it met a stall of
    # the busy host or not; it is shown, not judged (and does not keep the A/B going)
    p99 = next(c for c in fresh["changes"] if c["key"] == "p99_ttft")
    assert "too few samples a round for a p99" in p99["why"] and p99["a"] and p99["b"]
    assert "TTFT p99 and E2E p99 not judged: too few samples a round" in fresh["looks"][-1]
    ttft = next(c for c in cached["changes"] if c["key"] == "mean_ttft")
    assert ttft["b"] < ttft["a"]  # the cache flattered B (A's first round alone was cold) ...
    assert ttft["verdict"] == "can't tell" and ttft["low"] < 0 < ttft["high"]  # ... A's spread


def test_the_same_bench_twice_against_a_caching_server_agrees(tmp_path):
    with Server(caching(cold_s=0.040, warm_s=0.002)) as server:
        p50 = []
        for _ in range(2):
            result = CliRunner().invoke(app, [
                "bench", "--url", server.url, "--requests", "8", "--users", "2",
                "--prompt-tokens", "16", "--output-tokens", "2", "--out", str(tmp_path),
                "--json"])
            assert result.exit_code == 0, result.output
            p50.append(json.loads(result.stdout)["latency"]["ttft"]["percentiles"]["p50"]["value"])
    assert min(p50) > 30  # both cold: the second run's prompts are new to the cache


def test_a_real_prefix_cache_effect_is_found_and_attributed(tmp_path):
    """latlab serve without and with prefix caching, a shared 448-token system prompt in a
    run (fresh prompts keep it shared within a run, new across runs): B's TTFT is better,
    and B's cache share and counters say why. One server a side for every round (the suite's
    time: fresh servers a pair are test_ab_servers')."""
    engine = "--model default --max-model-len 512 --num-kv-blocks 256 --no-warmup"
    result = CliRunner().invoke(app, [
        "ab", "--a", engine, "--b", f"{engine} --enable-prefix-caching", "--rounds", "3",
        "--max-rounds", "3", "--fresh-servers", "never", "--requests", "12", "--users", "1",
        "--prefix-tokens", "448", "--prompt-tokens", "16", "--output-tokens", "4", "--out",
        str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    ttft = next(c for c in record["changes"] if c["key"] == "p50_ttft")
    assert ttft["verdict"] == "better" and ttft["b"] < 0.5 * ttft["a"], ttft
    shares = {r["side"]: r["cached_share"] for r in record["rounds"]}
    assert shares["A"] == 0 and shares["B"] > 0.5
    assert record["counters"]["B"]["prefix-cache hit rate"] > 0.5
