"""Where the engine runs (`--device cpu|cuda|auto`) and what only one kind of device can do.

Weights, the KV cache and every tensor of a step live on the engine's device; the sampled
token ids cross to the host once per step. The oneDNN packed linear layers (`linear.py`) and
the int8 kernel (`quantization.py`) are CPU kernels; CUDA graphs (`cuda_graphs.py`) are CUDA's.
"""

from __future__ import annotations

import torch

from latlab.records.engine import ConfigError

DEVICES = ("auto", "cpu", "cuda")


def resolve_device(name: str, quantization: str | None = None) -> torch.device:
    """`auto` is CUDA when torch sees a GPU, else the CPU. Raises ConfigError for `cuda`
    without one, and for a setting the device cannot run."""
    if name not in DEVICES:
        raise ConfigError(f"--device must be one of {', '.join(DEVICES)}, not {name!r}")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise ConfigError(f"--device cuda: no CUDA GPU is available (torch {torch.__version__}, "
                          f"{build})")
    if name == "cuda" and quantization == "int8":
        raise ConfigError("--quantization int8 runs on the CPU only (its kernel, "
                          "torch._weight_int8pack_mm, is a CPU kernel); use --device cpu")
    return torch.device(name)
