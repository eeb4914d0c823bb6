"""The tensor side of a step: batch the scheduled tokens, run the model, sample or verify."""

from __future__ import annotations

import torch

from latlab.engine.batching import MAX_GROUP_QUERIES, query_groups
from latlab.engine.model import AttentionMetadata, CausalLM, PrefillChunk, QueryGroup
from latlab.engine.sampling import Sampler
from latlab.engine.sequence import Sequence
from latlab.engine.spec_decode import Proposer, verify_greedy



class ModelRunner:
    def __init__(self, model: CausalLM, sampler: Sampler, num_kv_blocks: int,
                 block_size: int, proposer: Proposer | None = None) -> None:
        self.model = model
        self.sampler = sampler
        self.block_size = block_size
        self.proposer = proposer
        model.allocate_kv_cache(num_kv_blocks, block_size)

    @torch.inference_mode()
    def execute(self, scheduled: list[tuple[Sequence, int]]) -> list[list[int]]:
        """Compute `n` more tokens of each `(seq, n)`; the new tokens of each sequence whose
        computed context is now complete: one sampled token, or, with speculative tokens
        scheduled, the accepted ones and the target model's token after them.

        Short runs go first in the batch, by length, longest context first, so that decodes
        of similar length are attended together.
        """
        order = sorted(range(len(scheduled)), key=lambda i: (
            scheduled[i][1] > MAX_GROUP_QUERIES, scheduled[i][1],
            -scheduled[i][0].num_computed_tokens))
        batch = [scheduled[i] for i in order]
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        sample_rows: list[int] = []
        done: list[Sequence] = []
        for seq, n in batch:
            start, size, table = seq.num_computed_tokens, self.block_size, seq.block_table
            tokens = seq.token_ids + seq.spec_token_ids if seq.spec_token_ids else seq.token_ids
            input_ids += tokens[start : start + n]
            positions += range(start, start + n)
            slots += [table[p // size] * size + p % size for p in range(start, start + n)]
            if start + n == len(tokens):
                done.append(seq)
                sample_rows += range(len(input_ids) - 1 - len(seq.spec_token_ids),
                                     len(input_ids))
        meta = self._attention_metadata(batch, slots)
        hidden = self.model(torch.tensor(input_ids), torch.tensor(positions), meta)
        new: dict[int, list[int]] = {}
        if done:
            logits = self.model.compute_logits(hidden[torch.tensor(sample_rows)])
            new = self._tokens(logits, done)
        return [new.get(id(seq), []) for seq, _ in scheduled]

    def _tokens(self, logits: torch.Tensor, done: list[Sequence]) -> dict[int, list[int]]:
        """Sample sequences without speculative tokens together; verify the others."""
        plain_rows, plain, spec_rows, spec = [], [], [], []
        row = 0
        for seq in done:
            k = len(seq.spec_token_ids)
            if k:
                spec_rows += range(row, row + k + 1)
                spec.append(seq)
            else:
                plain_rows.append(row)
                plain.append(seq)
            row += k + 1
        out = {}
        if plain:
            rows = logits if not spec else logits[torch.tensor(plain_rows)]
            out = {id(s): [t] for s, t in zip(plain, self.sampler(rows, plain))}
        if spec:
            accepted = verify_greedy(logits[torch.tensor(spec_rows)], spec,
                                     self.sampler.stop_token_ids)
            out.update((id(s), tokens) for s, tokens in zip(spec, accepted))
        return out

    def propose(self, running: list[Sequence]) -> None:
        """Let the proposer (speculative decoding) draft tokens for the next step."""
        if self.proposer is not None:
            self.proposer.propose(running)

    def _attention_metadata(self, batch: list[tuple[Sequence, int]],
                            slots: list[int]) -> AttentionMetadata:
        groups = []
        row = 0
        spans = query_groups([(n, len(seq.block_table)) for seq, n in batch])
        for start, end in spans:
            nq = batch[start][1]
            groups.append(self._group([seq for seq, _ in batch[start:end]], nq, row))
            row += (end - start) * nq
        prefills = []
        for seq, n in batch[spans[-1][1] if spans else 0 :]:
            start, context = seq.num_computed_tokens, seq.num_computed_tokens + n
            mask = None
            if start:
                mask = torch.arange(context) <= torch.arange(start, context).unsqueeze(1)
            blocks = -(-context // self.block_size)
            prefills.append(PrefillChunk(row, row + n, context,
                                         torch.tensor(seq.block_table[:blocks]), mask))
            row += n
        return AttentionMetadata(torch.tensor(slots), groups, prefills)

    def _group(self, members: list[Sequence], nq: int, row: int) -> QueryGroup:
        width = len(members[0].block_table)
        tables = torch.tensor([seq.block_table + [0] * (width - len(seq.block_table))
                               for seq in members])
        # Query j of a sequence sits at position num_computed + j and sees keys up to it.
        last = torch.tensor([seq.num_computed_tokens for seq in members]).view(-1, 1, 1)
        keys = torch.arange(width * self.block_size)
        allowed = keys <= last + torch.arange(nq).view(1, -1, 1)
        bias = torch.zeros(allowed.shape).masked_fill_(~allowed, -torch.inf)
        return QueryGroup(row, row + len(members) * nq, nq, tables, bias[:, None])
