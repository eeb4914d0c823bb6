"""The HTTP side: send one streaming request to an OpenAI-compatible server and fill its
`RequestTimeline` as the bytes arrive (the stream itself is parsed by `sse.StreamParser`).

`sent` is taken when the connection is ready, just before the request bytes are written:
the connection phases (pool wait, DNS, connect) lie between `scheduled` and `sent` and are
recorded in `connection`; a request that never got a connection has no `sent`. Every
failure becomes an outcome class of the record, never an exception.
"""

from __future__ import annotations

import asyncio
from time import perf_counter_ns
from typing import Any

import aiohttp
import orjson

from latlab.load import BenchError
from latlab.load.connection import connection_trace
from latlab.load.sse import StreamFault, StreamParser
from latlab.load.workload import Api, RequestSpec
from latlab.records.timeline import Outcome, RequestTimeline, ServerTiming

ERROR_BODY_BYTES = 2048


class Client:
    """One aiohttp session with a pool of `pool_size` connections (0: unbounded)."""

    def __init__(self, url: str, model: str, api: Api = "completions", *,
                 api_key: str | None = None, pool_size: int = 0, timeout_s: float = 600.0,
                 ignore_eos: bool = True, continuous_usage: bool = True) -> None:
        self.url = url.rstrip("/") + ("/v1/chat/completions" if api == "chat" else "/v1/completions")
        self.model = model
        self.chat = api == "chat"
        self.ignore_eos = ignore_eos
        self.stream_options = {"include_usage": True}
        if continuous_usage:
            self.stream_options["continuous_usage_stats"] = True
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self._pool_size = pool_size
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Client:
        connector = aiohttp.TCPConnector(limit=self._pool_size, limit_per_host=0,
                                         ttl_dns_cache=300)
        self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout,
                                              trace_configs=[connection_trace()],
                                              skip_auto_headers=("User-Agent",))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    def body(self, spec: RequestSpec) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "stream": True,
                                "stream_options": self.stream_options,
                                "max_tokens": spec.max_tokens}
        if self.chat:
            body["messages"] = spec.messages
        else:
            body["prompt"] = spec.prompt
        if self.ignore_eos:
            body["ignore_eos"] = True
            body["min_tokens"] = spec.max_tokens
        if spec.tenant is not None:
            body["user"] = spec.tenant
        if spec.priority is not None:
            body["priority"] = spec.priority
        return body

    async def send(self, spec: RequestSpec, r: RequestTimeline) -> None:
        """Send `spec` and record everything in `r`; never raises but for cancellation."""
        data = orjson.dumps(self.body(spec))
        headers = self.headers | {"X-Request-Id": r.id}
        try:
            async with self._session.post(self.url, data=data, headers=headers,
                                          trace_request_ctx=r) as resp:
                r.headers_ns = perf_counter_ns()
                r.status = resp.status
                r.server_request_id = resp.headers.get("X-Request-Id")
                r.server = ServerTiming.from_header(resp.headers.get("Server-Timing"))
                if resp.status != 200:
                    await self._http_error(resp, r)
                elif not resp.content_type.startswith("text/event-stream"):
                    r.outcome = Outcome.BAD_PAYLOAD
                    r.error = f"not a stream: Content-Type {resp.content_type!r}"
                else:
                    await self._read_stream(resp, r)
        except asyncio.CancelledError:
            r.outcome, r.error = Outcome.CANCELLED, "cancelled before the response ended"
            raise
        except StreamFault as e:
            r.outcome, r.error = e.outcome, str(e)
        except Exception as e:  # every failure becomes a classified record
            r.outcome, r.error = _classify(e, r.headers_ns is not None), _describe(e)
        finally:
            if r.done_ns is None or not r.ok:
                r.done_ns = perf_counter_ns()

    async def _http_error(self, resp: aiohttp.ClientResponse, r: RequestTimeline) -> None:
        status = resp.status
        if status == 429:
            r.outcome = Outcome.HTTP_429
        elif status >= 500:
            r.outcome = Outcome.HTTP_5XX
        else:
            r.outcome = Outcome.HTTP_4XX
        body = (await resp.content.read(ERROR_BODY_BYTES)).decode("utf-8", "replace").strip()
        r.error = f"HTTP {status} {resp.reason or ''}".rstrip() + (f": {body}" if body else "")

    async def _read_stream(self, resp: aiohttp.ClientResponse, r: RequestTimeline) -> None:
        parser = StreamParser(r, self.chat)
        async for chunk in resp.content.iter_any():
            parser.feed(chunk, perf_counter_ns())
        parser.finish()


def _classify(e: Exception, after_headers: bool) -> Outcome:
    if isinstance(e, asyncio.TimeoutError):
        return Outcome.TIMEOUT
    if isinstance(e, aiohttp.ClientConnectorError):
        return Outcome.CONNECTION_REFUSED
    if isinstance(e, aiohttp.ClientPayloadError):
        return Outcome.STREAM_BROKEN
    if isinstance(e, (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, ConnectionError)):
        return Outcome.STREAM_BROKEN if after_headers else Outcome.CONNECTION_RESET
    if isinstance(e, aiohttp.ClientResponseError):
        return Outcome.BAD_PAYLOAD
    return Outcome.CLIENT_ERROR


def _describe(e: Exception) -> str:
    text = str(e) or repr(e)
    return f"{type(e).__name__}: {text}"


async def list_models(url: str, api_key: str | None = None, timeout_s: float = 10.0) -> list[str]:
    """The model ids a server lists at /v1/models (raises aiohttp/OS errors, ValueError)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        async with session.get(url.rstrip("/") + "/v1/models", headers=headers) as resp:
            if resp.status != 200:
                raise ValueError(f"HTTP {resp.status} from {url}/v1/models")
            data = await resp.json(content_type=None)
    models = data.get("data") if isinstance(data, dict) else None
    if not isinstance(models, list):
        raise ValueError(f"{url}/v1/models: no `data` list in the answer")
    return [m["id"] for m in models if isinstance(m, dict) and isinstance(m.get("id"), str)]


async def first_model(url: str, api_key: str | None = None, timeout_s: float = 10.0) -> str:
    """The first model `url` lists at /v1/models; `BenchError` says why there is none: the
    target cannot be reached (giving --model would not help), or it lists none."""
    try:
        models = await list_models(url, api_key, timeout_s)
    except (aiohttp.ClientConnectionError, asyncio.TimeoutError, OSError) as e:
        raise BenchError(f"cannot reach {url} ({_describe(e)}): is the server up and the "
                         "URL right (http://HOST:PORT, without /v1)?") from None
    except Exception as e:  # the server answered, but not with a model list
        raise BenchError(f"--model not given and {url}/v1/models did not list one "
                         f"({_describe(e)}); give --model") from None
    if not models:
        raise BenchError(f"--model not given and {url}/v1/models lists none; give --model")
    return models[0]
