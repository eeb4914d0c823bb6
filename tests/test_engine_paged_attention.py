"""Decode attention read in place (`--attention triton`) against the gather: the same output on
scattered blocks, the same greedy tokens through the engine, and where the kernel may run.

On a CUDA GPU the kernel runs compiled (`scripts/gpu_check.sh` runs this file there); on a CPU
it runs in Triton's interpreter (TRITON_INTERPRET=1), when triton is installed (CUDA builds of
torch bring it; the CPU wheel does not: then those tests skip).
"""

from __future__ import annotations

import pytest
import torch

from latlab.engine import paged_attention
from latlab.engine.config import PRESETS, ModelConfig
from latlab.engine.engine import LLMEngine
from latlab.engine.model import Attention, QueryGroup
from latlab.engine.paged_attention import paged_decode, resolve_backend
from latlab.engine.sampling_params import SamplingParams
from latlab.records.engine import ConfigError, EngineConfig

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
needs_triton = pytest.mark.skipif(not paged_attention.triton_installed(),
                                  reason="triton is not installed (the CPU wheel of torch "
                                         "comes without it)")
BLOCK = 4


@pytest.fixture
def kernel_runs_here(monkeypatch):
    """On a CPU, Triton's interpreter (read when the kernel is first built)."""
    if DEVICE.type == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "1")


def test_auto_is_the_gather_on_a_cpu_and_triton_only_where_it_runs(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(paged_attention, "triton_installed", lambda: True)
    assert resolve_backend("auto", cpu, 64) == "gather"
    assert resolve_backend("auto", cuda, 64) == "triton"
    assert resolve_backend("auto", cuda, 80) == "gather"  # not a power of two
    assert resolve_backend("gather", cuda, 64) == "gather"
    with pytest.raises(ConfigError, match="runs on CUDA .* use --attention gather"):
        resolve_backend("triton", cpu, 64)
    with pytest.raises(ConfigError, match="power-of-two head dimension, not 80"):
        resolve_backend("triton", cuda, 80)
    with pytest.raises(ConfigError, match="--attention must be one of auto, gather, triton"):
        resolve_backend("flash", cuda, 64)
    monkeypatch.setattr(paged_attention, "triton_installed", lambda: False)
    assert resolve_backend("auto", cuda, 64) == "gather"
    with pytest.raises(ConfigError, match="triton package is not installed"):
        resolve_backend("triton", cuda, 64)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(paged_attention, "triton_installed", lambda: True)
    assert resolve_backend("triton", cpu, 64) == "triton"


def test_the_engine_refuses_triton_where_it_cannot_run(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ConfigError, match="--attention triton"):
        LLMEngine(EngineConfig(model="tiny", device="cpu", attention="triton", warmup=False))
    engine = LLMEngine(EngineConfig(model="tiny", device="cpu", warmup=False))
    assert engine.attention == "gather"
    assert {layer.self_attn.backend for layer in engine.runner.model.layers} == {"gather"}


def scattered_case(shape: ModelConfig, lengths: list[int], dtype: torch.dtype, seed: int = 0
                   ) -> tuple[Attention, torch.Tensor, QueryGroup]:
    """One layer's decode attention: each sequence's blocks scattered over the pool, the
    tables padded with block 0 (never read), a filled cache."""
    g = torch.Generator().manual_seed(seed)
    attention = Attention(shape).to(dtype=dtype, device=DEVICE)
    width = -(-max(lengths) // BLOCK)
    pool = len(lengths) * width + 1
    kv_shape = (attention.num_kv_heads, pool, BLOCK, attention.head_dim)
    attention.k_cache = torch.randn(kv_shape, generator=g).to(DEVICE, dtype)
    attention.v_cache = torch.randn(kv_shape, generator=g).to(DEVICE, dtype)
    blocks = (torch.randperm(pool - 1, generator=g) + 1).tolist()
    tables = []
    for n in lengths:
        used = -(-n // BLOCK)
        tables.append([blocks.pop() for _ in range(used)] + [0] * (width - used))
    keys = torch.arange(width * BLOCK)
    length = torch.tensor(lengths)
    bias = torch.zeros(len(lengths), 1, 1, width * BLOCK)
    bias.masked_fill_(keys >= length.view(-1, 1, 1, 1), -torch.inf)
    group = QueryGroup(0, len(lengths), 1, torch.tensor(tables, device=DEVICE),
                       bias.to(DEVICE), length.to(DEVICE))
    q = torch.randn(len(lengths), attention.num_heads, attention.head_dim, generator=g)
    return attention, q.to(DEVICE, dtype), group


@needs_triton
@pytest.mark.parametrize("shape", ["tiny", "default"])
def test_the_kernel_attends_as_the_gather_over_scattered_blocks(shape, kernel_runs_here):
    # lengths inside a block, on its edge, one key, and longer than KEYS_PER_ITERATION
    attention, q, group = scattered_case(PRESETS[shape], [1, 4, 7, 70, 133], torch.float32)
    with torch.inference_mode():
        expected = attention._grouped(q, group)
        got = paged_decode(q, attention.k_cache, attention.v_cache, group.block_tables,
                           group.lengths)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)
    # the query heads of one KV head differ (grouped-query attention kept apart)
    assert not torch.allclose(got[:, 0], got[:, 1])


@needs_triton
def test_the_engine_decodes_the_same_greedy_tokens_with_either_attention(kernel_runs_here):
    base = dict(model="tiny", device=DEVICE.type, max_model_len=128, block_size=BLOCK,
                num_kv_blocks=96, max_num_seqs=4, max_num_batched_tokens=32, warmup=False)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 8192, (n,), generator=g).tolist() for n in (5, 20, 3, 11, 9)]
    greedy = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    tokens = {}
    for backend in ("gather", "triton"):
        engine = LLMEngine(EngineConfig(**base, attention=backend))
        assert engine.attention == backend
        used = []
        decode = paged_attention.paged_decode

        def counted(*args, used=used, decode=decode):
            used.append(args[0].shape[0])
            return decode(*args)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr("latlab.engine.model.paged_decode", counted)
            tokens[backend] = [s.output_token_ids for s in engine.generate(prompts, greedy)]
        assert bool(used) == (backend == "triton")
    assert tokens["triton"] == tokens["gather"]
