"""Speculative decoding: proposers that draft k tokens, and their verification.

After each step the runner's proposer drafts up to k tokens for every greedy sequence that
is decoding (`Sequence.spec_token_ids`); the next step runs them through the target model
in one forward pass (the decode plus k rows), and `accept_drafts` keeps the drafts up to the
first one the target model would not have chosen, then the target's own token: 1 to k + 1
tokens per step, exactly the tokens plain greedy decoding gives. The scheduler rolls the KV
cache back past the rejected drafts (`Scheduler.advance`).

* `NgramProposer` (prompt lookup decoding): the longest recent n-gram of the sequence that
  occurred before is assumed to go on as it did then. Free, and right on repetitive text.
* `DraftModelProposer` (`draft_proposer`): a smaller model sharing the tokenizer decodes k
  tokens greedily, batched, over its own paged KV cache (`ModelRunner` and `BlockManager`
  reused).

Sampled sequences (temperature > 0) decode without drafts.
"""

from __future__ import annotations

from array import array
from typing import Protocol

import torch

from latlab.engine.sampling_params import SamplingParams
from latlab.engine.sequence import Sequence, SequenceStatus

GREEDY = SamplingParams(max_tokens=1, temperature=0.0)


class Proposer(Protocol):
    def propose(self, running: list[Sequence]) -> None:
        """Set `spec_token_ids` of the running sequences for the next step."""


def num_to_propose(seq: Sequence, k: int, max_model_len: int) -> int:
    """Drafts worth proposing for `seq`: 0 unless it is a greedy decode, and never past its
    max_tokens or the context."""
    if (seq.status is not SequenceStatus.RUNNING or not seq.is_decoding
            or seq.params.temperature != 0):
        return 0
    left = seq.params.max_tokens - seq.num_output_tokens - 1
    return max(0, min(k, left, max_model_len - seq.num_tokens - 1))


def greedy_targets(logits: torch.Tensor, seqs: list[Sequence],
                   stop_token_ids: list[int]) -> torch.Tensor:
    """The target model's greedy token at each row of `logits`, k + 1 rows per sequence (the
    last token's, then each draft's), stopping banned where min_tokens says; on the device."""
    row = 0
    for seq in seqs:
        k, params = len(seq.spec_token_ids), seq.params
        forbidden = params.min_tokens - seq.num_output_tokens  # rows where stopping is banned
        if forbidden > 0:
            logits[row : row + min(forbidden, k + 1),
                   stop_token_ids + list(params.stop_token_ids)] = -torch.inf
        row += k + 1
    return logits.argmax(dim=-1)


def accept_drafts(targets: list[int], seqs: list[Sequence]) -> list[list[int]]:
    """The drafts of each sequence are accepted while each equals the target's greedy token
    at its place (`targets`: `greedy_targets` on the host); the target's token after the last
    accepted draft comes with them."""
    out, row = [], 0
    for seq in seqs:
        drafts = seq.spec_token_ids
        wanted = targets[row : row + len(drafts) + 1]
        accepted = 0
        while accepted < len(drafts) and drafts[accepted] == wanted[accepted]:
            accepted += 1
        out.append(wanted[: accepted + 1])
        row += len(drafts) + 1
    return out


class NgramProposer:
    """Prompt lookup: find the last `n` tokens earlier in the sequence (n from
    `prompt_lookup_max` down to `prompt_lookup_min`, the latest occurrence) and propose
    the k tokens that followed them. Tokens are kept as bytes so `bytes.rfind` searches."""

    def __init__(self, k: int, min_n: int, max_n: int, max_model_len: int) -> None:
        self.k, self.min_n, self.max_n = k, min_n, max_n
        self.max_model_len = max_model_len
        self._tokens: dict[str, array] = {}

    def propose(self, running: list[Sequence]) -> None:
        live = {seq.request_id for seq in running}
        for rid in [r for r in self._tokens if r not in live]:
            del self._tokens[rid]
        for seq in running:
            k = num_to_propose(seq, self.k, self.max_model_len)
            seq.spec_token_ids = self._lookup(seq, k) if k else []

    def _lookup(self, seq: Sequence, k: int) -> list[int]:
        tokens = self._tokens.setdefault(seq.request_id, array("i"))
        tokens.extend(seq.token_ids[len(tokens) :])
        data, width = tokens.tobytes(), tokens.itemsize
        for n in range(min(self.max_n, len(tokens) - 1), self.min_n - 1, -1):
            pattern = data[-n * width :]
            end = len(data) - width  # the match must end before the last token
            while (at := data.rfind(pattern, 0, end)) >= 0 and at % width:
                end = at + len(pattern) - 1  # misaligned: look further left
            if at >= 0:
                start = at // width + n
                return tokens[start : start + k].tolist()
        return []
