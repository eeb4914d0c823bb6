"""The server's own settings, asked before the load from whatever it exposes: latlab serve's
and vLLM's `/server_info`, SGLang's `/get_server_info`, llama.cpp's `/props`, TGI's `/info`,
and the info gauges of `/metrics` (vLLM's `vllm:cache_config_info`, latlab's
`latlab_engine_config_info`).
Each source fills what it knows; none answering is no error (the advice then hedges)."""

from __future__ import annotations

from collections.abc import Callable
from ssl import SSLContext
from typing import Any

import aiohttp
import orjson
from prometheus_client.parser import text_string_to_metric_families

from latlab.load.request.sse import StreamFault, read_at_most
from latlab.load.request.tls import for_aiohttp
from latlab.records.server import ServerSettings

TIMEOUT_S = 3.0
MAX_BYTES = 4 << 20  # of one answer: a server's settings are a few kilobytes
INFO_GAUGES = ("vllm:cache_config", "latlab_engine_config")
LONGEST_KEPT = 200  # characters of a string kept in `raw` (chat templates are not settings)


def _flag(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
        return value.lower() in ("true", "1")
    return None


def _int(value: Any) -> int | None:
    try:
        return int(float(value)) if value is not None and value != "" else None
    except (TypeError, ValueError):
        return None


def _latlab(data: dict[str, Any]) -> dict[str, Any]:
    engine = data.get("engine") if isinstance(data.get("engine"), dict) else None
    if engine is None:
        return {}
    return {"version": data.get("version"),
            "chunked_prefill": _flag(engine.get("enable_chunked_prefill")),
            "step_tokens": _int(engine.get("max_prefill_tokens")
                                or engine.get("max_num_batched_tokens")),
            "prefix_caching": _flag(engine.get("enable_prefix_caching")),
            "max_num_seqs": _int(engine.get("max_num_seqs")),
            "speculative": engine.get("speculative_method") or "",
            "scheduling": ("fair_share" if engine.get("fair_share")
                           else engine.get("scheduling_policy")),
            "device": engine.get("device_type")}


def _sglang(data: dict[str, Any]) -> dict[str, Any]:
    args = data.get("server_args") if isinstance(data.get("server_args"), dict) else data
    if "chunked_prefill_size" not in args and "disable_radix_cache" not in args:
        return {}
    chunk = _int(args.get("chunked_prefill_size"))
    radix = _flag(args.get("disable_radix_cache"))
    return {"version": data.get("version"),
            "chunked_prefill": None if chunk is None else chunk > 0,
            "step_tokens": chunk if chunk and chunk > 0 else None,
            "prefix_caching": None if radix is None else not radix,
            "max_num_seqs": _int(args.get("max_running_requests")),
            "speculative": args.get("speculative_algorithm") or "",
            "scheduling": args.get("schedule_policy")}


def _llamacpp(data: dict[str, Any]) -> dict[str, Any]:
    if "total_slots" not in data:
        return {}
    defaults = data.get("default_generation_settings") or {}
    params = defaults.get("params") if isinstance(defaults.get("params"), dict) else {}
    return {"version": data.get("build_info"), "max_num_seqs": _int(data.get("total_slots")),
            "prefix_caching": _flag(params.get("cache_prompt"))}


def _tgi(data: dict[str, Any]) -> dict[str, Any]:
    """TGI's router `/info`: its batch limits (the fields differ between versions)."""
    if "model_id" not in data or "max_concurrent_requests" not in data:
        return {}
    return {"version": data.get("version"),
            "step_tokens": _int(data.get("max_batch_prefill_tokens")),
            "max_num_seqs": _int(data.get("max_batch_size")),
            "device": data.get("model_device_type")}


def _info_gauges(text: str) -> dict[str, Any]:
    """The labels of `*_info` gauges: vLLM's cache config, latlab's engine config."""
    labels: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        if family.name.removesuffix("_info") in INFO_GAUGES:
            for sample in family.samples:
                labels |= sample.labels
    if not labels:
        return {}
    return {"prefix_caching": _flag(labels.get("enable_prefix_caching")),
            "chunked_prefill": _flag(labels.get("enable_chunked_prefill")),
            "step_tokens": _int(labels.get("max_num_batched_tokens")),
            "max_num_seqs": _int(labels.get("max_num_seqs")),
            "raw_labels": labels}


SOURCES: tuple[tuple[str, Callable[[Any], dict[str, Any]], bool], ...] = (
    ("/server_info", _latlab, True), ("/get_server_info", _sglang, True),
    ("/props", _llamacpp, True), ("/info", _tgi, True), ("/metrics", _info_gauges, False))


async def server_settings(url: str, api_key: str | None = None,
                          tls: SSLContext | None = None) -> ServerSettings:
    """Whatever of its settings the server at `url` tells."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    settings = ServerSettings()
    timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:
        for path, read, is_json in SOURCES:
            try:
                async with session.get(url.rstrip("/") + path, ssl=for_aiohttp(tls)) as resp:
                    if resp.status != 200:
                        continue
                    raw = await read_at_most(resp, MAX_BYTES)
                body = orjson.loads(raw) if is_json else raw.decode("utf-8", "replace")
                found = read(body) if isinstance(body, (dict, str)) else {}
            except (TimeoutError, aiohttp.ClientError, OSError, ValueError, StreamFault):
                continue
            if not any(v is not None for v in found.values()):
                continue
            settings.sources.append(path)
            settings.raw[path] = found.pop("raw_labels", None) or _trimmed(body)
            for key, value in found.items():
                if value is not None and getattr(settings, key) is None:
                    setattr(settings, key, value)
    return settings


def _trimmed(value: Any) -> Any:
    """`value` without its long strings (templates, paths of no interest)."""
    if isinstance(value, dict):
        return {k: _trimmed(v) for k, v in value.items()
                if not (isinstance(v, str) and len(v) > LONGEST_KEPT)}
    if isinstance(value, list):
        return [_trimmed(v) for v in value]
    return value
