"""latlab's engine and server settings, declared once: `EngineConfig` (how the engine serves:
memory, batching, scheduling, the latency techniques), `ServeConfig` (`latlab serve`: the
engine plus the HTTP server), and `EngineShape` (the knobs that decide a step's batch, which
a calibration keeps and the simulator schedules with).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, create_model, model_validator

from latlab.records.settings import BATCHING, ENGINE, SERVER, TECHNIQUES, TELEMETRY, setting
from latlab.records.summary import Record

DTYPES = ("float32", "bfloat16", "float16")
DEFAULT_MAX_MODEL_LEN = 2048
API_KEY_ENV = "LATLAB_API_KEY"


class ConfigError(ValueError):
    """A configuration that cannot work, with a message naming the option."""


class EngineConfig(BaseModel):
    """How the engine serves: memory, batching and scheduling limits, and the latency
    techniques (each off by default). `num_kv_blocks` fixes the KV pool size; without it the
    pool gets `kv_cache_mib` of memory. `max_model_len` defaults to the model's positions, at
    most `DEFAULT_MAX_MODEL_LEN`."""

    model: str = setting("default", "A preset (tiny, default: random weights) or a Hugging Face "
                         "checkpoint folder (Llama, Mistral, Qwen2).", group=ENGINE)
    max_model_len: int | None = setting(None, "Context length (prompt + output tokens) "
                                        "[default: the model's, at most 2048].", group=ENGINE)
    max_num_seqs: int = setting(32, "Most sequences in a running batch.", group=BATCHING)
    max_num_batched_tokens: int = setting(512, "Token budget of one engine step.",
                                          group=BATCHING)
    block_size: int = setting(16, "Tokens per KV-cache block.", group=BATCHING)
    num_kv_blocks: int | None = setting(None, "KV-cache blocks [default: as many as "
                                        "--kv-cache-mib holds].", group=BATCHING)
    kv_cache_mib: int = setting(256, "KV-cache memory when --num-kv-blocks is unset.",
                                group=BATCHING)
    enable_chunked_prefill: bool = setting(True, "Cut long prompts into chunks that fit the "
                                           "step budget.", "--chunked-prefill/--no-chunked-"
                                           "prefill", group=BATCHING)
    batching: Literal["continuous", "static"] = setting(
        "continuous", "continuous (iteration-level) or static (a batch admits nobody until it "
        "has finished).", group=BATCHING, cli_type=str)
    max_waiting: int = setting(256, "Waiting-queue limit; beyond it requests get 429.",
                               group=BATCHING)
    threads: int = setting(1, "Torch intra-op threads, for the steps big enough to split "
                           "(a small model's prefill chunks, a large one's every step); a "
                           "smaller step runs on one or all, whichever was faster lately.",
                           group=ENGINE)
    seed: int = setting(0, "Seed of the preset weights and of unseeded sampling.", group=ENGINE)
    dtype: str = setting("float32", "float32, bfloat16 or float16.", group=ENGINE)
    device: str = setting("auto", "cpu, cuda, or auto: CUDA when torch sees a GPU, else the "
                          "CPU.", group=ENGINE)
    enforce_eager: bool = setting(False, "On CUDA, run decode steps eagerly (no CUDA graphs).",
                                  group=ENGINE)
    attention: Literal["auto", "gather", "triton"] = setting(
        "auto", "Decode attention over the paged KV cache: `triton`, a kernel reading the "
        "blocks in place (CUDA, with triton installed); `gather`, the blocks copied per "
        "sequence then two matmuls (any device); `auto`: triton where it runs.", group=ENGINE,
        cli_type=str)
    warmup: bool = setting(True, "Warm up before reporting ready.", group=ENGINE)
    enable_prefix_caching: bool = setting(False, "Share the cached KV blocks of common prompt "
                                          "prefixes.", group=TECHNIQUES)
    scheduling_policy: str = setting("fcfs", "fcfs, or priority (the request's `priority`: "
                                     "lower is more urgent; may preempt).", group=TECHNIQUES)
    fair_share: bool = setting(False, "Tenants (X-Tenant-Id header, else `user`) share the "
                               "token budget fairly.", group=TECHNIQUES)
    max_queue_delay: float | None = setting(None, "Seconds a request may wait to be scheduled; "
                                            "then 503 with Retry-After.", group=TECHNIQUES)
    max_prefill_tokens: int | None = setting(None, "Prefill tokens per step.", group=TECHNIQUES)
    max_decode_tokens: int | None = setting(None, "Decode tokens per step (a decode batch "
                                            "cap).", group=TECHNIQUES)
    speculative_method: str | None = setting(None, "ngram (prompt lookup) or draft.",
                                             group=TECHNIQUES)
    num_speculative_tokens: int = setting(4, "Tokens proposed per step.", group=TECHNIQUES)
    speculative_model: str | None = setting(None, "The draft model (a preset or a folder).",
                                            group=TECHNIQUES)
    prompt_lookup_min: int = 2  # n-gram proposer: shortest and longest n-gram
    prompt_lookup_max: int = 4
    quantization: str | None = setting(None, "int8: weight-only, a scale per output channel.",
                                       group=TECHNIQUES)
    idle_unload: float | None = setting(None, "Unload the model after this many idle seconds; "
                                        "the next request loads it again.", group=TECHNIQUES)

    def resolve_max_model_len(self, model: Any) -> int:
        """The context: as given, else the model's positions (at most 2048)."""
        if self.max_model_len is not None:
            return self.max_model_len
        return min(DEFAULT_MAX_MODEL_LEN, model.max_position_embeddings)

    def resolve_kv_blocks(self, model: Any, element_size: int) -> int:
        if self.num_kv_blocks is not None:
            return self.num_kv_blocks
        block_bytes = self.block_size * model.kv_bytes_per_token(element_size)
        return max(1, (self.kv_cache_mib << 20) // block_bytes)

    def validate_for(self, model: Any, num_kv_blocks: int) -> None:
        """Reject settings under which some request could never finish (`model`: its
        `ModelConfig`)."""
        checks = [
            (self.block_size >= 1, "--block-size must be at least 1"),
            (self.max_num_seqs >= 1, "--max-num-seqs must be at least 1"),
            (self.max_waiting >= 1, "--max-waiting must be at least 1"),
            (self.threads >= 1, "--threads must be at least 1"),
            (self.batching in ("continuous", "static"),
             f"--batching must be continuous or static, not {self.batching!r}"),
            (self.dtype in DTYPES, f"--dtype must be one of {', '.join(DTYPES)}"),
            (2 <= self.max_model_len <= model.max_position_embeddings,
             f"--max-model-len must be between 2 and the model's "
             f"{model.max_position_embeddings} positions, not {self.max_model_len}"),
            (self.max_num_batched_tokens >= self.max_num_seqs,
             f"--max-num-batched-tokens ({self.max_num_batched_tokens}) must be at least "
             f"--max-num-seqs ({self.max_num_seqs})"),
            (self.enable_chunked_prefill or self.max_num_batched_tokens >= self.max_model_len,
             f"without chunked prefill --max-num-batched-tokens ({self.max_num_batched_tokens}) "
             f"must be at least --max-model-len ({self.max_model_len})"),
            (num_kv_blocks * self.block_size >= self.max_model_len,
             f"the KV cache ({num_kv_blocks} blocks of {self.block_size} tokens) must hold at "
             f"least one sequence of --max-model-len {self.max_model_len} tokens"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)

    def validate_techniques(self) -> None:
        """Reject bad settings of the latency techniques (before any model is loaded)."""
        for ok, message in self._technique_checks():
            if not ok:
                raise ConfigError(message)

    def _technique_checks(self) -> list[tuple[bool, str]]:
        positive = [(getattr(self, name) is None or getattr(self, name) >= 1,
                     f"--{name.replace('_', '-')} must be at least 1")
                    for name in ("max_prefill_tokens", "max_decode_tokens")]
        seconds = [(getattr(self, name) is None or getattr(self, name) > 0,
                    f"--{name.replace('_', '-')} must be a positive number of seconds")
                   for name in ("max_queue_delay", "idle_unload")]
        return positive + seconds + [
            (self.scheduling_policy in ("fcfs", "priority"),
             f"--scheduling-policy must be fcfs or priority, not {self.scheduling_policy!r}"),
            (self.speculative_method in (None, "ngram", "draft"),
             f"--speculative-method must be ngram or draft, not {self.speculative_method!r}"),
            (self.speculative_method != "draft" or self.speculative_model is not None,
             "--speculative-method draft needs --speculative-model (a preset or a folder)"),
            (self.speculative_model is None or self.speculative_method == "draft",
             "--speculative-model is for --speculative-method draft"),
            (1 <= self.num_speculative_tokens <= 16,
             "--num-speculative-tokens must be between 1 and 16"),
            (1 <= self.prompt_lookup_min <= self.prompt_lookup_max,
             "prompt_lookup_min must be at least 1 and at most prompt_lookup_max"),
            (self.quantization in (None, "int8"),
             f"--quantization must be int8, not {self.quantization!r}"),
            (self.speculative_method is None or self.batching == "continuous",
             "speculative decoding needs --batching continuous"),
        ]


class ServeConfig(BaseModel):
    """`latlab serve`: the engine, and the HTTP server in front of it."""

    engine: EngineConfig = EngineConfig()
    host: str = setting("127.0.0.1", "Interface to bind.", group=SERVER)
    port: int = setting(8000, "Port to bind.", group=SERVER, ge=0, le=65535)
    api_key: str | None = setting(None, "Require `Authorization: Bearer KEY` on /v1 (seen in "
                                  "`ps`: prefer LATLAB_API_KEY or --api-key-file).",
                                  group=SERVER)
    api_key_file: Path | None = setting(None, "Read the API key from this file's first line.",
                                        group=SERVER)
    allow_origins: list[str] = setting([], "Let web pages at this origin call the API (CORS); "
                                       "repeat for more, `*` for any.", "--allow-origin",
                                       group=SERVER)
    served_model_name: str | None = setting(None, "Model id in the API [default: --model].",
                                            group=SERVER)
    otel_file: Path | None = setting(None, "Append an OpenTelemetry span per request (stages "
                                     "as events) to this JSON-lines file.", group=TELEMETRY)
    otlp_endpoint: str | None = setting(None, "Export an OpenTelemetry span per request over "
                                        "OTLP/HTTP to this URL (e.g. latlab bench --otlp-port: "
                                        "http://127.0.0.1:PORT/v1/traces).", group=TELEMETRY)
    step_log: Path | None = setting(None, "Append one JSON line per engine step to this file: "
                                    "its start and end, tokens, decodes, prefill chunks, "
                                    "context (what latlab calibrate fits; schema docs/schema/"
                                    "step.schema.json).", group=TELEMETRY)
    engine_core: Literal["auto", "thread", "process"] = setting(
        "auto", "Where the engine's step loop runs: `process`, a process of its own (as vLLM's "
        "engine core: HTTP, tokenizing and SSE never hold up a step); `thread`, beside the "
        "HTTP server in one process; `auto`: a thread (measured faster on CPU and GPU).",
        group=SERVER)
    max_body_bytes: int = Field(default=4 << 20, ge=1)
    max_connections: int = setting(4096, "Open connections at most; beyond, a new one is "
                                   "answered 503 and closed (lowered to what the open-files "
                                   "limit allows).", group=SERVER, ge=1)
    max_connections_per_client: int = setting(1024, "Open connections at most from one client "
                                              "address; beyond, 503.", group=SERVER, ge=1)
    max_reading: int = setting(2048, "Requests whose headers or body are still arriving, at "
                               "most; beyond, the one arriving longest is cut off (408), so "
                               "real clients always get in (what slow clients hold is at most "
                               "this many bodies).", group=SERVER, ge=1)
    header_timeout_s: float = setting(5.0, "Seconds a request's headers may take (up to 50% "
                                      "more, at random), plus one per --min-rate bytes "
                                      "received; then 408.",
                                      group=SERVER, gt=0)
    body_timeout_s: float = setting(5.0, "Seconds a request's body may take once its headers "
                                    "are in (up to 50% more, at random), plus one per "
                                    "--min-rate bytes received; then 408.",
                                    group=SERVER, gt=0)
    min_rate: int = setting(1024, "Bytes per second that earn a slow client one more second "
                            "(0: the timeouts are flat).", group=SERVER, ge=0)

    @property
    def model_name(self) -> str:
        """The model's id in the API."""
        return self.served_model_name or self.engine.model


# The knobs that decide a step's batch: what a calibration keeps and the simulator schedules
# with (`EngineConfig`'s fields of the same names, the context and KV pool resolved).
SHAPE_FIELDS = ("max_num_seqs", "max_num_batched_tokens", "block_size", "enable_chunked_prefill",
                "batching", "max_waiting", "max_prefill_tokens", "max_decode_tokens",
                "scheduling_policy", "fair_share", "enable_prefix_caching")


class _Shape(Record):
    """The serving knobs that decide a step's batch (latlab serve's options of the same
    names), with the KV pool's blocks and the context resolved."""

    num_kv_blocks: int = Field(default=2730, ge=1)
    max_model_len: int = Field(default=DEFAULT_MAX_MODEL_LEN, ge=2)

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        """A calibration written before the shape took the engine's names."""
        if isinstance(data, dict) and "chunked_prefill" in data:
            data = {k: v for k, v in data.items() if k != "chunked_prefill"} | {
                "enable_chunked_prefill": data["chunked_prefill"]}
        return data

    def engine_config(self) -> EngineConfig:
        """An engine config of this shape (for the scheduler the simulator drives)."""
        return EngineConfig(**self.model_dump(), warmup=False)

    @classmethod
    def of(cls, config: EngineConfig, num_kv_blocks: int) -> EngineShape:
        """The shape of an engine started with `config` (its KV pool: `num_kv_blocks`)."""
        return EngineShape(**config.model_dump(include=set(SHAPE_FIELDS)),
                           num_kv_blocks=num_kv_blocks, max_model_len=config.max_model_len)


EngineShape = create_model(
    "EngineShape", __base__=_Shape, __module__=__name__,
    **{name: (EngineConfig.model_fields[name].annotation, EngineConfig.model_fields[name])
       for name in SHAPE_FIELDS})
