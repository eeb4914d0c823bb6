"""`latlab model export --gguf`: a GGUF file llama.cpp reads as the same Llama model."""

import numpy as np
import pytest
from typer.testing import CliRunner

from latlab.cli import app

gguf = pytest.importorskip("gguf")
pytest.importorskip("torch")


def field(reader, key: str):
    f = reader.fields[key]
    value = f.parts[f.data[0]]
    return bytes(value).decode() if f.types[0] == gguf.GGUFValueType.STRING else value[0]


def test_the_exported_gguf_holds_the_model_and_its_tokenizer(tmp_path):
    from safetensors.numpy import load_file

    from latlab.engine.gguf import permute

    result = CliRunner().invoke(app, ["model", "export", str(tmp_path / "m"), "--model", "tiny",
                                      "--gguf"])
    assert result.exit_code == 0, result.output
    reader = gguf.GGUFReader(str(tmp_path / "m" / "model.gguf"))
    assert field(reader, "general.architecture") == "llama"
    assert field(reader, "tokenizer.ggml.model") == "gpt2"
    assert field(reader, "tokenizer.ggml.pre") == "gpt-2"
    eos = int(field(reader, "tokenizer.ggml.eos_token_id"))
    types = reader.fields["tokenizer.ggml.token_type"]
    assert int(types.parts[types.data[eos]][0]) == gguf.TokenType.CONTROL
    tensors = {t.name: t for t in reader.tensors}
    hf = load_file(str(tmp_path / "m" / "model.safetensors"))
    assert set(tensors) >= {"token_embd.weight", "output_norm.weight", "blk.0.attn_q.weight",
                            "blk.0.ffn_down.weight"}
    assert len(tensors) == len(hf)  # tied embeddings: no output.weight
    q = hf["model.layers.0.self_attn.q_proj.weight"]
    heads = int(field(reader, "llama.attention.head_count"))
    written = np.asarray(tensors["blk.0.attn_q.weight"].data).reshape(q.shape)
    assert np.array_equal(written, permute(q, heads)) and not np.array_equal(written, q)
    assert (tmp_path / "m" / "model.gguf").stat().st_mode & 0o777 == 0o644
