"""Model shapes (presets or a checkpoint's config.json) and the engine's serving knobs."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

DTYPES = ("float32", "bfloat16", "float16")


class ConfigError(ValueError):
    """A configuration that cannot work, with a message naming the option."""


@dataclass(frozen=True)
class ModelConfig:
    """The shape of a Llama-family decoder (Llama, Mistral, Qwen2)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int | None = None
    max_position_embeddings: int = 4096
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    rms_norm_eps: float = 1e-6
    attention_bias: bool = False
    tie_word_embeddings: bool = True

    @property
    def attention_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def num_parameters(self) -> int:
        d, h = self.hidden_size, self.attention_head_dim
        attention = d * h * (self.num_heads * 2 + self.num_kv_heads * 2)
        if self.attention_bias:
            attention += h * (self.num_heads + 2 * self.num_kv_heads)
        layer = attention + 3 * d * self.intermediate_size + 2 * d
        embeddings = self.vocab_size * d * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * layer + embeddings + d

    def kv_bytes_per_token(self, element_size: int) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.attention_head_dim * element_size


# Random-weight presets over the bundled tokenizer (vocab 8192).
PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(
        vocab_size=8192, hidden_size=64, intermediate_size=128, num_layers=2,
        num_heads=4, num_kv_heads=2, max_position_embeddings=1024,
    ),
    "default": ModelConfig(
        vocab_size=8192, hidden_size=384, intermediate_size=1024, num_layers=6,
        num_heads=6, num_kv_heads=2, max_position_embeddings=4096,
    ),
}


DEFAULT_MAX_MODEL_LEN = 2048


@dataclass
class EngineConfig:
    """How the engine serves: memory, batching and scheduling limits.

    `num_kv_blocks` fixes the KV pool size; without it the pool gets `kv_cache_mib` of memory.
    `max_model_len` defaults to the model's positions, at most `DEFAULT_MAX_MODEL_LEN`.
    """

    model: str = "default"
    max_model_len: int | None = None
    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_mib: int = 256
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 512
    enable_chunked_prefill: bool = True
    batching: Literal["continuous", "static"] = "continuous"
    max_waiting: int = 256
    threads: int = 1
    seed: int = 0
    dtype: str = "float32"
    device: str = "cpu"           # cpu, cuda, or auto (CUDA when available; `latlab serve`'s)
    enforce_eager: bool = False   # on CUDA, no CUDA graphs for decode steps
    warmup: bool = True
    # Latency techniques, each off by default (see the README's engine section).
    enable_prefix_caching: bool = False
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    fair_share: bool = False                # tenants (the `user` field) share the budget
    max_queue_delay: float | None = None    # seconds a request may wait before it is refused
    max_prefill_tokens: int | None = None   # prefill tokens per step [max_num_batched_tokens]
    max_decode_tokens: int | None = None    # decode tokens per step: the decode batch cap
    speculative_method: Literal["ngram", "draft"] | None = None
    num_speculative_tokens: int = 4
    speculative_model: str | None = None    # the draft model: a preset or a folder
    prompt_lookup_min: int = 2              # n-gram proposer: shortest and longest n-gram
    prompt_lookup_max: int = 4
    quantization: Literal["int8"] | None = None
    idle_unload: float | None = None        # seconds idle before the model is unloaded

    def with_overrides(self, **changes: Any) -> EngineConfig:
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    def resolve_max_model_len(self, model: ModelConfig) -> int:
        if self.max_model_len is not None:
            return self.max_model_len
        return min(DEFAULT_MAX_MODEL_LEN, model.max_position_embeddings)

    def resolve_kv_blocks(self, model: ModelConfig, element_size: int) -> int:
        if self.num_kv_blocks is not None:
            return self.num_kv_blocks
        block_bytes = self.block_size * model.kv_bytes_per_token(element_size)
        return max(1, (self.kv_cache_mib << 20) // block_bytes)

    def validate(self, model: ModelConfig, num_kv_blocks: int) -> None:
        """Reject settings under which some request could never finish."""
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
