"""What a session sends: its history, and each of its requests built from it.

A chat's turn `t` sends the whole history (the system prompt, every earlier message and the
model's real answers) plus a new user message; an agent task's later calls send the history
plus the tool's output. Session `i`'s plan (its turns, labels, messages and output lengths)
depends only on `(seed, i)`; its history holds what the model really answered.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from latlab.load.workload.datasets import Turn
from latlab.load.workload.requests import RequestSpec, Workload
from latlab.records.timeline import SessionStep
from latlab.records.workload import CHAT_APIS


class Conversation:
    """One session of a run: how many requests it makes, and each one's content."""

    def __init__(self, workload: Workload, index: int, session_id: str) -> None:
        c = workload.config
        self.workload, self.index, self.id = workload, index, session_id
        self.kind = c.sessions.kind
        rng = np.random.default_rng([c.seed, 5, index])
        self.tenant, self.priority = workload.labels(rng)
        system = workload.prefix if c.prefix_tokens and rng.random() < c.prefix_fraction else ""
        self.script: list[Turn] | None = None
        self.salt = ""  # a dataset conversation's salt words, before its first message
        if workload.dataset is None:
            self.turns = c.sessions.turns.sample(rng)
        else:
            entry = workload.dataset[index % len(workload.dataset)]
            script = entry.turns or [Turn(entry.prompt or "", entry.output_text)]
            self.turns = (len(script) if c.sessions.turns is None
                          else min(len(script), c.sessions.turns.sample(rng)))
            self.script = script[: self.turns]
            system += entry.system or ""
            self.salt = workload.salt_words
            if system:
                system, self.salt = self.salt + system, ""
        self.messages: list[dict[str, Any]] = (
            [{"role": "system", "content": system}] if system else [])
        self.tokens = self._count(system)  # the history's prompt tokens so far

    def request(self, turn: int, index: int, tool_output: str | None = None) -> RequestSpec:
        """Turn `turn`'s request (1 is the first): the history plus a new message (the
        user's; for an agent's later calls the tool's output, given or synthetic). It joins
        the history at once; the answer joins it with `answered`."""
        c = self.workload.config
        rng = np.random.default_rng([c.seed, 5, self.index, turn])
        text, tokens, max_tokens = self._message(turn, rng, tool_output)
        self.messages.append({"role": "user", "content": text})
        self.tokens += tokens
        spec = RequestSpec(index=index, prompt=None, messages=None, prompt_tokens=self.tokens,
                           max_tokens=max_tokens, tenant=self.tenant, priority=self.priority,
                           session=SessionStep(id=self.id, turn=turn, turns=self.turns,
                                               kind=self.kind))
        if c.api in CHAT_APIS:
            spec.messages = list(self.messages)
        elif self.script is not None:
            spec.prompt = self.workload.tokenizer.apply_chat_template(self.messages)
        else:
            spec.prompt = "".join(m["content"] for m in self.messages)
        return spec

    def answered(self, text: str, tokens: int | None) -> None:
        """The model's answer to the last request joins the history."""
        self.messages.append({"role": "assistant", "content": text})
        self.tokens += tokens if tokens is not None else self._count(text)

    def _message(self, turn: int, rng: np.random.Generator, tool_output: str | None
                 ) -> tuple[str, int, int]:
        """The new message's text and tokens, and the output length to ask for."""
        c = self.workload.config
        lengths = c.prompt_tokens if turn == 1 else c.sessions.message_tokens or c.prompt_tokens
        if self.script is not None and (self.kind == "chat" or turn == 1):
            line = self.script[turn - 1]
            reply = self._count(line.reply) if line.reply else 0
            user, self.salt = self.salt + line.user, ""
            return user, self._count(user), reply or c.output_tokens.sample(rng)
        n = lengths.sample(rng)
        max_tokens = c.output_tokens.sample(rng)
        if tool_output is not None:
            return tool_output, self._count(tool_output), max_tokens
        words = rng if c.prompt_salt is None else np.random.default_rng(
            [c.seed, 6, c.prompt_salt, self.index, turn])
        return self.workload.text(words, n), n, max_tokens

    def _count(self, text: str) -> int:
        return len(self.workload.tokenizer.encode(text)) if text else 0
