"""The paged KV cache's bookkeeping: fixed-size blocks, a free list, per-sequence block tables.

Blocks carry a reference count so that one block can later be shared (prefix caching) by
looking blocks up by content before taking a fresh one in `allocate`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from latlab.engine.sequence import Sequence


@dataclass(slots=True)
class Block:
    block_id: int
    ref_count: int = 0


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_block_ids: deque[int] = deque(range(num_blocks))

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use, 0..1."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        """Blocks `seq` lacks to hold its computed tokens plus `num_new_tokens` more."""
        tokens = seq.num_computed_tokens + num_new_tokens
        return max(0, -(-tokens // self.block_size) - len(seq.block_table))

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.blocks_needed(seq, num_new_tokens) <= self.num_free_blocks

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        for _ in range(self.blocks_needed(seq, num_new_tokens)):
            block = self.blocks[self.free_block_ids.popleft()]
            block.ref_count = 1
            seq.block_table.append(block.block_id)

    def free(self, seq: Sequence) -> None:
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_block_ids.append(block_id)
        seq.block_table.clear()
