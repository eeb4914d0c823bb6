"""Decode attention over the paged KV cache: the engine's two paths side by side, the blocks
gathered into one tensor per sequence then two batched matmuls (`--attention gather`), and
the Triton kernel that reads the blocks where they lie (`--attention triton`,
`latlab.engine.paged_attention`).

    python benchmarks/engine_attention.py                         # 1B shape, batch 64, CUDA
    TRITON_INTERPRET=1 python benchmarks/engine_attention.py --device cpu --batch 4 --check
                                                                  # the kernel's results on a CPU

`benchmarks/engine_gpu.py` calls `compare` for its attention table. Each variant runs the
attention of one layer for `batch` sequences of 1 query each, contexts drawn from 128 to 384
tokens, their blocks scattered over the pool; on CUDA each is captured in a CUDA graph and
timed over 200 replays (the GPU's time, as the engine's graph-replayed decode step spends
it), and the bytes it must read (each sequence's keys and values once) over that time give
its bandwidth. `--check` only compares the two outputs.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass

import torch

from latlab.engine.config import ModelConfig
from latlab.engine.model import Attention, QueryGroup
from latlab.engine.paged_attention import interpreted, paged_decode, triton_installed

BLOCK_SIZE = 16


@dataclass
class Case:
    """One layer's decode attention: queries, the paged cache, tables and lengths."""

    attention: Attention
    q: torch.Tensor  # [batch, heads, dim]
    tables: torch.Tensor  # [batch, width] physical block ids, padded
    lengths: torch.Tensor  # [batch] keys per sequence (the query's own included)
    group: QueryGroup

    @property
    def kv_bytes(self) -> int:
        a = self.attention
        return int(self.lengths.sum()) * 2 * a.num_kv_heads * a.head_dim * self.q.element_size()


def make_case(shape: ModelConfig, batch: int, dtype: torch.dtype, device: torch.device,
              seed: int = 0) -> Case:
    g = torch.Generator().manual_seed(seed)
    attention = Attention(shape).to(device=device, dtype=dtype)
    lengths = torch.randint(128, 385, (batch,), generator=g)
    width = -(-int(lengths.max()) // BLOCK_SIZE)
    pool = batch * width + 1
    shape_kv = (attention.num_kv_heads, pool, BLOCK_SIZE, attention.head_dim)
    attention.k_cache = torch.randn(shape_kv, generator=g).to(device=device, dtype=dtype)
    attention.v_cache = torch.randn(shape_kv, generator=g).to(device=device, dtype=dtype)
    blocks = torch.randperm(pool, generator=g)  # scattered, as after a while of serving
    tables = blocks[: batch * width].view(batch, width)
    q = torch.randn(batch, attention.num_heads, attention.head_dim, generator=g)
    # The engine's group: the bias masks keys past each sequence's length.
    keys = torch.arange(width * BLOCK_SIZE)
    bias = torch.zeros(batch, 1, 1, width * BLOCK_SIZE)
    bias.masked_fill_(keys >= lengths.view(-1, 1, 1, 1), -torch.inf)
    group = QueryGroup(0, batch, 1, tables.to(device), bias.to(device), lengths.to(device))
    return Case(attention, q.to(device=device, dtype=dtype), tables.to(device),
                lengths.to(device), group)


def gathered(case: Case) -> torch.Tensor:
    """The engine's decode attention: `Attention._grouped`."""
    return case.attention._grouped(case.q, case.group)


def in_place(case: Case) -> torch.Tensor:
    """The engine's Triton kernel (`--attention triton`): the blocks read where they lie."""
    a = case.attention
    return paged_decode(case.q, a.k_cache, a.v_cache, case.tables, case.lengths)


def timed_ms(run, device: torch.device, replays: int = 200) -> float:
    """GPU ms per call from a CUDA graph's replays on CUDA; the best of eager calls on a CPU."""
    run()
    if device.type != "cuda":
        best = math.inf
        for _ in range(20):
            start = time.perf_counter()
            run()
            best = min(best, time.perf_counter() - start)
        return best * 1e3
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    graph.replay()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return begin.elapsed_time(end) / replays


def compare(shape: ModelConfig, batch: int, dtype: torch.dtype, device: torch.device) -> None:
    """Print each variant's time per layer, its bandwidth, and its distance to the engine's."""
    case = make_case(shape, batch, dtype, device)
    with torch.inference_mode():
        reference = gathered(case)
        variants = {"gathered (the engine's)": gathered}
        if triton_installed() and (device.type == "cuda" or interpreted()):
            variants["in place (Triton)"] = in_place
        print(f"\ndecode attention of one layer, batch {batch}, contexts 128-384 tokens "
              f"({case.kv_bytes / 1e6:.1f} MB of KV), {dtype}; "
              + ("CUDA graph replays" if device.type == "cuda" else "eager, best of 20"))
        print(f"{'variant':>24} {'us':>9} {'GB/s':>8} {'max |diff|':>11}")
        for name, run in variants.items():
            try:
                out = run(case)
                diff = (out.float() - reference.float()).abs().max().item()
                ms = timed_ms(lambda run=run, case=case: run(case), device)
            except Exception as e:  # a kernel that fails to build is a finding, not a crash
                print(f"{name:>24} failed: {type(e).__name__}: {str(e)[:200]}")
                continue
            print(f"{name:>24} {ms * 1e3:>9.1f} {case.kv_bytes / ms / 1e6:>8.0f} {diff:>11.4f}")
        if len(variants) == 1:
            print("(in place: needs Triton and CUDA, or TRITON_INTERPRET=1)")


def main() -> None:
    from engine_gpu import SHAPES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    parser.add_argument("--shape", default="1b", choices=sorted(SHAPES))
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--check", action="store_true", help="compare the outputs only")
    args = parser.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    if args.check:
        case = make_case(SHAPES[args.shape], args.batch, dtype, device)
        with torch.inference_mode():
            diff = (in_place(case).float() - gathered(case).float()).abs().max().item()
        print(f"max |in place - gathered| = {diff:.5f}")
        return
    compare(SHAPES[args.shape], args.batch, dtype, device)


if __name__ == "__main__":
    main()
