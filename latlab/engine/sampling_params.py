"""What a request asks of generation: how many tokens, how to sample them, when to stop."""

from __future__ import annotations

from dataclasses import dataclass

# Below this temperature sampling is greedy: dividing logits by it would overflow to inf/NaN.
GREEDY_BELOW = 1e-5
# What torch.Generator.manual_seed takes.
SEED_RANGE = (-(1 << 63), (1 << 64) - 1)


@dataclass(frozen=True)
class SamplingParams:
    """Greedy when temperature is 0 (or below GREEDY_BELOW); `top_k` 0 and `top_p` 1 switch
    those filters off.

    `ignore_eos` and `min_tokens` let benchmarks fix output lengths: the first keeps going past
    the end-of-sequence token, the second forbids stopping (EOS, stop tokens and stop strings)
    before that many tokens. A `top_k` above the vocabulary keeps every token.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0

    def __post_init__(self) -> None:
        checks = [
            (self.max_tokens >= 1, "max_tokens must be at least 1"),
            (self.temperature >= 0, "temperature must be 0 or more"),
            (0 < self.top_p <= 1, "top_p must be in (0, 1]"),
            (self.top_k >= 0, "top_k must be 0 (off) or more"),
            (self.seed is None or SEED_RANGE[0] <= self.seed <= SEED_RANGE[1],
             f"seed must be in [{SEED_RANGE[0]}, {SEED_RANGE[1]}]"),
            (0 <= self.min_tokens <= self.max_tokens, "min_tokens must be in [0, max_tokens]"),
            (all(self.stop), "stop strings must not be empty"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
