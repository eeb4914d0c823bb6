"""Decode attention that reads the paged KV cache in place (`--attention triton`).

The engine's other path (`gather`, `model.Attention._grouped`) first copies each sequence's
KV blocks into one tensor, then attends with two batched matmuls: on an H200 that copy was the
largest single cost of a batch-64 decode step. This Triton kernel reads the keys and values
from their blocks where they lie instead: one program per (sequence, KV head), an online
softmax over `KEYS_PER_ITERATION` keys at a time, the query heads of one KV head together
(`benchmarks/engine_attention.py` measures both). It serves queries of one token each (a
decode); a group with speculative tokens, and prefill chunks, keep the gather.

Triton compiles for CUDA; on a CPU it runs only in its interpreter (`TRITON_INTERPRET=1`,
slow: what the tests use to compare it with the gather). The kernel is built on first use,
so that the interpreter setting is read then.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from typing import Literal

import torch

from latlab.records.engine import ConfigError

ATTENTION_BACKENDS = ("auto", "gather", "triton")
Backend = Literal["gather", "triton"]
KEYS_PER_ITERATION = 64


def triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def kernel_fits(head_dim: int) -> bool:
    """The kernel's register tiles need a power-of-two head dimension."""
    return head_dim >= 1 and head_dim & (head_dim - 1) == 0


def resolve_backend(name: str, device: torch.device, head_dim: int) -> Backend:
    """`auto` is `triton` on CUDA with triton installed and a head dimension it fits, else
    `gather`. Raises ConfigError for `triton` where it cannot run."""
    if name not in ATTENTION_BACKENDS:
        raise ConfigError(f"--attention must be one of {', '.join(ATTENTION_BACKENDS)}, "
                          f"not {name!r}")
    runs_here = device.type == "cuda" or interpreted()
    if name == "auto":
        return ("triton" if runs_here and triton_installed() and kernel_fits(head_dim)
                else "gather")
    if name == "triton":
        if not triton_installed():
            raise ConfigError("--attention triton: the triton package is not installed "
                              "(CUDA builds of torch bring it)")
        if not runs_here:
            raise ConfigError("--attention triton runs on CUDA (on a CPU only in Triton's "
                              "interpreter, TRITON_INTERPRET=1); use --attention gather")
        if not kernel_fits(head_dim):
            raise ConfigError(f"--attention triton needs a power-of-two head dimension, not "
                              f"{head_dim}; use --attention gather")
    return name


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 block_tables: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Attention of one query per sequence over its cached keys.

    `q` `[seqs, heads, dim]`; the caches `[kv_heads, blocks, block_size, dim]`; `block_tables`
    `[seqs, width]` (entries past a sequence's length are never read); `lengths` `[seqs]`,
    the keys each query sees (its own included). Returns `[seqs, heads, dim]`.
    """
    q = q.contiguous()
    out = torch.empty_like(q)
    kv_heads, _, block_size, dim = k_cache.shape
    per_kv = q.shape[1] // kv_heads
    _kernel()[(q.shape[0], kv_heads)](
        q, k_cache, v_cache, block_tables, lengths, out,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0), dim ** -0.5,
        PER_KV=per_kv, HEADS=_next_power_of_two(per_kv), DIM=dim, BLOCK=block_size,
        KEYS=KEYS_PER_ITERATION)
    return out


def _next_power_of_two(n: int) -> int:
    return 1 << (n - 1).bit_length()


@functools.cache
def _kernel():  # a triton.JITFunction: triton is imported here only
    import triton
    import triton.language as tl

    # A block table's row stride (its width) changes from step to step: not a compile key.
    @triton.jit(do_not_specialize=["stride_t_seq"])
    def paged_decode_kernel(q_ptr, k_ptr, v_ptr, tables_ptr, lengths_ptr, out_ptr,
                            stride_q_seq, stride_q_head, stride_c_head, stride_c_block,
                            stride_c_token, stride_t_seq, scale,
                            PER_KV: tl.constexpr, HEADS: tl.constexpr, DIM: tl.constexpr,
                            BLOCK: tl.constexpr, KEYS: tl.constexpr):
        # HEADS: PER_KV (the query heads of one KV head) rounded up to a power of two.
        seq = tl.program_id(0)
        kv_head = tl.program_id(1)
        length = tl.load(lengths_ptr + seq)
        local = tl.arange(0, HEADS)
        heads = kv_head * PER_KV + local
        dims = tl.arange(0, DIM)
        rows = q_ptr + seq * stride_q_seq + heads[:, None] * stride_q_head + dims[None, :]
        q = tl.load(rows, mask=local[:, None] < PER_KV, other=0.0).to(tl.float32) * scale
        best = tl.full([HEADS], float("-inf"), tl.float32)
        total = tl.zeros([HEADS], tl.float32)
        acc = tl.zeros([HEADS, DIM], tl.float32)
        offsets = tl.arange(0, KEYS)
        for start in range(0, length, KEYS):
            position = start + offsets
            valid = position < length
            block = tl.load(tables_ptr + seq * stride_t_seq + position // BLOCK, mask=valid,
                            other=0)
            where = (kv_head * stride_c_head + block * stride_c_block
                     + (position % BLOCK) * stride_c_token)
            k = tl.load(k_ptr + where[:, None] + dims[None, :], mask=valid[:, None],
                        other=0.0).to(tl.float32)
            v = tl.load(v_ptr + where[:, None] + dims[None, :], mask=valid[:, None],
                        other=0.0).to(tl.float32)
            scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2)
            scores = tl.where(valid[None, :], scores, float("-inf"))
            new_best = tl.maximum(best, tl.max(scores, axis=1))
            rescale = tl.exp(best - new_best)
            probs = tl.exp(scores - new_best[:, None])
            total = total * rescale + tl.sum(probs, axis=1)
            acc = acc * rescale[:, None] + tl.sum(probs[:, :, None] * v[None, :, :], axis=1)
            best = new_best
        out = acc / total[:, None]
        tl.store(out_ptr + seq * stride_q_seq + heads[:, None] * stride_q_head
                 + dims[None, :], out.to(out_ptr.dtype.element_ty),
                 mask=local[:, None] < PER_KV)

    return paged_decode_kernel
