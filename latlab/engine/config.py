"""Model shapes: the presets, or a checkpoint's config.json. The engine's serving knobs are
`latlab.records.engine.EngineConfig`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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
