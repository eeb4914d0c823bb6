"""How the linear layers run on a CPU: oneDNN with weights packed once at load time.

`F.linear` on float32 goes to MKL's GEMM, which is slow for the few rows of a decode step;
oneDNN (what torch.compile's CPU backend uses for a frozen model's linear layers) with the
weight reordered once into its blocked layout computes the same float32 result 2 to 2.5x
faster at every batch size here, and bf16 2x faster for one row (`benchmarks/engine_step.py`
measures the whole step). `PackedLinear` keeps the plain weight too, so state dicts,
checkpoints and tied embeddings see an ordinary `nn.Linear` weight; where oneDNN cannot pack
a dtype (float16 without AVX-512 FP16) the layer stays an `nn.Linear`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# The batch size oneDNN picks the packed layout for; measured just as fast from 1 to 512 rows.
PACK_FOR_ROWS = 16


class PackedLinear(nn.Module):
    def __init__(self, linear: nn.Linear, packed: torch.Tensor) -> None:
        super().__init__()
        self.weight = linear.weight
        self.bias = linear.bias
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self._packed = packed  # not a parameter or buffer: outside the state dict

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2:
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self._packed, self.bias, "none", [], "")


def pack(linear: nn.Linear) -> nn.Module:
    """`linear` as a `PackedLinear`, or unchanged when oneDNN cannot pack it."""
    if not (torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return linear
    try:
        with torch.no_grad():
            packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(),
                                                             PACK_FOR_ROWS)
    except RuntimeError:
        return linear
    return PackedLinear(linear, packed)


def pack_linears(model: nn.Module) -> nn.Module:
    """Replace every `nn.Linear` of `model` by its packed form, in place."""
    targets = [(name, module) for name, module in model.named_modules()
               if type(module) is nn.Linear]
    for name, module in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, pack(module))
    return model
