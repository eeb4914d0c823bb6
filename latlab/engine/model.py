"""A Llama-family decoder (RMSNorm, rotary embeddings, grouped-query attention, SwiGLU).

Tokens of a step arrive flattened, `[num_tokens, hidden]`, so every linear layer runs once per
step whatever the mix of prefills and decodes. Attention reads and writes a paged KV cache
described by `AttentionMetadata`; with no metadata the model runs a plain dense causal pass
over one sequence (the reference the paged path is tested against). Decodes attend either
over their blocks gathered into one tensor (`gather`, any device) or with a kernel that reads
the blocks in place (`triton`, `paged_attention`; `CausalLM.set_attention` picks).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from latlab.engine.config import ModelConfig
from latlab.engine.paged_attention import Backend, paged_decode


@dataclass
class PrefillChunk:
    """A run of new tokens of one sequence: batch rows [start, end), `context_len` after it."""

    start: int
    end: int
    context_len: int
    block_table: torch.Tensor
    mask: torch.Tensor | None  # [end - start, context_len]; None when causal from position 0


@dataclass
class QueryGroup:
    """Sequences with `num_queries` new tokens each (a decode: 1; a decode with speculative
    tokens: 1 + k), attended in one batched call, their block tables padded alike.

    Rows [start, end) hold the sequences one after another, `num_queries` rows each.
    """

    start: int
    end: int
    num_queries: int
    block_tables: torch.Tensor  # [seqs, max_blocks]
    bias: torch.Tensor  # [seqs, 1, num_queries, max_blocks * block_size]: 0 or -inf, float32
    lengths: torch.Tensor  # [seqs]: the keys of each sequence, its new tokens' included


@dataclass
class AttentionMetadata:
    """Where one step's tokens go in the KV cache and what each attends to.

    Groups of short query runs come first, by length and then by similar context length
    (padding every decode to the longest context would multiply the KV bytes read); each
    longer prefill chunk gets its own call.
    """

    slot_mapping: torch.Tensor
    groups: list[QueryGroup]
    prefills: list[PrefillChunk]


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    dim = config.attention_head_dim
    steps = torch.arange(0, dim, 2, dtype=torch.float64, device="cpu")
    inv_freq = 1.0 / (config.rope_theta ** (steps / dim))
    scaling = config.rope_scaling or {}
    if scaling.get("rope_type", scaling.get("type")) == "llama3":
        factor = scaling["factor"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        smooth = (old_len / wavelen - low) / (high - low)
        scaled = (1 - smooth) * inv_freq / factor + smooth * inv_freq
        inv_freq = torch.where(wavelen > old_len / low, inv_freq / factor,
                               torch.where(wavelen < old_len / high, inv_freq, scaled))
    return inv_freq


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads = config.num_heads, config.num_kv_heads
        self.head_dim = config.attention_head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = nn.Linear(config.hidden_size, self.q_size + 2 * self.kv_size,
                                  bias=config.attention_bias)
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=False)
        self.k_cache = torch.empty(0)
        self.v_cache = torch.empty(0)
        self.backend: Backend = "gather"

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                meta: AttentionMetadata | None) -> torch.Tensor:
        n, heads = x.shape[0], self.num_heads + self.num_kv_heads
        qk, v = self.qkv_proj(x).split([self.q_size + self.kv_size, self.kv_size], dim=-1)
        # Queries and keys take their rotary embedding in one pass.
        q, k = apply_rope(qk.view(n, heads, self.head_dim), cos, sin).split(
            [self.num_heads, self.num_kv_heads], dim=1)
        v = v.view(n, self.num_kv_heads, self.head_dim)
        if meta is None:
            out = _sdpa(q, k.transpose(0, 1), v.transpose(0, 1), mask=None)
        else:
            out = self._paged(q, k, v, meta)
        return self.o_proj(out.reshape(n, self.q_size))

    def _paged(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               meta: AttentionMetadata) -> torch.Tensor:
        slots = self.k_cache.view(self.num_kv_heads, -1, self.head_dim)
        slots.index_copy_(1, meta.slot_mapping, k.transpose(0, 1))
        self.v_cache.view_as(slots).index_copy_(1, meta.slot_mapping, v.transpose(0, 1))
        out = torch.empty_like(q)
        for group in meta.groups:
            rows = q[group.start : group.end]
            if self.backend == "triton" and group.num_queries == 1:
                out[group.start : group.end] = paged_decode(
                    rows, self.k_cache, self.v_cache, group.block_tables, group.lengths)
            else:
                out[group.start : group.end] = self._grouped(rows, group)
        for chunk in meta.prefills:
            if chunk.mask is None:  # the chunk is the whole context: its keys, no gather
                keys = k[chunk.start : chunk.end].transpose(0, 1)
                values = v[chunk.start : chunk.end].transpose(0, 1)
            else:
                keys = _gather(self.k_cache, chunk.block_table)[:, : chunk.context_len]
                values = _gather(self.v_cache, chunk.block_table)[:, : chunk.context_len]
            out[chunk.start : chunk.end] = _sdpa(q[chunk.start : chunk.end], keys, values,
                                                 chunk.mask)
        return out

    def _grouped(self, q: torch.Tensor, group: QueryGroup) -> torch.Tensor:
        """Attention of a group as two batched matmuls around a float32 softmax, batched over
        (KV head, sequence): with the head-major cache every operand is contiguous, several
        times faster on a CPU than SDPA for a few queries per sequence (bf16 above all)."""
        seqs, nq = group.block_tables.shape[0], group.num_queries
        kv_heads, dim = self.num_kv_heads, self.head_dim
        per_kv = self.num_heads // kv_heads
        tables = group.block_tables.flatten()
        keys = _gather(self.k_cache, tables).view(kv_heads * seqs, -1, dim)
        values = _gather(self.v_cache, tables).view(kv_heads * seqs, -1, dim)
        # Query head h reads KV head h // per_kv: [kv_heads * seqs, per_kv * nq, dim].
        q = (q * dim**-0.5).view(seqs, nq, kv_heads, per_kv, dim).permute(2, 0, 3, 1, 4)
        scores = torch.bmm(q.reshape(kv_heads * seqs, per_kv * nq, dim), keys.transpose(1, 2))
        scores = scores.view(kv_heads, seqs, per_kv, nq, -1).float() + group.bias
        probs = scores.softmax(dim=-1).to(q.dtype).view(kv_heads * seqs, per_kv * nq, -1)
        out = torch.bmm(probs, values).view(kv_heads, seqs, per_kv, nq, dim)
        return out.permute(1, 3, 0, 2, 4).reshape(seqs * nq, self.num_heads, dim)


def _gather(cache: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    """The cached tokens of `block_ids`, in order: `[heads, len(block_ids) * block_size, dim]`."""
    return cache.index_select(1, block_ids).flatten(1, 2)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
          mask: torch.Tensor | None) -> torch.Tensor:
    """Attention for one sequence: queries `[tokens, heads, dim]` in and out, keys and values
    `[kv_heads, tokens, dim]`; causal when no mask. 4-D inputs: with 3-D ones torch's CPU
    flash kernel is skipped for the slower math path."""
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0),
        attn_mask=mask, is_causal=mask is None, enable_gqa=True,
    )
    return out.squeeze(0).transpose(0, 1)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                meta: AttentionMetadata | None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, meta)
        return x + self.mlp(self.post_attention_layernorm(x))


class CausalLM(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        # On the CPU even when the weights are built on the meta device (checkpoint loading).
        positions = torch.arange(config.max_position_embeddings, dtype=torch.float64, device="cpu")
        angles = torch.outer(positions, rope_inv_freq(config))
        self.register_buffer("rope_cos", angles.cos().float(), persistent=False)
        self.register_buffer("rope_sin", angles.sin().float(), persistent=False)

    @classmethod
    def random(cls, config: ModelConfig, seed: int, dtype: torch.dtype) -> CausalLM:
        """Random weights, the same for a given (config, seed) on any machine: drawn on the
        CPU (the loader moves them to the engine's device)."""
        with torch.device("cpu"):
            model = cls(config)
        generator = torch.Generator(device="cpu").manual_seed(seed)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("layernorm.weight") or name == "norm.weight":
                    param.fill_(1.0)
                elif name.endswith("bias"):
                    param.normal_(0.0, 0.02, generator=generator)
                else:
                    param.normal_(0.0, 1.0 / math.sqrt(param.shape[-1]), generator=generator)
        return model.to(dtype).eval()

    def set_attention(self, backend: Backend) -> None:
        """How decodes attend over the paged cache (`paged_attention.resolve_backend`)."""
        for layer in self.layers:
            layer.self_attn.backend = backend

    def allocate_kv_cache(self, num_blocks: int, block_size: int) -> None:
        weight = self.embed_tokens.weight
        for layer in self.layers:
            attn = layer.self_attn
            # Head-major, so that a sequence's keys of one head gather contiguously.
            shape = (attn.num_kv_heads, num_blocks, block_size, attn.head_dim)
            attn.k_cache = torch.zeros(shape, dtype=weight.dtype, device=weight.device)
            attn.v_cache = torch.zeros(shape, dtype=weight.dtype, device=weight.device)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata | None = None) -> torch.Tensor:
        """Hidden states `[num_tokens, hidden]` for flattened tokens at `positions`."""
        dtype = self.embed_tokens.weight.dtype
        cos = self.rope_cos[positions].unsqueeze(1).to(dtype)
        sin = self.rope_sin[positions].unsqueeze(1).to(dtype)
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x, cos, sin, meta)
        return self.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()
