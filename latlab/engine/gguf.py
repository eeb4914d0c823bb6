"""A Hugging Face Llama checkpoint folder (as `save_checkpoint` writes it) as one GGUF file,
through the `gguf` package, so llama.cpp serves the very same model: `latlab model export
DIR --gguf`.

llama.cpp's own converter recognises a BPE tokenizer by hashing how it splits a test string,
and latlab's bundled tokenizer is in no table of it. It is GPT-2's byte-level BPE (the same
pre-tokenizer regex), so it is written as `gpt2` with the `gpt-2` pre-tokenizer; special
tokens are CONTROL tokens and the end of sequence is marked, so llama.cpp ends generation on
it; the chat template goes along. Q and K weights are permuted from Hugging Face's rotary
layout (halves) to GGML's (interleaved pairs), as llama.cpp's converter does.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

LAYER_TENSORS = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}


class GgufError(ValueError):
    """A checkpoint folder that cannot be written as GGUF (said why)."""


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """Hugging Face's rotary layout (first half, second half) to GGML's (pairs)."""
    return (w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def tensor_name(hf: str) -> str:
    """The GGUF name of a Hugging Face Llama tensor."""
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    parts = hf.split(".")
    if parts[:2] == ["model", "layers"]:
        inner = ".".join(parts[3:-1])
        if inner in LAYER_TENSORS:
            return f"blk.{parts[2]}.{LAYER_TENSORS[inner]}.{parts[-1]}"
    raise GgufError(f"no GGUF name for tensor {hf!r} (only Llama checkpoints are written)")


def write_gguf(folder: Path, out: Path | None = None) -> Path:
    """Write `folder` (config.json, model.safetensors, tokenizer) as `out` (default
    `folder/model.gguf`), float32."""
    import gguf

    out = out or folder / "model.gguf"
    hf = json.loads((folder / "config.json").read_text())
    if hf.get("model_type") != "llama":
        raise GgufError(f"{folder}: model_type {hf.get('model_type')!r}; only llama is written")
    heads, kv_heads = hf["num_attention_heads"], hf["num_key_value_heads"]
    head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
    writer = gguf.GGUFWriter(str(out), "llama")
    writer.add_name(folder.name)
    writer.add_context_length(hf["max_position_embeddings"])
    writer.add_embedding_length(hf["hidden_size"])
    writer.add_block_count(hf["num_hidden_layers"])
    writer.add_feed_forward_length(hf["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(hf["rope_theta"])
    writer.add_layer_norm_rms_eps(hf["rms_norm_eps"])
    writer.add_vocab_size(hf["vocab_size"])
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    _vocab(writer, folder, hf["vocab_size"])
    for name, value in sorted(load_file(str(folder / "model.safetensors")).items()):
        value = value.astype(np.float32)
        if name.endswith("q_proj.weight"):
            value = permute(value, heads)
        elif name.endswith("k_proj.weight"):
            value = permute(value, kv_heads)
        writer.add_tensor(tensor_name(name), value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    out.chmod(0o644)
    return out


def _vocab(writer: object, folder: Path, vocab_size: int) -> None:
    import gguf

    data = json.loads((folder / "tokenizer.json").read_text())
    model = data["model"]
    if model.get("type") != "BPE" or (data.get("pre_tokenizer") or {}).get("type") != "ByteLevel":
        raise GgufError(f"{folder}: only byte-level BPE tokenizers are written")
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    types = [gguf.TokenType.UNUSED] * vocab_size
    for text, i in model["vocab"].items():
        tokens[i], types[i] = text, gguf.TokenType.NORMAL
    for added in data.get("added_tokens", []):
        tokens[added["id"]] = added["content"]
        types[added["id"]] = (gguf.TokenType.CONTROL if added.get("special")
                              else gguf.TokenType.USER_DEFINED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    config = json.loads((folder / "tokenizer_config.json").read_text())
    ids = {a["content"]: a["id"] for a in data.get("added_tokens", [])}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    if config.get("eos_token") in ids:
        writer.add_eos_token_id(ids[config["eos_token"]])
        writer.add_eot_token_id(ids[config["eos_token"]])
    if config.get("bos_token") in ids:
        writer.add_bos_token_id(ids[config["bos_token"]])
    writer.add_add_bos_token(config.get("bos_token") is not None)
    if isinstance(config.get("chat_template"), str):
        writer.add_chat_template(config["chat_template"])
