"""Models by name: a random-weight preset, or a local Hugging Face checkpoint folder.

A folder holds config.json (Llama, Mistral or Qwen2 shape), *.safetensors and tokenizer.json.
`save_checkpoint` writes the same layout, so a preset can be served by other engines too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from latlab.engine.config import PRESETS, ModelConfig
from latlab.engine.linear import pack_linears
from latlab.engine.model import CausalLM
from latlab.engine.quantization import quantize
from latlab.tokenizer import IM_END, Tokenizer, TokenizerError

SUPPORTED_TYPES = ("llama", "mistral", "qwen2")
CPU = torch.device("cpu")
PACKED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


class ModelLoadError(Exception):
    """A model name or folder that cannot be served, with the reason."""


@dataclass
class LoadedModel:
    config: ModelConfig
    model: CausalLM
    tokenizer: Tokenizer
    stop_token_ids: list[int]


def load_model(name: str, dtype: torch.dtype, seed: int, quantization: str | None = None,
               device: torch.device = CPU) -> LoadedModel:
    """A preset name (random weights from `seed`) or the path of a checkpoint folder, read
    on the CPU and moved to `device`; `quantization` ("int8", CPU only) quantizes its linear
    layers (`quantization.py`). On the CPU the linear layers are packed for oneDNN."""
    loaded = _load(name, dtype, seed)
    if quantization is not None:
        quantize(loaded.model, quantization)
    loaded.model.to(device)
    if device.type == "cpu":
        pack_linears(loaded.model)
    return loaded


def _load(name: str, dtype: torch.dtype, seed: int) -> LoadedModel:
    if name in PRESETS:
        config = PRESETS[name]
        tokenizer = Tokenizer.default()
        model = CausalLM.random(config, seed, dtype)
        return LoadedModel(config, model, tokenizer, _stop_ids(tokenizer, []))
    folder = Path(name)
    if not (folder / "config.json").is_file():
        raise ModelLoadError(f"--model {name!r}: not a preset ({', '.join(PRESETS)}) "
                             "nor a folder with config.json")
    hf = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    config = _model_config(hf, folder)
    try:
        tokenizer = Tokenizer.load(folder)
    except TokenizerError as e:
        raise ModelLoadError(str(e)) from e
    eos = hf.get("eos_token_id")
    model = _load_weights(config, folder, dtype)
    return LoadedModel(config, model, tokenizer,
                       _stop_ids(tokenizer, eos if isinstance(eos, list) else [eos]))


def save_checkpoint(loaded: LoadedModel, folder: str | Path) -> Path:
    """Write `loaded` as a Hugging Face Llama (or Qwen2, with biases) checkpoint folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    c = loaded.config
    tensors = {}
    for name, tensor in loaded.model.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        packed = next((p for p in PACKED if f".{p}." in name), None)
        if packed is None:
            tensors[_hf_name(name)] = tensor.contiguous()
            continue
        sizes = _packed_sizes(c, packed)
        for part, piece in zip(PACKED[packed], tensor.split(sizes, dim=0)):
            tensors[_hf_name(name.replace(packed, part))] = piece.contiguous()
    save_file(tensors, str(folder / "model.safetensors"))
    hf = {
        "architectures": ["Qwen2ForCausalLM" if c.attention_bias else "LlamaForCausalLM"],
        "model_type": "qwen2" if c.attention_bias else "llama",
        "vocab_size": c.vocab_size, "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size, "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.attention_head_dim, "max_position_embeddings": c.max_position_embeddings,
        "rope_theta": c.rope_theta, "rope_scaling": c.rope_scaling,
        "rms_norm_eps": c.rms_norm_eps, "tie_word_embeddings": c.tie_word_embeddings,
        "hidden_act": "silu", "eos_token_id": loaded.tokenizer.eos_token_id,
        "torch_dtype": str(loaded.model.embed_tokens.weight.dtype).removeprefix("torch."),
    }
    (folder / "config.json").write_text(json.dumps(hf, indent=2))
    loaded.tokenizer.save_pretrained(folder)
    # safetensors writes its file 0600 whatever the umask; give it the mode the others got
    (folder / "model.safetensors").chmod((folder / "config.json").stat().st_mode & 0o777)
    return folder


def _model_config(hf: dict, folder: Path) -> ModelConfig:
    kind = hf.get("model_type")
    if kind not in SUPPORTED_TYPES:
        raise ModelLoadError(f"{folder}: model_type {kind!r} is not supported "
                             f"(supported: {', '.join(SUPPORTED_TYPES)})")
    scaling = hf.get("rope_scaling")
    if scaling and scaling.get("rope_type", scaling.get("type")) not in ("llama3", "default"):
        raise ModelLoadError(f"{folder}: rope_scaling {scaling!r} is not supported")
    try:
        return ModelConfig(
            vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"], num_layers=hf["num_hidden_layers"],
            num_heads=hf["num_attention_heads"],
            num_kv_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
            head_dim=hf.get("head_dim"),
            max_position_embeddings=hf.get("max_position_embeddings", 4096),
            rope_theta=hf.get("rope_theta", 10000.0), rope_scaling=scaling,
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            attention_bias=kind == "qwen2" or hf.get("attention_bias", False),
            tie_word_embeddings=hf.get("tie_word_embeddings", kind == "qwen2"),
        )
    except KeyError as e:
        raise ModelLoadError(f"{folder}/config.json lacks {e.args[0]!r}") from e


def _load_weights(config: ModelConfig, folder: Path, dtype: torch.dtype) -> CausalLM:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{folder}: no *.safetensors files")
    hf: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            hf.update({name: f.get_tensor(name) for name in f.keys()})
    with torch.device("meta"):
        model = CausalLM(config)
    state = {}
    for name in model.state_dict():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        packed = next((p for p in PACKED if f".{p}." in name), None)
        parts = [name.replace(packed, part) for part in PACKED[packed]] if packed else [name]
        missing = [_hf_name(p) for p in parts if _hf_name(p) not in hf]
        if missing:
            raise ModelLoadError(f"{folder}: the checkpoint lacks {missing[0]!r}")
        state[name] = torch.cat([hf.pop(_hf_name(p)) for p in parts]).to(dtype)
    model.load_state_dict(state, strict=False, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    return model.eval()


def _hf_name(name: str) -> str:
    return name if name.startswith("lm_head") else f"model.{name}"


def _packed_sizes(config: ModelConfig, packed: str) -> list[int]:
    if packed == "gate_up_proj":
        return [config.intermediate_size] * 2
    head = config.attention_head_dim
    return [config.num_heads * head, config.num_kv_heads * head, config.num_kv_heads * head]


def _stop_ids(tokenizer: Tokenizer, eos_ids: list[int | None]) -> list[int]:
    """End-of-sequence ids: the checkpoint's, the tokenizer's, and ChatML's end of turn."""
    ids = {i for i in eos_ids if isinstance(i, int)}
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    im_end = tokenizer.backend.token_to_id(IM_END)
    if im_end is not None and (tokenizer.chat_template is None
                               or IM_END in tokenizer.chat_template):
        ids.add(im_end)
    return sorted(ids)
