"""How a batch of logits becomes tokens, as each request's `SamplingParams` ask."""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch
import torch.nn.functional as F

from latlab.engine.sampling_params import GREEDY_BELOW
from latlab.engine.sequence import Sequence

# Columns summed together in `inverse_cdf`'s first level.
BLOCK = 128


class Sampler:
    """Turns `[num_seqs, vocab]` logits into one token per sequence.

    Sequences with a seed draw from their own generator, so their output does not depend on
    what else shares the batch; the others share the engine's seeded generator.
    """

    def __init__(self, seed: int, stop_token_ids: Seq[int]) -> None:
        self.generator = torch.Generator().manual_seed(seed)
        self.stop_token_ids = list(stop_token_ids)

    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
        return self.sample(logits, seqs).tolist()

    def sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """One token id per row, on the logits' device (the caller copies them to the host).

        No operation and no host-to-device copy runs per row: the kernels a step launches
        do not grow with its batch."""
        self._forbid_stopping(logits, seqs)
        rows = [i for i, seq in enumerate(seqs) if seq.params.temperature >= GREEDY_BELOW]
        if not rows:
            return logits.argmax(dim=-1)
        if len(rows) == len(seqs):
            return self._draw(logits, seqs)
        tokens = logits.argmax(dim=-1)
        index = torch.tensor(rows, device=logits.device)
        tokens[index] = self._draw(logits[index], [seqs[i] for i in rows])
        return tokens

    def _forbid_stopping(self, logits: torch.Tensor, seqs: list[Sequence]) -> None:
        """Before `min_tokens`, no stop token may be drawn: one indexed write for the batch."""
        rows: list[int] = []
        columns: list[int] = []
        for row, seq in enumerate(seqs):
            if seq.num_output_tokens < seq.params.min_tokens:
                stops = self.stop_token_ids + list(seq.params.stop_token_ids)
                rows += [row] * len(stops)
                columns += stops
        if rows:
            index = torch.tensor([rows, columns], device=logits.device)
            logits[index[0], index[1]] = -torch.inf

    def _draw(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """Inverse-CDF sampling (one cumsum and one search per batch, far cheaper on a CPU
        than `torch.multinomial`), after the top-k and top-p filters on sorted candidates.
        The rows' temperature, top-k, top-p and uniform draws reach the device in one copy."""
        vocab, device = logits.shape[1], logits.device
        top_k = [min(seq.params.top_k, vocab) or vocab for seq in seqs]
        top_p = [seq.params.top_p for seq in seqs]
        host = torch.tensor([[seq.params.temperature for seq in seqs], top_k, top_p],
                            dtype=torch.float32, device="cpu")
        columns = torch.cat([host, self._uniform(seqs).unsqueeze(0)])
        temperature, k, p, uniform = columns.to(device).unsqueeze(2)
        logits = logits / temperature
        order = None
        if min(top_p) < 1:
            logits, order = logits.sort(dim=-1, descending=True)
        elif min(top_k) < vocab:
            logits, order = logits.topk(max(top_k), dim=-1)
        if order is not None:
            ranks = torch.arange(logits.shape[1], device=device)
            logits.masked_fill_(ranks >= k, -torch.inf)
        if min(top_p) < 1:
            probs = logits.softmax(dim=-1)
            mass_before = probs.cumsum(dim=-1) - probs
            probs.masked_fill_(mass_before > p, 0.0)
        else:  # unnormalized: the draw scales the uniform by each row's total
            probs = logits.sub_(logits.amax(dim=-1, keepdim=True)).exp_()
        drawn = inverse_cdf(probs, uniform)
        return (drawn if order is None else order.gather(1, drawn)).squeeze(1)

    def _uniform(self, seqs: list[Sequence]) -> torch.Tensor:
        """One U[0, 1) draw per sequence, from its own generator when it has a seed: drawn on
        the CPU, so a seed gives the same draws on any device."""
        u = torch.rand(len(seqs), generator=self.generator, device="cpu")
        for i, seq in enumerate(seqs):
            if seq.params.seed is not None:
                if seq.generator is None:
                    seq.generator = torch.Generator().manual_seed(seq.params.seed)
                u[i] = torch.rand(1, generator=seq.generator, device="cpu")
        return u


def inverse_cdf(weights: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """The column `[rows, 1]` where each row's running sum of `weights` (`[rows, columns]`,
    non-negative) first exceeds `uniform` (`[rows, 1]`, in [0, 1)) times its total.

    In two levels, `BLOCK` columns at a time: the blocks' sums and their running sum pick a
    block, and only that block's columns are summed one after another; a running sum over
    every column (a sampler's usual cumsum) is a long serial pass on a CPU."""
    rows, columns = weights.shape
    pad = -columns % BLOCK
    blocks = (F.pad(weights, (0, pad)) if pad else weights).view(rows, -1, BLOCK)
    block_cdf = blocks.sum(dim=-1).cumsum(dim=-1)
    target = uniform * block_cdf[:, -1:]
    block = torch.searchsorted(block_cdf, target, right=True).clamp_max_(block_cdf.shape[1] - 1)
    before = torch.where(block > 0, block_cdf.gather(1, (block - 1).clamp_min(0)), 0.0)
    inside = blocks.gather(1, block.unsqueeze(2).expand(rows, 1, BLOCK)).squeeze(1)
    column = torch.searchsorted(inside.cumsum(dim=-1) + before, target, right=True)
    return (block * BLOCK + column.clamp_max_(BLOCK - 1)).clamp_max_(columns - 1)
