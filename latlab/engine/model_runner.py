"""The tensor side of a step: batch the scheduled tokens, run the model, sample."""

from __future__ import annotations

import torch

from latlab.engine.batching import decode_groups
from latlab.engine.model import AttentionMetadata, CausalLM, DecodeGroup, PrefillChunk
from latlab.engine.sampling import Sampler
from latlab.engine.sequence import Sequence



class ModelRunner:
    def __init__(self, model: CausalLM, sampler: Sampler, num_kv_blocks: int,
                 block_size: int) -> None:
        self.model = model
        self.sampler = sampler
        self.block_size = block_size
        model.allocate_kv_cache(num_kv_blocks, block_size)

    @torch.inference_mode()
    def execute(self, scheduled: list[tuple[Sequence, int]]) -> list[int | None]:
        """Compute `n` more tokens of each `(seq, n)`; a token for each sequence now complete.

        Single-token work (decodes) goes first in the batch, longest context first, so that
        decodes of similar length are attended together.
        """
        order = sorted(range(len(scheduled)), key=lambda i: (
            scheduled[i][1] != 1, -scheduled[i][0].num_computed_tokens))
        batch = [scheduled[i] for i in order]
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        sample_rows: list[int] = []
        for seq, n in batch:
            start = seq.num_computed_tokens
            table, size = seq.block_table, self.block_size
            input_ids += seq.token_ids[start : start + n]
            positions += range(start, start + n)
            slots += [table[p // size] * size + p % size for p in range(start, start + n)]
            if start + n == seq.num_tokens:
                sample_rows.append(len(input_ids) - 1)
        meta = self._attention_metadata(batch, slots)
        hidden = self.model(torch.tensor(input_ids), torch.tensor(positions), meta)
        results: list[int | None] = [None] * len(scheduled)
        if not sample_rows:
            return results
        logits = self.model.compute_logits(hidden[torch.tensor(sample_rows)])
        tokens = iter(self.sampler(logits, [seq for seq, n in batch
                                            if seq.num_computed_tokens + n == seq.num_tokens]))
        for i, (seq, n) in zip(order, batch):
            if seq.num_computed_tokens + n == seq.num_tokens:
                results[i] = next(tokens)
        return results

    def _attention_metadata(self, batch: list[tuple[Sequence, int]],
                            slots: list[int]) -> AttentionMetadata:
        decodes = [seq for seq, n in batch if n == 1]
        groups = [self._decode_group(decodes, start, end) for start, end in
                  decode_groups([len(seq.block_table) for seq in decodes])]
        prefills = []
        row = len(decodes)
        for seq, n in batch[len(decodes) :]:
            start, context = seq.num_computed_tokens, seq.num_computed_tokens + n
            mask = None
            if start:
                mask = torch.arange(context) <= torch.arange(start, context).unsqueeze(1)
            blocks = -(-context // self.block_size)
            prefills.append(PrefillChunk(row, row + n, context,
                                         torch.tensor(seq.block_table[:blocks]), mask))
            row += n
        return AttentionMetadata(torch.tensor(slots), groups, prefills)

    def _decode_group(self, decodes: list[Sequence], start: int, end: int) -> DecodeGroup:
        members = decodes[start:end]
        width = len(members[0].block_table)
        tables = torch.tensor([seq.block_table + [0] * (width - len(seq.block_table))
                               for seq in members])
        context = torch.tensor([seq.num_computed_tokens + 1 for seq in members])
        mask = torch.arange(width * self.block_size) < context.unsqueeze(1)
        return DecodeGroup(start, end, tables, mask[:, None, None, :])
