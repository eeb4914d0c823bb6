"""Speculative decoding with a draft model, and the proposer an engine config asks for."""

from __future__ import annotations

import torch

from latlab.engine.block_manager import BlockManager
from latlab.engine.model_runner import ModelRunner
from latlab.engine.sampling import Sampler
from latlab.engine.sequence import Sequence, StageTimes
from latlab.engine.spec_decode import GREEDY, NgramProposer, Proposer, num_to_propose
from latlab.records.engine import ConfigError, EngineConfig


class DraftModelProposer:
    """A draft model decodes k greedy tokens per sequence, all sequences batched. Each target
    sequence has a shadow sequence in the draft's own KV pool; after verification the shadow
    is rolled back to what the target kept, so only new tokens are computed."""

    def __init__(self, config: EngineConfig, dtype: torch.dtype, device: torch.device,
                 num_blocks: int, max_model_len: int, vocab: dict[str, int]) -> None:
        from latlab.engine.loader import load_model

        draft = load_model(config.speculative_model, dtype, config.seed,
                           quantization=config.quantization, device=device)
        if draft.tokenizer.backend.get_vocab(with_added_tokens=True) != vocab:
            raise ConfigError(f"--speculative-model {config.speculative_model}: its tokenizer "
                              "differs from the model's")
        self.k, self.max_model_len = config.num_speculative_tokens, max_model_len
        self.block_manager = BlockManager(num_blocks, config.block_size)
        self.runner = ModelRunner(draft.model, Sampler(0, []), num_blocks, config.block_size)
        self.shadows: dict[str, tuple[Sequence, int]] = {}  # request id -> (shadow, synced)

    def propose(self, running: list[Sequence]) -> None:
        live = {seq.request_id for seq in running}
        for rid in [r for r in self.shadows if r not in live]:
            self.block_manager.free(self.shadows.pop(rid)[0])
        wanted = []
        for seq in running:
            seq.spec_token_ids = []
            k = num_to_propose(seq, self.k, self.max_model_len)
            if k:
                wanted.append((seq, self._sync(seq), k))
        for _ in range(max((k for _, _, k in wanted), default=0)):
            batch = []
            for seq, shadow, k in wanted:
                n = shadow.num_uncomputed_tokens
                if len(seq.spec_token_ids) < k and self.block_manager.can_allocate(shadow, n):
                    self.block_manager.allocate(shadow, n)
                    batch.append((seq, shadow, n))
            if not batch:
                break
            tokens = self.runner.execute([(shadow, n) for _, shadow, n in batch])
            for (seq, shadow, n), (token,) in zip(batch, tokens):
                shadow.num_computed_tokens += n
                shadow.token_ids.append(token)
                seq.spec_token_ids.append(token)

    def _sync(self, seq: Sequence) -> Sequence:
        """The shadow of `seq`, its computed tokens cut back to those `seq` still has."""
        shadow, synced = self.shadows.get(seq.request_id, (None, 0))
        if shadow is None:
            shadow = Sequence(seq.request_id, [], GREEDY, StageTimes(0, 0))
        common = synced
        limit = min(shadow.num_computed_tokens, seq.num_tokens)
        while common < limit and shadow.token_ids[common] == seq.token_ids[common]:
            common += 1
        shadow.num_computed_tokens = min(shadow.num_computed_tokens, common)
        shadow.token_ids = list(seq.token_ids)
        self.block_manager.trim(shadow, shadow.num_tokens)
        self.shadows[seq.request_id] = (shadow, seq.num_tokens)
        return shadow


def make_proposer(config: EngineConfig, dtype: torch.dtype, device: torch.device,
                  num_blocks: int, max_model_len: int, vocab: dict[str, int]) -> Proposer | None:
    if config.speculative_method == "ngram":
        return NgramProposer(config.num_speculative_tokens, config.prompt_lookup_min,
                             config.prompt_lookup_max, max_model_len)
    if config.speculative_method == "draft":
        return DraftModelProposer(config, dtype, device, num_blocks, max_model_len, vocab)
    return None
