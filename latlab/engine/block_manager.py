"""The paged KV cache's bookkeeping: fixed-size blocks, a free list, per-sequence block tables.

Prefix caching (vLLM's automatic prefix caching): once a block is full and computed it is
named by a hash of its tokens chained to the hash of the block before it, so a hash names a
whole prefix. A new sequence whose first blocks hash the same shares them (`ref_count`) and
skips their prefill. A block whose last user is gone keeps its content and its hash on the
free list, least recently freed first: it is reused by a later hit, or evicted when a fresh
block is needed and it is the oldest. A sequence's tail blocks are freed first, so a shared
prefix outlives the private tails that follow it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from latlab.engine.sequence import Sequence


@dataclass(slots=True)
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None
    token_ids: tuple[int, ...] = ()  # the content behind `hash`, checked on every hit


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = False) -> None:
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Free blocks, least recently freed first (the eviction order); values unused.
        self.free_block_ids: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.cached_block_ids: dict[int, int] = {}  # hash -> block id
        self.num_queried_tokens = 0  # prompt tokens looked up in the prefix cache
        self.num_hit_tokens = 0      # of which found
        self.num_evictions = 0

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use, 0..1 (free cached blocks count as free)."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        """Blocks `seq` lacks to hold its computed tokens plus `num_new_tokens` more."""
        tokens = seq.num_computed_tokens + num_new_tokens
        return max(0, -(-tokens // self.block_size) - len(seq.block_table))

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.blocks_needed(seq, num_new_tokens) <= self.num_free_blocks

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        if seq.num_computed_tokens + num_new_tokens <= len(seq.block_table) * self.block_size:
            return  # the common decode: its last block has room
        for _ in range(self.blocks_needed(seq, num_new_tokens)):
            block_id, _ = self.free_block_ids.popitem(last=False)
            block = self.blocks[block_id]
            if block.hash is not None:  # the least recently used cached block: evicted
                if self.cached_block_ids.get(block.hash) == block_id:
                    del self.cached_block_ids[block.hash]
                block.hash, block.token_ids = None, ()
                self.num_evictions += 1
            block.ref_count = 1
            seq.block_table.append(block_id)

    def free(self, seq: Sequence) -> None:
        self.trim(seq, 0)

    def trim(self, seq: Sequence, num_tokens: int) -> None:
        """Give back the blocks past the first `num_tokens` tokens (rejected draft tokens)."""
        keep = -(-num_tokens // self.block_size)
        while len(seq.block_table) > keep:
            block = self.blocks[seq.block_table.pop()]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_block_ids[block.block_id] = None

    def take_cached_prefix(self, seq: Sequence) -> int:
        """Share the cached blocks that begin a sequence holding no blocks yet; their tokens
        count as computed. At least one token is left to compute (its logits are needed).
        Returns the number of tokens taken from the cache."""
        if not self.enable_caching or seq.block_table:
            return 0
        size, tokens = self.block_size, seq.token_ids
        self._hash_blocks(seq, (seq.num_tokens - 1) // size)
        hits = 0
        for i, h in enumerate(seq.block_hashes[: (seq.num_tokens - 1) // size]):
            block_id = self.cached_block_ids.get(h)
            if block_id is None or self.blocks[block_id].token_ids != tuple(
                    tokens[i * size : (i + 1) * size]):
                break
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free_block_ids[block_id]
            block.ref_count += 1
            seq.block_table.append(block_id)
            hits += 1
        seq.num_computed_tokens = hits * size
        if seq.times.first_scheduled is None:  # reported: what the prompt found at first
            seq.num_cached_tokens = hits * size
        return hits * size

    def count_lookup(self, seq: Sequence) -> None:
        """Count a sequence's first scheduling in the hit rate."""
        if self.enable_caching:
            self.num_queried_tokens += seq.num_prompt_tokens
            self.num_hit_tokens += seq.num_cached_tokens

    def cache_full_blocks(self, seq: Sequence, num_computed_before: int) -> None:
        """Name the blocks the last step filled by their hash, for later hits."""
        if not self.enable_caching:
            return
        size = self.block_size
        full = min(seq.num_computed_tokens // size, len(seq.block_table))
        self._hash_blocks(seq, full)
        for i in range(num_computed_before // size, full):
            block = self.blocks[seq.block_table[i]]
            h = seq.block_hashes[i]
            if block.hash is None and h not in self.cached_block_ids:
                block.hash = h
                block.token_ids = tuple(seq.token_ids[i * size : (i + 1) * size])
                self.cached_block_ids[h] = block.block_id

    def _hash_blocks(self, seq: Sequence, num_blocks: int) -> None:
        size, hashes = self.block_size, seq.block_hashes
        while len(hashes) < num_blocks:
            i = len(hashes)
            previous = hashes[-1] if hashes else None
            hashes.append(hash((previous, tuple(seq.token_ids[i * size : (i + 1) * size]))))

    def reset(self) -> None:
        """Forget every cached block (the KV pool was dropped); nothing may hold blocks."""
        assert self.num_free_blocks == self.num_blocks, "blocks are still in use"
        for block in self.blocks:
            block.hash, block.token_ids = None, ()
        self.cached_block_ids.clear()
