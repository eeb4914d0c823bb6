"""A replayed trace's requests: their prompts built from the trace's blocks, so that a
server's prefix cache sees the trace's real sharing, and what the trace asked for kept with
each request.

Each hash id is a block of `block_tokens(--length-scale)` single-token words drawn from
`(seed, salt, id)`: within a run, equal ids are equal text (and a shorter last block the
first words of the same block); another salt (another run, issue 22's per-run salt) draws
other words. The tokens a row's blocks do not cover are its own, drawn from its row number.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import numpy as np

from latlab.load.workload.traces import Replayed, block_tokens, scaled
from latlab.records.timeline import SessionStep, TraceStep

BLOCKS_KEPT = 4096  # blocks' words kept for reuse (a trace reuses its recent blocks most)
Words = Callable[[np.random.Generator, int], list[str]]


class TracePrompts:
    """The words of a trace's prompts under one seed, salt and --length-scale."""

    def __init__(self, words: Words, seed: int, salt: int | None, scale: float) -> None:
        self.words, self.scale = words, scale
        self.key = [seed, 6, *([] if salt is None else [salt])]
        self.block = block_tokens(scale)
        self._blocks: OrderedDict[int, list[str]] = OrderedDict()

    def text(self, replayed: Replayed, tokens: int) -> str:
        """`tokens` tokens for the row: its blocks' words, then its own."""
        row, out = replayed.row, []
        for h in row.hash_ids or ():
            if len(out) >= tokens:
                break
            out += self._block(h)[: tokens - len(out)]
        if len(out) < tokens:
            rng = np.random.default_rng([*self.key, 1, row.row])
            out += self.words(rng, tokens - len(out))
        return "".join(out)

    def _block(self, h: int) -> list[str]:
        words = self._blocks.get(h)
        if words is None:
            words = self.words(np.random.default_rng([*self.key, 0, h]), self.block)
            self._blocks[h] = words
            if len(self._blocks) > BLOCKS_KEPT:
                self._blocks.popitem(last=False)
        else:
            self._blocks.move_to_end(h)
        return words

    def lengths(self, replayed: Replayed) -> tuple[int | None, int | None]:
        """The row's prompt and output tokens under --length-scale (None: not in the trace)."""
        row = replayed.row
        return (None if row.prompt_tokens is None else scaled(row.prompt_tokens, self.scale),
                None if row.output_tokens is None else scaled(row.output_tokens, self.scale))


def trace_step(replayed: Replayed) -> TraceStep:
    """What the record keeps of the row: where it is and what it asked for."""
    row = replayed.row
    return TraceStep(row=row.row, time_s=round(replayed.since_s, 6),
                     prompt_tokens=row.prompt_tokens, output_tokens=row.output_tokens,
                     hash_ids=row.hash_ids)


def session_step(replayed: Replayed, turns: Callable[[str], int]) -> SessionStep | None:
    """The row's place in its session (None outside one); `turns` counts a session's rows."""
    row = replayed.row
    if row.session is None:
        return None
    return SessionStep(id=row.session, turn=row.turn or 1,
                       turns=max(turns(row.session), row.turn or 1))
