"""The tensor side of a step: batch the scheduled tokens, run the model, sample or verify.

Every tensor of a step is made on the model's device; the step's token ids cross to the host
in one copy at its end, so a token is stamped (by the engine) when the host knows it.
"""

from __future__ import annotations

import itertools

import torch

from latlab.engine.batching import MAX_GROUP_QUERIES, query_groups
from latlab.engine.cuda_graphs import StaticDecode
from latlab.engine.intra_op import IntraOpThreads
from latlab.engine.model import AttentionMetadata, CausalLM, PrefillChunk, QueryGroup
from latlab.engine.sampling import Sampler
from latlab.engine.sequence import Sequence
from latlab.engine.spec_decode import Proposer, accept_drafts, greedy_targets


class ModelRunner:
    """Runs steps of `model` over a paged KV cache of `num_kv_blocks` blocks.

    With `static_decode` (`max_num_seqs`, `max_model_len` then bound its buffers) pure decode
    steps go through `StaticDecode`, replayed from CUDA graphs when the model is on CUDA
    (eagerly elsewhere); the KV cache then gets one scratch block more for its padding rows.
    With `threads` (on the CPU) each step runs on as many intra-op threads as pay for its size
    (learnt from the steps' times for the small ones).
    """

    def __init__(self, model: CausalLM, sampler: Sampler, num_kv_blocks: int,
                 block_size: int, proposer: Proposer | None = None, *,
                 static_decode: bool = False, max_num_seqs: int = 0,
                 max_model_len: int = 0, threads: IntraOpThreads | None = None) -> None:
        self.model = model
        self.threads = threads
        self.device = model.embed_tokens.weight.device
        self.sampler = sampler
        self.block_size = block_size
        self.proposer = proposer
        model.allocate_kv_cache(num_kv_blocks + (1 if static_decode else 0), block_size)
        self.static_decode = None
        if static_decode:
            max_blocks = -(-max_model_len // block_size)
            self.static_decode = StaticDecode(model, max_num_seqs, max_blocks, block_size,
                                              scratch_block=num_kv_blocks)
            if self.device.type == "cuda":
                self.static_decode.capture()

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
            known = len(seq.token_ids)
            input_ids += seq.token_ids[start : start + n]
            if start + n > known:  # drafts being verified (no copy of the whole context)
                input_ids += seq.spec_token_ids[max(start - known, 0) : start + n - known]
            positions += range(start, start + n)
            slots += [table[p // size] * size + p % size for p in range(start, start + n)]
            if start + n == known + len(seq.spec_token_ids):
                done.append(seq)
                sample_rows += range(len(input_ids) - 1 - len(seq.spec_token_ids),
                                     len(input_ids))
        if self.threads is not None:
            self.threads.use(len(input_ids))
        every_row = len(sample_rows) == len(input_ids)  # a decode step: no rows to pick
        if self.static_decode is not None and self.static_decode.fits(batch):
            hidden = self.static_decode.run([seq for seq, _ in batch],
                                            [input_ids, positions, slots])
            rows = None if every_row else self._tensor(sample_rows)
        else:
            ids, where, slot_ids, rows = self._tensors(
                input_ids, positions, slots, [] if every_row else sample_rows)
            hidden = self.model(ids, where, self._attention_metadata(batch, slot_ids))
        new: dict[int, list[int]] = {}
        if done:
            logits = self.model.compute_logits(hidden if every_row else hidden[rows])
            new = self._tokens(logits, done)
        if self.threads is not None:
            self.threads.done()
        return [new.get(id(seq), []) for seq, _ in scheduled]

    def _tensor(self, values: list) -> torch.Tensor:
        return torch.tensor(values, device=self.device)

    def _tensors(self, *lists: list[int]) -> tuple[torch.Tensor, ...]:
        """Lists of ints as device tensors, in one host-to-device copy."""
        flat = self._tensor(list(itertools.chain.from_iterable(lists)))
        return flat.split([len(values) for values in lists])

    def _tokens(self, logits: torch.Tensor, done: list[Sequence]) -> dict[int, list[int]]:
        """Sample sequences without speculative tokens together; verify the others. Their
        token ids come to the host in one copy."""
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
        ids = []
        if plain:
            rows = logits if not spec else logits[self._tensor(plain_rows)]
            ids.append(self.sampler.sample(rows, plain))
        if spec:
            ids.append(greedy_targets(logits[self._tensor(spec_rows)], spec,
                                      self.sampler.stop_token_ids))
        tokens = torch.cat(ids).tolist()
        out = {id(s): [t] for s, t in zip(plain, tokens)}
        out.update((id(s), accepted) for s, accepted in
                   zip(spec, accept_drafts(tokens[len(plain):], spec)))
        return out

    def propose(self, running: list[Sequence]) -> None:
        """Let the proposer (speculative decoding) draft tokens for the next step."""
        if self.proposer is not None:
            self.proposer.propose(running)

    def _attention_metadata(self, batch: list[tuple[Sequence, int]],
                            slots: torch.Tensor) -> AttentionMetadata:
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
                mask = (torch.arange(context, device=self.device)
                        <= torch.arange(start, context, device=self.device).unsqueeze(1))
            blocks = -(-context // self.block_size)
            prefills.append(PrefillChunk(row, row + n, context,
                                         self._tensor(seq.block_table[:blocks]), mask))
            row += n
        return AttentionMetadata(slots, groups, prefills)

    def _group(self, members: list[Sequence], nq: int, row: int) -> QueryGroup:
        width = len(members[0].block_table)
        tables, last = self._tensors(
            [b for seq in members for b in seq.block_table + [0] * (width - len(seq.block_table))],
            [seq.num_computed_tokens for seq in members])
        tables, last = tables.view(len(members), width), last.view(-1, 1, 1)
        # Query j of a sequence sits at position num_computed + j and sees keys up to it.
        keys = torch.arange(width * self.block_size, device=self.device)
        allowed = keys <= last + torch.arange(nq, device=self.device).view(1, -1, 1)
        bias = torch.zeros(allowed.shape, device=self.device).masked_fill_(~allowed, -torch.inf)
        return QueryGroup(row, row + len(members) * nq, nq, tables, bias[:, None],
                          last.view(-1) + nq)
