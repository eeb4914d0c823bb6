"""Real gateways in front of a real `latlab serve`: LiteLLM's proxy and nginx (plain and
TLS-terminating). Skipped, saying why, where the gateway is not installed (tests/gateways.py
says how to install each; `make test` installs neither). The join and decomposition logic is
tested without them on recorded fixtures (test_gateway.py)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from gateways import (
    LITELLM_KEY,
    litellm_binary,
    litellm_proxy,
    nginx_binary,
    nginx_proxy,
    openssl_binary,
)

from latlab.load import BenchError
from latlab.load.target.launch import ServerLaunch, free_port, launched
from latlab.records.arrivals import ArrivalConfig
from latlab.records.bench import BenchConfig
from latlab.records.lengths import LengthDistribution
from latlab.records.workload import WorkloadConfig
from latlab.report.gateway import target_lines
from latlab.services.bench import run_bench

pytestmark = pytest.mark.xdist_group("gateways")  # one worker: each starts three processes

SMALL = WorkloadConfig(prompt_tokens=LengthDistribution(kind="fixed", a=16),
                       output_tokens=LengthDistribution(kind="fixed", a=8))
REQUESTS = 8


@contextmanager
def engine(folder: Path) -> Iterator[tuple[str, int]]:
    """`latlab serve --model tiny` exporting its spans to a port a bench then listens on."""
    pytest.importorskip("torch")
    port, otlp = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "latlab", "serve", "--model", "tiny", "--port", str(port),
               "--otlp-endpoint", f"http://127.0.0.1:{otlp}/v1/traces"]
    with launched(ServerLaunch(tuple(command), url, f"{url}/v1/models", "latlab serve"),
                  log_path=folder / "serve.log"):
        yield url, otlp


def bench(url: str, engine_url: str, otlp: int, out: Path, workload: WorkloadConfig = SMALL,
          **options) -> object:
    return run_bench(BenchConfig(url=url, server_url=engine_url, otlp_port=otlp,
                                 requests=REQUESTS, workload=workload, span_wait_s=5,
                                 arrivals=ArrivalConfig(users=2), out=out, **options))


def check_hop(result, joined_by: str) -> None:
    s, a = result.summary, result.analysis
    assert not result.failed and s.ok == s.requests == REQUESTS, (s.failures, result.message)
    # the engine saw the run's requests and nothing else: the probes ran no model
    assert s.spans.spans == REQUESTS, s.spans
    assert s.spans.requests_joined >= 0.95 * REQUESTS and joined_by in s.spans.joined_by
    assert a.hop is not None and a.hop.joined >= 0.95 * a.hop.requests
    assert a.mean.coverage["prefill"] >= 0.95 and a.mean.coverage["decode"] >= 0.95
    assert a.mean.bucket("gateway") > 0


@pytest.mark.skipif(litellm_binary() is None,
                    reason="LiteLLM is not installed: python3 -m venv /work/venvs/litellm && "
                           "/work/venvs/litellm/bin/pip install 'litellm[proxy]' (or set "
                           "LATLAB_LITELLM to its `litellm` binary)")
def test_through_litellm_the_engines_spans_join_and_the_hop_is_recovered(tmp_path):
    with engine(tmp_path) as (engine_url, otlp), \
            litellm_proxy(engine_url, tmp_path / "litellm", model="tiny") as url:
        result = bench(url, engine_url, otlp, tmp_path, model="tiny", api_key=LITELLM_KEY)
    check_hop(result, "response id")  # LiteLLM drops traceparent, keeps the engine's id
    gateway = result.analysis.config.target.gateway  # named by its answers' headers
    assert gateway is not None and gateway.name.startswith("LiteLLM"), gateway


@pytest.mark.skipif(nginx_binary() is None or openssl_binary() is None,
                    reason="nginx or openssl is not installed (apt-get install nginx openssl)")
def test_through_nginx_the_spans_join_by_trace_and_nginx_is_named(tmp_path):
    with engine(tmp_path) as (engine_url, otlp), \
            nginx_proxy(engine_url, tmp_path / "nginx") as (plain, _, _):
        result = bench(plain, engine_url, otlp, tmp_path)
    check_hop(result, "trace id")  # nginx passes traceparent on
    gateway = result.analysis.config.target.gateway
    assert gateway is not None and gateway.name.startswith("nginx")


@pytest.mark.skipif(nginx_binary() is None or openssl_binary() is None,
                    reason="nginx or openssl is not installed (apt-get install nginx openssl)")
def test_through_nginx_over_tls_the_handshake_is_its_own_phase(tmp_path):
    with engine(tmp_path) as (engine_url, otlp), \
            nginx_proxy(engine_url, tmp_path / "nginx") as (_, tls, cert):
        with pytest.raises(BenchError, match="--ca-cert FILE.*--insecure"):
            bench(tls, engine_url, otlp, tmp_path / "untrusted")
        result = bench(tls, engine_url, otlp, tmp_path, ca_cert=cert)
    check_hop(result, "trace id")
    records = result.run.read_records()
    new = [r.connection for r in records if r.connection is not None and r.connection.new]
    reused = [r for r in records if r.connection is not None and not r.connection.new]
    assert new and reused and all(c.tls_ns and c.tls_ns > 0 for c in new)
    assert all(r.connection.tls_ns is None for r in reused)
    a = result.analysis
    assert a.mean.coverage["tls"] == pytest.approx(len(new) / len(records))
    assert any(line.startswith(f"connections {len(new)} new") and "TLS handshake" in line
               for line in target_lines(a))


@pytest.mark.skipif(nginx_binary() is None or openssl_binary() is None,
                    reason="nginx or openssl is not installed (apt-get install nginx openssl)")
def test_through_a_buffering_nginx_the_stall_metric_is_not_judged(tmp_path):
    """nginx's proxy_buffering on (its default) passes each event on as it comes; with event
    streams gzipped it holds them: the streams arrive in bursts, the stall finding names the
    buffer and advises no server setting, and a comparison leaves the gap metrics out."""
    from latlab.analysis.compare import compare
    from latlab.analysis.delivery import bursts

    longer = SMALL.model_copy(update={"output_tokens": LengthDistribution(kind="fixed", a=48)})
    results = {}
    with engine(tmp_path) as (engine_url, otlp):
        for name, gzip in (("buffered", False), ("gzipped", True)):
            with nginx_proxy(engine_url, tmp_path / name, buffering=True, gzip=gzip) as (
                    plain, _, _):
                results[name] = bench(plain, engine_url, otlp, tmp_path / name,
                                      workload=longer)
    buffered, gzipped = (results[n].analysis for n in ("buffered", "gzipped"))
    assert bursts(buffered) is None  # the gaps between tokens are still the server's
    found = bursts(gzipped)
    assert found is not None and found.through.startswith("nginx")
    stalls = [f for f in gzipped.findings if f.rule == "decode_stalls"]
    assert stalls and "bursts" in stalls[0].title and not stalls[0].changes
    change = compare(buffered, gzipped).change("mean_itl_max")
    assert change.delta is None and "bursts" in change.why
