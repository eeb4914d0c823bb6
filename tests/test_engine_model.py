"""The paged engine computes exactly what a plain dense forward pass computes."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
import torch

from latlab.engine.config import ModelConfig
from latlab.engine.engine import LLMEngine
from latlab.engine.loader import LoadedModel, ModelLoadError, load_model, save_checkpoint
from latlab.engine.model import CausalLM, rope_inv_freq
from latlab.engine.sampling_params import SamplingParams
from latlab.records.engine import ConfigError, EngineConfig
from latlab.tokenizer import Tokenizer

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


@torch.inference_mode()
def dense_greedy(model: CausalLM, prompt: list[int], n: int) -> list[int]:
    """Full recompute, no cache: the reference, on the model's device."""
    device = model.embed_tokens.weight.device
    ids = list(prompt)
    for _ in range(n):
        hidden = model(torch.tensor(ids, device=device), torch.arange(len(ids), device=device))
        ids.append(int(model.compute_logits(hidden[-1:]).argmax()))
    return ids[len(prompt):]


def prompts(lengths: list[int], seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 8192, (n,), generator=g).tolist() for n in lengths]


def engine(**options: object) -> LLMEngine:
    base = dict(model="tiny", max_model_len=128, block_size=4, num_kv_blocks=64,
                max_num_seqs=4, max_num_batched_tokens=16)
    return LLMEngine(EngineConfig(**{**base, **options}))


@pytest.mark.parametrize("options", [
    {},                                              # chunked prefill, continuous batching
    {"num_kv_blocks": 32},                           # a pool so small it preempts
    {"enable_chunked_prefill": False, "max_num_batched_tokens": 128},
    {"batching": "static"},
])
def test_paged_engine_matches_dense_reference(options):
    e = engine(**options)
    batch = prompts([5, 45, 17, 1, 38, 9, 23])
    seqs = e.generate(batch, GREEDY)
    model = e.runner.model
    for seq, prompt in zip(seqs, batch):
        assert seq.output_token_ids == dense_greedy(model, prompt, 12)
    if options.get("num_kv_blocks") == 32:
        assert e.stats().num_preemptions > 0
    assert e.stats().num_free_blocks == e.stats().num_blocks


def test_the_reference_depends_on_the_whole_prompt():
    # Guards the test above: a model whose output ignored early tokens could not tell a
    # broken attention from a working one.
    model = engine().runner.model
    a = prompts([30])[0]
    b = [(a[0] + 1) % 8192] + a[1:]
    assert dense_greedy(model, a, 8) != dense_greedy(model, b, 8)


def test_checkpoint_round_trip(tmp_path):
    tiny = load_model("tiny", torch.float32, seed=3)
    folder = save_checkpoint(tiny, tmp_path / "ckpt")
    assert {p.name for p in folder.iterdir()} >= {"config.json", "model.safetensors",
                                                  "tokenizer.json"}
    e = engine(model=str(folder))
    prompt = prompts([20])[0]
    assert e.generate([prompt], GREEDY)[0].output_token_ids == dense_greedy(tiny.model, prompt, 12)


@pytest.mark.parametrize("umask", [0o022, 0o077], ids=["umask-022", "umask-077"])
def test_every_file_of_a_checkpoint_gets_the_umasks_mode(tmp_path, umask):
    previous = os.umask(umask)
    try:
        folder = save_checkpoint(load_model("tiny", torch.float32, seed=3), tmp_path / "ckpt")
    finally:
        os.umask(previous)
    modes = {p.name: p.stat().st_mode & 0o777 for p in folder.iterdir()}
    assert "model.safetensors" in modes and set(modes.values()) == {0o666 & ~umask}, modes


def test_qwen2_shaped_checkpoint_with_biases_and_untied_head(tmp_path):
    config = ModelConfig(vocab_size=8192, hidden_size=64, intermediate_size=96, num_layers=2,
                         num_heads=4, num_kv_heads=1, max_position_embeddings=256,
                         attention_bias=True, tie_word_embeddings=False, rope_theta=1e6)
    model = CausalLM.random(config, seed=5, dtype=torch.float32)
    tokenizer = Tokenizer.default()
    folder = save_checkpoint(LoadedModel(config, model, tokenizer, []), tmp_path / "qwen")
    loaded = load_model(str(folder), torch.float32, seed=0)
    assert loaded.config == replace(config, head_dim=16)
    ids = torch.tensor(prompts([16])[0])
    with torch.inference_mode():
        expected = model.compute_logits(model(ids, torch.arange(16)))
        actual = loaded.model.compute_logits(loaded.model(ids, torch.arange(16)))
    torch.testing.assert_close(actual, expected)


def test_bad_models_and_configs_are_refused_clearly(tmp_path):
    with pytest.raises(ModelLoadError, match="not a preset"):
        load_model(str(tmp_path / "missing"), torch.float32, seed=0)
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(ModelLoadError, match="model_type 'gpt2' is not supported"):
        load_model(str(tmp_path), torch.float32, seed=0)
    with pytest.raises(ConfigError, match="must hold at least one sequence"):
        engine(num_kv_blocks=8)
    with pytest.raises(ConfigError, match="without chunked prefill"):
        engine(enable_chunked_prefill=False)


def test_add_request_validates_the_prompt():
    e = engine()
    with pytest.raises(ValueError, match="empty"):
        e.add_request("a", [], GREEDY)
    with pytest.raises(ValueError, match="must be in"):
        e.add_request("b", [8192], GREEDY)
    with pytest.raises(ValueError, match="context holds 128"):
        e.add_request("c", [1] * 128, GREEDY)
    e.add_request("d", [1, 2], GREEDY)
    with pytest.raises(ValueError, match="already in the engine"):
        e.add_request("d", [1, 2], GREEDY)


def test_llama3_rope_scaling_stretches_only_the_low_frequencies():
    base = ModelConfig(vocab_size=8192, hidden_size=64, intermediate_size=96, num_layers=1,
                       num_heads=1, num_kv_heads=1, rope_theta=500000.0)
    scaled = replace(base, rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": 8192})
    plain, stretched = rope_inv_freq(base), rope_inv_freq(scaled)
    assert stretched[0] == plain[0]                                  # fastest: untouched
    torch.testing.assert_close(stretched[-1], plain[-1] / 8.0)       # slowest: / factor
    assert torch.all(stretched <= plain) and torch.all(stretched >= plain / 8.0)


def test_export_commands_write_loadable_folders(tmp_path):
    from typer.testing import CliRunner

    from latlab.cli import app

    runner = CliRunner()
    result = runner.invoke(app, ["tokenizer", "export", str(tmp_path / "tok")])
    assert result.exit_code == 0, result.output
    exported = Tokenizer.load(tmp_path / "tok")
    assert exported.encode("hello world") == Tokenizer.default().encode("hello world")
    assert exported.eos_token == "<|eos|>"
    result = runner.invoke(app, ["model", "export", str(tmp_path / "m"), "--model", "tiny"])
    assert result.exit_code == 0, result.output
    assert load_model(str(tmp_path / "m"), torch.float32, seed=9).config.num_layers == 2
    result = runner.invoke(app, ["model", "export", str(tmp_path / "x"), "--model", "huge"])
    assert result.exit_code == 2 and "--model must be one of" in result.output
