"""`latlab serve`: latlab's own OpenAI-compatible inference server (the reference engine)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from pydantic import ValidationError

from latlab.commands.common import UsageError
from latlab.commands.options import Options, opt, validation_message


# Options passed to EngineConfig as they are (it validates them).
TECHNIQUES = ("enable_prefix_caching", "scheduling_policy", "fair_share", "max_queue_delay",
              "max_prefill_tokens", "max_decode_tokens", "speculative_method",
              "num_speculative_tokens", "speculative_model", "quantization", "idle_unload")


class ServeOptions(Options):
    model: str = opt("default", "A preset (tiny, default: random weights) or a Hugging Face "
                                "checkpoint folder (Llama, Mistral, Qwen2).")
    host: str = opt("127.0.0.1", "Interface to bind.")
    port: int = opt(8000, "Port to bind.")
    api_key: str | None = opt(None, "Require `Authorization: Bearer KEY` on /v1 (seen in `ps`: "
                                    "prefer LATLAB_API_KEY or --api-key-file).")
    api_key_file: Path | None = opt(None, "Read the API key from this file's first line.")
    allow_origin: list[str] = opt([], "Let web pages at this origin call the API (CORS); repeat "
                                      "for more, `*` for any.")
    served_model_name: str | None = opt(None, "Model id in the API [default: --model].")
    max_model_len: int | None = opt(None, "Context length (prompt + output tokens) [default: "
                                          "the model's, at most 2048].")
    max_num_seqs: int = opt(32, "Most sequences in a running batch.")
    max_num_batched_tokens: int = opt(512, "Token budget of one engine step.")
    block_size: int = opt(16, "Tokens per KV-cache block.")
    num_kv_blocks: int | None = opt(None, "KV-cache blocks [default: as many as --kv-cache-mib "
                                          "holds].")
    kv_cache_mib: int = opt(256, "KV-cache memory when --num-kv-blocks is unset.")
    batching: str = opt("continuous", "continuous (iteration-level) or static (a batch admits "
                                      "nobody until it has finished).")
    chunked_prefill: bool = opt(True, "Cut long prompts into chunks that fit the step budget.")
    max_waiting: int = opt(256, "Waiting-queue limit; beyond it requests get 429.")
    threads: int = opt(1, "Torch intra-op threads.")
    seed: int = opt(0, "Seed of the preset weights and of unseeded sampling.")
    dtype: str = opt("float32", "float32, bfloat16 or float16.")
    device: str = opt("auto", "cpu, cuda, or auto: CUDA when torch sees a GPU, else the CPU.")
    enforce_eager: bool = opt(False, "On CUDA, run decode steps eagerly (no CUDA graphs).")
    warmup: bool = opt(True, "Warm up before reporting ready.")
    otel_file: Path | None = opt(None, "Append an OpenTelemetry span per request (stages as "
                                       "events) to this JSON-lines file.")
    otlp_endpoint: str | None = opt(None, "Export an OpenTelemetry span per request over "
                                          "OTLP/HTTP to this URL (e.g. latlab bench --otlp-port: "
                                          "http://127.0.0.1:PORT/v1/traces).")
    step_log: Path | None = opt(None, "Append one JSON line per engine step to this file: its "
                                      "start and end, tokens, decodes, prefill chunks, context "
                                      "(what latlab calibrate fits; schema docs/schema/"
                                      "step.schema.json).")
    enable_prefix_caching: bool = opt(False, "Share the cached KV blocks of common prompt "
                                             "prefixes.")
    scheduling_policy: str = opt("fcfs", "fcfs, or priority (the request's `priority`: lower "
                                         "is more urgent; may preempt).")
    fair_share: bool = opt(False, "Tenants (X-Tenant-Id header, else `user`) share the token "
                                  "budget fairly.")
    max_queue_delay: float | None = opt(None, "Seconds a request may wait to be scheduled; then "
                                              "503 with Retry-After.")
    max_prefill_tokens: int | None = opt(None, "Prefill tokens per step.")
    max_decode_tokens: int | None = opt(None, "Decode tokens per step (a decode batch cap).")
    speculative_method: str | None = opt(None, "ngram (prompt lookup) or draft.")
    num_speculative_tokens: int = opt(4, "Tokens proposed per step.")
    speculative_model: str | None = opt(None, "The draft model (a preset or a folder).")
    quantization: str | None = opt(None, "int8: weight-only, a scale per output channel.")
    idle_unload: float | None = opt(None, "Unload the model after this many idle seconds; the "
                                          "next request loads it again.")

    def engine_config(self):
        """The `EngineConfig` these options serve."""
        from latlab.engine.config import EngineConfig

        o = self
        return EngineConfig(
            model=o.model, max_model_len=o.max_model_len, block_size=o.block_size,
            num_kv_blocks=o.num_kv_blocks, kv_cache_mib=o.kv_cache_mib,
            max_num_seqs=o.max_num_seqs, max_num_batched_tokens=o.max_num_batched_tokens,
            enable_chunked_prefill=o.chunked_prefill, batching=o.batching,
            max_waiting=o.max_waiting, threads=o.threads, seed=o.seed, dtype=o.dtype,
            device=o.device, enforce_eager=o.enforce_eager, warmup=o.warmup,
            **{name: getattr(o, name) for name in TECHNIQUES})


def parse_serve_args(args: Sequence[str], option: str = "--serve-args") -> ServeOptions:
    """`latlab serve`'s options from its command line (`--max-num-seqs 16`, `--flag`,
    `--no-flag`, `--name=value`); a bad one is a usage error naming `option`."""
    values: dict[str, object] = {}
    fields = ServeOptions.model_fields
    items = list(args)
    while items:
        arg = items.pop(0)
        name, _, inline = arg.removeprefix("--").partition("=")
        field = name.replace("-", "_")
        if not arg.startswith("--"):
            raise UsageError(f"{option}: unexpected {arg!r}")
        if field.startswith("no_") and field[3:] in fields and fields[field[3:]].annotation \
                is bool:
            values[field[3:]] = False
            continue
        if field not in fields:
            raise UsageError(f"{option}: latlab serve has no option --{name}")
        if fields[field].annotation is bool:
            values[field] = True
            continue
        if not inline and not items:
            raise UsageError(f"{option}: --{name} needs a value")
        value = inline or items.pop(0)
        if fields[field].annotation == list[str]:  # repeatable: --allow-origin a --allow-origin b
            values[field] = [*values.get(field, []), value]
        else:
            values[field] = value
    try:
        return ServeOptions(**values)
    except ValidationError as e:
        raise UsageError(f"{option}: {validation_message(e, ServeOptions.flags_by_target())}"
                         ) from None


def serve(options: ServeOptions) -> None:
    """Serve a model through an OpenAI-compatible API (latlab's reference engine, on the CPU
    or a CUDA GPU)."""
    from latlab.engine.config import ConfigError
    from latlab.engine.loader import ModelLoadError
    from latlab.server.auth import read_api_key
    from latlab.server.openai_serving import ServerSettings
    from latlab.server.serve import run_server

    o = options
    config = o.engine_config()
    if o.step_log is not None:
        try:
            open(o.step_log, "ab").close()
        except OSError as e:
            raise UsageError(f"--step-log {o.step_log}: {e.strerror or e}") from None
    try:
        settings = ServerSettings(served_model_name=o.served_model_name or o.model,
                                  api_key=read_api_key(o.api_key, o.api_key_file),
                                  allow_origins=tuple(o.allow_origin), otel_file=o.otel_file,
                                  otlp_endpoint=o.otlp_endpoint, step_log=o.step_log)
        run_server(config, settings, host=o.host, port=o.port)
    except (ConfigError, ModelLoadError) as e:
        raise UsageError(str(e)) from None
