"""Server timings from what each server sends in band, all into one `ServerTiming`.

| server | where | what it gives |
|---|---|---|
| latlab | final usage event `server_timing`, `Server-Timing` header | every stage and the total |
| llama.cpp | `timings` in the final chunk (every chunk with `timings_per_token`) and in a non-streamed body | prefill (`prompt_ms`), decode (`predicted_ms`), cached prompt tokens (`cache_n`) |
| TGI | `x-*` headers of a non-streamed response | validation (preprocess), queue, inference (prefill + decode unsplit), total |
| Ollama | the final object of `/api/generate` or `/api/chat` | model load, prefill (`prompt_eval_duration`), decode (`eval_duration`), total (ns) |
| SGLang | `meta_info` of the native `/generate`'s last event or body | total (`e2e_latency`), queue (`queue_time`); with `--enable-metrics` preprocess, prefill and decode from its stamps |

vLLM sends nothing per request in HTTP, nor SGLang on its OpenAI routes: their OpenTelemetry
spans carry the timings (`latlab.load.telemetry.spans`). `ServerKind` names the adapters;
`--server-kind auto` tells them apart by what the server lists at /v1/models and what it
sends.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from latlab.records.target import ServerKind
from latlab.records.timeline import ServerTiming

__all__ = ["ServerKind", "detect", "from_event", "from_headers"]

NS_PER_MS = 1e6


OWNERS = {"latlab": ServerKind.LATLAB, "llamacpp": ServerKind.LLAMACPP,
          "vllm": ServerKind.VLLM, "sglang": ServerKind.SGLANG, "tgi": ServerKind.TGI,
          "library": ServerKind.OLLAMA, "ollama": ServerKind.OLLAMA}


def detect(models: Mapping[str, Any]) -> ServerKind:
    """The server's kind from its /v1/models answer (`owned_by` of the first model)."""
    data = models.get("data") if isinstance(models, Mapping) else None
    first = data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else {}
    return OWNERS.get(str(first.get("owned_by", "")).lower(), ServerKind.OPENAI)


def context_length(models: Mapping[str, Any], model: str) -> int | None:
    """The context (prompt + output tokens) a server lists for `model` at /v1/models:
    `max_model_len` (vLLM, SGLang, latlab) or llama.cpp's `meta.n_ctx`; None when unlisted."""
    data = models.get("data") if isinstance(models, Mapping) else None
    entry = next((m for m in data if isinstance(m, dict) and m.get("id") == model), {}) \
        if isinstance(data, list) else {}
    meta = entry.get("meta")
    value = entry.get("max_model_len", meta.get("n_ctx") if isinstance(meta, dict) else None)
    return value if isinstance(value, int) and value > 0 else None


def from_event(obj: Mapping[str, Any]) -> ServerTiming | None:
    """The timings a JSON event or body carries: latlab's `server_timing`, llama.cpp's
    `timings`, Ollama's final object or SGLang's `meta_info`; None when it carries none."""
    if "server_timing" in obj:
        return ServerTiming.from_json(obj["server_timing"], "latlab")
    if isinstance(obj.get("meta_info"), dict):
        return sglang(obj["meta_info"])
    timings = obj.get("timings")
    if isinstance(timings, dict):
        return llamacpp(timings)
    if obj.get("done") is True and "total_duration" in obj:
        return ollama(obj)
    return None


def llamacpp(timings: Mapping[str, Any]) -> ServerTiming | None:
    """llama.cpp: `prompt_ms` is the prefill of the uncached prompt tokens, `predicted_ms`
    the generation from the first token on; it reports no queue and no total."""
    return ServerTiming.from_json({"prefill": timings.get("prompt_ms"),
                                   "decode": timings.get("predicted_ms")}, "llamacpp")


def llamacpp_cached(obj: Mapping[str, Any]) -> int | None:
    """Prompt tokens llama.cpp took from its cache (`timings.cache_n`)."""
    timings = obj.get("timings")
    value = timings.get("cache_n") if isinstance(timings, dict) else None
    return value if isinstance(value, int) else None


def ollama(final: Mapping[str, Any]) -> ServerTiming | None:
    """Ollama's final object: durations in ns; `load_duration` is loading the model."""
    def ms(key: str) -> float | None:
        value = final.get(key)
        return value / NS_PER_MS if isinstance(value, (int, float)) else None

    return ServerTiming.from_json({"model_load": ms("load_duration"),
                                   "prefill": ms("prompt_eval_duration"),
                                   "decode": ms("eval_duration"),
                                   "total": ms("total_duration")}, "ollama")


def sglang(meta: Mapping[str, Any]) -> ServerTiming | None:
    """SGLang's `meta_info` (seconds): `e2e_latency` is receipt to finish (the total),
    `queue_time` the wait for the scheduler. With `--enable-metrics` it also has wall-clock
    stamps on the server's clock (`request_received_ts`, `forward_entry_time` when it was
    first scheduled, `prefill_finished_time`, `request_finished_ts`): preprocess is receipt to
    the queue, prefill first scheduled to prefill done, decode the rest."""
    def number(key: str) -> float | None:
        value = meta.get(key)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
            else None

    def ms(later: float | None, earlier: float | None) -> float | None:
        return (later - earlier) * 1000 if later is not None and earlier is not None else None

    queue, total = number("queue_time"), number("e2e_latency")
    scheduled, prefilled = number("forward_entry_time"), number("prefill_finished_time")
    queued = scheduled - queue if scheduled is not None and queue is not None else None
    return ServerTiming.from_json({
        "total": ms(total, 0.0), "queue": ms(queue, 0.0),
        "preprocess": ms(queued, number("request_received_ts")),
        "prefill": ms(prefilled, scheduled),
        "decode": ms(number("request_finished_ts"), prefilled)}, "sglang")


def from_headers(headers: Mapping[str, str]) -> ServerTiming | None:
    """latlab's `Server-Timing` header, else TGI's `x-*-time` headers (ms)."""
    timing = ServerTiming.from_header(headers.get("Server-Timing"))
    if timing is not None or "x-inference-time" not in headers:
        return timing

    def ms(name: str) -> float | None:
        try:
            return float(headers[name])
        except (KeyError, ValueError):
            return None

    return ServerTiming.from_json({"preprocess": ms("x-validation-time"),
                                   "queue": ms("x-queue-time"),
                                   "inference": ms("x-inference-time"),
                                   "total": ms("x-total-time")}, "tgi")
