"""Weight-only int8 quantization of the linear layers (`--quantization int8`).

Each output channel of a weight gets its own scale (its largest magnitude / 127); weights are
stored as int8 and multiplied by `torch._weight_int8pack_mm`, torch's own CPU kernel for
int8 weight-only matmuls (the one torchao's int8 weight-only path calls on a CPU). That
kernel is vectorized for bfloat16 activations only (for float32 it falls back to a scalar
loop 20x slower), so activations go through it in bfloat16 and come back in the model's dtype.
The embedding table stays as it is; the tied output head gets its own int8 copy.
"""

from __future__ import annotations

import torch
from torch import nn

QUANTIZATIONS = ("int8",)
# The linear layers of `CausalLM` that are quantized (by module name suffix).
QUANTIZED = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head")
COMPUTE_DTYPE = torch.bfloat16


class Int8Linear(nn.Module):
    """`y = x @ (w_int8 * scale).T + bias`, one scale per output channel."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        weight = linear.weight.detach().float()
        scale = weight.abs().amax(dim=1).clamp_min(1e-12) / 127.0
        self.register_buffer("weight", (weight / scale[:, None]).round().to(torch.int8))
        self.register_buffer("scale", scale.to(COMPUTE_DTYPE))
        bias = linear.bias
        self.register_buffer("bias", None if bias is None else bias.detach().clone())
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(COMPUTE_DTYPE)
        y = torch._weight_int8pack_mm(flat, self.weight, self.scale).to(x.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)

    def dequantized(self) -> torch.Tensor:
        return self.weight.float() * self.scale.float()[:, None]


def quantize(model: nn.Module, method: str) -> nn.Module:
    """Replace the model's linear layers in place with quantized ones; returns the model."""
    if method not in QUANTIZATIONS:
        raise ValueError(f"unknown quantization {method!r} (supported: {', '.join(QUANTIZATIONS)})")
    targets = [(name, module) for name, module in model.named_modules()
               if isinstance(module, nn.Linear) and name.split(".")[-1] in QUANTIZED]
    for name, module in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, Int8Linear(module))
    return model
