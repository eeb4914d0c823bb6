"""What a simulated replica does beyond scheduling and charging steps: latlab serve's latency
techniques that change when requests run, not what a step costs.

* A queue deadline (`--max-queue-delay`): a request never scheduled within it is refused
  (503) at the next step's start, as the engine's scheduler refuses it.
* Idle unload (`--idle-unload`): after that many idle seconds the model is unloaded; the next
  request waits for it to load again (`reload_s`, e.g. from `latlab coldstart`).
* Speculative decoding: every decoding sequence gets `speculative_tokens` drafts (fewer near
  its end) verified in its decode; each request accepts each draft with its own probability
  (`acceptance`, drawn per request), up to the first it rejects, plus the target's token. A
  verifying decode is charged as a decode of its 1 + k tokens (the runner attends such short
  runs grouped with the decodes), and a step that proposed drafts `draft_ms` more (a draft
  model's own steps; an n-gram lookup costs next to nothing).

`TechniqueSteps` holds what they need of one replica (its scheduler, the drafts' random
numbers); the replica (`replica.py`) acts on what it answers.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from latlab.engine.batching import MAX_GROUP_QUERIES, decode_groups
from latlab.engine.scheduler import Scheduler
from latlab.sim.sequence import SimSequence

INF = math.inf


@dataclass(frozen=True)
class Techniques:
    max_queue_delay: float | None = None  # seconds
    idle_unload: float | None = None  # seconds
    reload_s: float = 0.0
    speculative_tokens: int = 0
    draft_ms: float = 0.0

    @property
    def speculative(self) -> bool:
        return self.speculative_tokens > 0


class TechniqueSteps:
    """The queue deadline, idle unload and speculative decoding of one replica."""

    def __init__(self, techniques: Techniques, scheduler: Scheduler, max_model_len: int,
                 seed: int = 0) -> None:
        self.techniques = techniques
        self.scheduler = scheduler
        self.max_model_len = max_model_len
        self.rng = random.Random(seed)  # the drafts each verified decode accepts

    def expired(self, now: float) -> list[SimSequence]:
        """The waiting requests never scheduled that arrived more than the deadline ago:
        to refuse."""
        delay = self.techniques.max_queue_delay
        if delay is None or not self.scheduler.waiting:
            return []
        return [s for s in self.scheduler.waiting.ordered()
                if s.first_scheduled < 0 and s.arrived < now - delay]

    def deadline(self) -> float:
        """When the next waiting request would be refused (a decode run ends by then)."""
        delay = self.techniques.max_queue_delay
        if delay is None or not self.scheduler.waiting:
            return INF
        return min((s.arrived for s in self.scheduler.waiting.ordered()
                    if s.first_scheduled < 0), default=INF - 1) + delay

    def asleep(self, now: float, last_end: float) -> bool:
        """Whether the model was unloaded by `now`: idle since the last step ended
        (`last_end`) for longer than `idle_unload` (from the start, if it never ran)."""
        idle = self.techniques.idle_unload
        return idle is not None and now - last_end > idle

    def propose(self) -> None:
        """Drafts for every decoding sequence, never past its output or the context."""
        k, limit = self.techniques.speculative_tokens, self.max_model_len
        for seq in self.scheduler.running:
            if seq.is_decoding:
                left = seq.target - (len(seq.token_ids) - seq.num_prompt_tokens) - 1
                seq.spec_token_ids = [0] * max(0, min(k, left, limit - len(seq.token_ids) - 1))

    def emitted(self, seq: SimSequence, drafts: int) -> int:
        """The tokens a verified decode gives: the drafts accepted in a row, and one."""
        accepted = 0
        while accepted < drafts and self.rng.random() < seq.acceptance:
            accepted += 1
        return accepted + 1

    @staticmethod
    def features(scheduled: list[tuple[SimSequence, int]]) -> list[int]:
        """`batching.step_features` with a verifying decode (1 + k tokens of a decoding
        sequence) counted as a decode of that many tokens."""
        tokens = decodes = prefills = sampled = context = attention = 0
        widths = []
        for seq, n in scheduled:
            c = seq.num_computed_tokens
            tokens += n
            if seq.is_decoding and n <= MAX_GROUP_QUERIES + 1:
                decodes += 1
                context += c + n
                widths.append(len(seq.block_table))
            else:
                prefills += 1
                attention += n * (c + n)
            if c + n >= seq.num_tokens:
                sampled += 1
        widths.sort(reverse=True)
        return [tokens, decodes, prefills, sampled, len(decode_groups(widths)), context,
                attention]
