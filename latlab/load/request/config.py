"""How one `Client` asks: which API, with which key, what each body holds, how answers come
(streamed or not, over kept connections or not) and the caps on its connections and answers.
Built from a run's settings by `ClientConfig.of`."""

from __future__ import annotations

from dataclasses import dataclass

from latlab.records.bench import BenchConfig
from latlab.records.coldstart import ColdstartConfig
from latlab.records.target import ServerKind
from latlab.records.transport import MAX_EVENT_MIB, MAX_RESPONSE_MIB, MIB
from latlab.records.workload import Api


@dataclass(frozen=True)
class ClientConfig:
    api: Api = "completions"
    api_key: str | None = None
    kind: ServerKind = ServerKind.AUTO  # whose server timings to read and ask for
    stream: bool = True
    keepalive: bool = True  # without, every request opens its own connection
    ignore_eos: bool = True  # send ignore_eos and min_tokens to hold the output length
    continuous_usage: bool = True  # ask for cumulative usage in every chunk
    pool_size: int = 0  # connections in the pool (0: unbounded)
    timeout_s: float = 600.0  # per request
    max_event_bytes: int = int(MAX_EVENT_MIB * MIB)  # one SSE event or NDJSON line
    max_response_bytes: int = int(MAX_RESPONSE_MIB * MIB)
    ca_cert: str | None = None  # trust this certificate for https (a self-signed gateway's)
    insecure: bool = False  # check no certificate

    @classmethod
    def of(cls, settings: BenchConfig | ColdstartConfig, *, api_key: str | None,
           kind: ServerKind, pool_size: int) -> ClientConfig:
        """The client of a run's `settings` (a bench's, or a coldstart's, which has no
        transport options: it streams over kept connections), asking its workload's API of a
        server of `kind` over `pool_size` connections. `api_key` is passed apart: settings
        sent to a worker leave it out."""
        transport = ({"stream": settings.stream, "keepalive": settings.keepalive,
                      "ca_cert": str(settings.ca_cert) if settings.ca_cert else None,
                      "insecure": settings.insecure}
                     if isinstance(settings, BenchConfig) else {})
        return cls(api=settings.workload.api, api_key=api_key, kind=kind,
                   ignore_eos=settings.ignore_eos,
                   continuous_usage=settings.continuous_usage, pool_size=pool_size,
                   timeout_s=settings.timeout_s, **transport, **settings.size_limits())
