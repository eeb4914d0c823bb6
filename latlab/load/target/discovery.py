"""What the target is, asked before the load: the model it lists at /v1/models, its kind,
the model's context length, and the network's round trip as a null request sees it (a path
no server routes: no model runs for it, whatever is in front).

A server whose /v1/models fails or lists nothing can still be measured with `--model`: some
name their model per request and list none (`transformers serve` takes the model's path or
Hub id and answers /v1/models with 500 without a Hugging Face cache). Without `--model` the
error says what the server answered and how to name the model; with it, the run notes that
the server's kind is unknown."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from ssl import SSLContext
from time import perf_counter_ns
from typing import Any

import aiohttp
import orjson

from latlab.load import BenchError, KeyRefused, Unreachable, key_problem
from latlab.load.request.errors import describe, error_message
from latlab.load.request.server_timing import ServerKind, context_length, detect
from latlab.load.request.sse import StreamFault, read_at_most
from latlab.load.request.tls import for_aiohttp

MODELS_MAX_BYTES = 16 << 20  # of a /v1/models answer
MODEL_HINT = ("give --model NAME, the name its requests take (for `transformers serve`, the "
              "model's path or Hub id as it was started)")


class NoModels(BenchError):
    """The server answered, but its /v1/models names no model: `what` it answered."""

    def __init__(self, url: str, what: str) -> None:
        self.what = f"{url}/v1/models {what}"
        super().__init__(f"{self.what}: {MODEL_HINT}")


async def fetch_models(url: str, api_key: str | None = None, timeout_s: float = 10.0,
                       tls: SSLContext | None = None) -> dict[str, Any]:
    """The server's /v1/models answer (raises aiohttp/OS errors, ValueError; KeyRefused for
    a 401 or 403)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        async with session.get(url.rstrip("/") + "/v1/models", headers=headers,
                               ssl=for_aiohttp(tls)) as resp:
            problem = key_problem(resp.status, api_key is not None)
            if problem is not None:
                raise KeyRefused(f"{url}/v1/models: {problem}")
            if resp.status != 200:
                body = error_message(await resp.content.read(2048))
                raise ValueError(f"HTTP {resp.status} {resp.reason or ''}".rstrip()
                                 + (f": {body}" if body else ""))
            data = orjson.loads(await read_at_most(resp, MODELS_MAX_BYTES))
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise ValueError(f"{url}/v1/models: no `data` list in the answer")
    return data


async def discover(url: str, api_key: str | None = None, timeout_s: float = 10.0,
                   model: str | None = None, tls: SSLContext | None = None
                   ) -> tuple[str, ServerKind, int | None]:
    """`model` (default: the first model `url` lists at /v1/models), the server's kind and
    the model's context length where listed; `BenchError` says why there is none: the
    target cannot be reached (giving --model would not help), or it lists none."""
    try:
        data = await fetch_models(url, api_key, timeout_s, tls)
    except aiohttp.ClientConnectorCertificateError as e:
        raise BenchError(f"{url}: its TLS certificate is not trusted "
                         f"({getattr(e.certificate_error, 'verify_message', None) or 'unverified'})"
                         ": give --ca-cert FILE, the certificate to trust, or --insecure"
                         ) from None
    except (TimeoutError, aiohttp.ClientConnectorError) as e:
        error = Unreachable if isinstance(e, aiohttp.ClientConnectorError) else BenchError
        raise error(f"cannot reach {url} ({describe(e)}): is the server up and the "
                    "URL right (http://HOST:PORT)?") from None
    except KeyRefused:
        raise
    except Exception as e:  # it answered (or hung up), but not with a model list
        why = str(e) if isinstance(e, ValueError) else describe(e)
        raise NoModels(url, f"did not list a model ({why})") from None
    models = _ids(data)
    if not models:
        raise NoModels(url, "lists no model")
    model = model or models[0]
    return model, detect(data), context_length(data, model)


def identify(url: str, model: str | None, kind: ServerKind, key: str | None,
             timeout_s: float = 10.0, tls: SSLContext | None = None
             ) -> tuple[str, ServerKind, int | None, list[str]]:
    """The model to request, the server's kind and the model's context: as given, else from
    /v1/models; and a note when /v1/models failed but `model` was given (the server is then
    an OpenAI-compatible one of unknown kind). A server that does not answer at all cannot
    be measured (`Unreachable`)."""
    notes = []
    try:
        model, found, context = asyncio.run(discover(url, key, timeout_s, model, tls))
    except BenchError as e:
        if model is None or isinstance(e, (Unreachable, KeyRefused)):
            raise
        found, context = ServerKind.OPENAI, None
        what = e.what if isinstance(e, NoModels) else str(e)
        notes.append(f"{what}: " + ("the server's kind is unknown, so latlab reads what any "
                                    "OpenAI-compatible server sends (--server-kind names it)"
                                    if kind == ServerKind.AUTO else
                                    "the model's context length is unknown"))
    return model, found if kind == ServerKind.AUTO else kind, context, notes


PROBE_PATH = "/latlab-null-probe"  # no server routes it: the first router answers 404


@dataclass(frozen=True, slots=True)
class Probe:
    """The network's round trip to the target as a null request sees it, and the headers of
    the answer (a gateway's give it away)."""

    rtt_ms: float | None
    headers: dict[str, str]


async def probe(url: str, api_key: str | None = None, probes: int = 5,
                timeout_s: float = 5.0, tls: SSLContext | None = None) -> Probe:
    """The fastest of `probes` GETs of a path no server routes, on one warm connection:
    whatever answers first (the gateway in front, or the server's router) answers it at
    once, and no model runs (GET /health through LiteLLM runs a completion on every model).
    Any status is an answer. None when nothing answers."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    times: list[float] = []
    seen: dict[str, str] = {}
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for _ in range(probes + 1):  # the first opens the connection
                start = perf_counter_ns()
                async with session.get(url.rstrip("/") + PROBE_PATH, headers=headers,
                                       allow_redirects=False, ssl=for_aiohttp(tls)) as resp:
                    await read_at_most(resp, MODELS_MAX_BYTES)
                    seen = dict(resp.headers)
                times.append((perf_counter_ns() - start) / 1e6)
    except (TimeoutError, aiohttp.ClientError, OSError, StreamFault):
        pass
    return Probe(min(times[1:]) if len(times) > 1 else None, seen)


async def models_headers(url: str, api_key: str | None = None, timeout_s: float = 10.0,
                         tls: SSLContext | None = None) -> dict[str, str]:
    """The headers of the target's /v1/models answer ({} when it does not answer)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as s:
            async with s.get(url.rstrip("/") + "/v1/models", headers=headers,
                             ssl=for_aiohttp(tls)) as resp:
                await read_at_most(resp, MODELS_MAX_BYTES)
                return dict(resp.headers)
    except (TimeoutError, aiohttp.ClientError, OSError, StreamFault):
        return {}


def _ids(models: dict[str, Any]) -> list[str]:
    return [m["id"] for m in models["data"] if isinstance(m, dict) and isinstance(m.get("id"), str)]
