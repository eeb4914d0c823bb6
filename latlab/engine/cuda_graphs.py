"""Decode steps replayed from CUDA graphs (as vLLM and nano-vllm do), on CUDA only.

On a GPU the eager decode step of a small model is mostly Python and kernel launches. A pure
decode step (one new token per sequence: no prefill, no speculative tokens) launches the same
kernels every time for a given batch size and block-table width, so a graph is captured once
per (padded batch size, padded width) and replayed. The graphs read the step's inputs from
static buffers: token ids, positions and KV slots (one `[3, max_num_seqs]` tensor, one copy
per step) and block tables. Padding rows write to a scratch KV block of their own (the runner
allocates it past the pool) and attend only to it; blocks past a sequence's end are masked.

Without captured graphs (`capture` is never called on the CPU) `StaticDecode.run` runs the
same padded step eagerly: the CPU tests check the buffers and the padding that way.
"""

from __future__ import annotations

import torch

from latlab.engine.model import AttentionMetadata, CausalLM, QueryGroup
from latlab.engine.sequence import Sequence

IDS, POSITIONS, SLOTS = range(3)


def capture_sizes(limit: int) -> list[int]:
    """Batch sizes with a graph: 1, 2, 4, 8, then every 16, and `limit` itself."""
    return sorted({s for s in (1, 2, 4, 8, *range(16, limit, 16)) if s < limit} | {limit})


def capture_widths(limit: int) -> list[int]:
    """Block-table widths with a graph: the powers of two below `limit`, and `limit`."""
    return sorted({1 << i for i in range(limit.bit_length()) if 1 << i < limit} | {limit})


def padded(n: int, sizes: list[int]) -> int:
    """The smallest of `sizes` (ascending) that holds `n`."""
    return next(s for s in sizes if s >= n)


class StaticDecode:
    """Pure decode steps of up to `max_num_seqs` sequences of up to `max_blocks` blocks each,
    through static buffers; replayed from CUDA graphs once `capture` has run."""

    def __init__(self, model: CausalLM, max_num_seqs: int, max_blocks: int, block_size: int,
                 scratch_block: int) -> None:
        weight = model.embed_tokens.weight
        self.model, self.device, self.block_size = model, weight.device, block_size
        self.sizes, self.widths = capture_sizes(max_num_seqs), capture_widths(max_blocks)
        self.scratch_block = scratch_block
        long = dict(dtype=torch.long, device=self.device)
        self.inputs = torch.zeros(3, max_num_seqs, **long)
        self.block_tables = torch.zeros(max_num_seqs, max_blocks, **long)
        self.key_positions = torch.arange(max_blocks * block_size, **long)
        self.hidden = torch.zeros(max_num_seqs, model.config.hidden_size, dtype=weight.dtype,
                                  device=self.device)
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}

    def fits(self, batch: list[tuple[Sequence, int]]) -> bool:
        """Whether the step is a pure decode step this can run."""
        return len(batch) <= self.sizes[-1] and all(
            n == 1 and not seq.spec_token_ids and len(seq.block_table) <= self.widths[-1]
            for seq, n in batch)

    def run(self, seqs: list[Sequence], inputs: list[list[int]]) -> torch.Tensor:
        """Hidden states `[len(seqs), hidden]` of a decode step; `inputs` holds the token ids,
        positions and KV slots of the step, one per sequence."""
        n = len(seqs)
        size = padded(n, self.sizes)
        width = padded(max(len(seq.block_table) for seq in seqs), self.widths)
        pad = size - n
        rows = [row + [fill] * pad for row, fill in
                zip(inputs, (0, 0, self.scratch_block * self.block_size))]
        tables = [seq.block_table + [self.scratch_block] * (width - len(seq.block_table))
                  for seq in seqs] + [[self.scratch_block] * width] * pad
        self.inputs[:, :size].copy_(torch.tensor(rows, device="cpu"))
        self.block_tables[:size, :width].copy_(torch.tensor(tables, device="cpu"))
        graph = self.graphs.get((size, width))
        if graph is None:
            self.hidden[:size] = self._forward(size, width)
        else:
            graph.replay()
        return self.hidden[:n]

    def _forward(self, size: int, width: int) -> torch.Tensor:
        """The model over the first `size` rows of the buffers, `width` blocks of keys each."""
        positions = self.inputs[POSITIONS, :size]
        keys = self.key_positions[: width * self.block_size]
        bias = torch.zeros(size, 1, 1, keys.numel(), device=self.device)
        bias.masked_fill_(keys > positions.view(-1, 1, 1, 1), -torch.inf)
        group = QueryGroup(0, size, 1, self.block_tables[:size, :width], bias, positions + 1)
        meta = AttentionMetadata(self.inputs[SLOTS, :size], [group], [])
        return self.model(self.inputs[IDS, :size], positions, meta)

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture a graph per (batch size, width), largest first, sharing one memory pool;
        each after one eager run (lazy CUDA initialization must not happen inside a capture).
        The captures write only to the scratch KV block."""
        if self.device.type != "cuda":
            raise RuntimeError("CUDA graphs need the model on a CUDA device")
        self.inputs[:SLOTS] = 0
        self.inputs[SLOTS] = self.scratch_block * self.block_size
        self.block_tables.fill_(self.scratch_block)
        pool = None
        for size in reversed(self.sizes):
            for width in reversed(self.widths):
                self.hidden[:size] = self._forward(size, width)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool):
                    self.hidden[:size] = self._forward(size, width)
                pool = graph.pool() if pool is None else pool
                self.graphs[(size, width)] = graph
        torch.cuda.synchronize(self.device)
