"""What to send: prompts and output lengths, synthetic or from a dataset, with labels.

Request `i` depends only on `(seed, i)`, so worker processes that share a schedule build
the same requests, and a rerun with the same config sends the same prompts.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from latlab.load.workload.arrivals import arrival_times
from latlab.load.workload.datasets import load_dataset
from latlab.load.workload.trace_requests import TracePrompts, session_step, trace_step
from latlab.load.workload.traces import Replayed, TraceCursor
from latlab.records.arrivals import ArrivalConfig
from latlab.records.lengths import WorkloadError
from latlab.records.timeline import SessionStep, TraceStep
from latlab.records.workload import CHAT_APIS, Api, WorkloadConfig
from latlab.tokenizer import Tokenizer, TokenizerError

__all__ = ["Api", "RequestSpec", "Workload", "WorkloadError"]
_WORD = re.compile(r" [a-z]{2,12}")
SALT_WORDS = 4  # a salted run's words before each dataset prompt
CHAT_TOKENS_PER_MESSAGE = 8  # what a chat template adds around each message, at most


@dataclass(slots=True)
class RequestSpec:
    """One request's content: a prompt (completions) or messages (chat), and its labels."""

    index: int
    prompt: str | None
    messages: list[dict[str, Any]] | None
    prompt_tokens: int | None
    max_tokens: int
    tenant: str | None = None
    priority: int | None = None
    fitted: bool = False  # max_tokens lowered to fit the server's context
    session: SessionStep | None = None  # where it sits in a session (its answer is kept)
    trace: TraceStep | None = None  # a replayed trace's row, and what it asked for

    @property
    def context_needed(self) -> int | None:
        """Tokens of context the request needs at most: prompt (with a chat template's
        additions), output and a BOS token."""
        if self.prompt_tokens is None:
            return None
        template = CHAT_TOKENS_PER_MESSAGE * (len(self.messages) + 1) if self.messages else 0
        return self.prompt_tokens + template + 1 + self.max_tokens


class Workload:
    """Builds request `i` of a run from its `WorkloadConfig`; with `arrivals` that replay a
    trace, request `i` is the trace window's `i`-th (its lengths, blocks, session and labels,
    where the trace gives them; `duration_s` ends the window)."""

    def __init__(self, config: WorkloadConfig, arrivals: ArrivalConfig | None = None,
                 duration_s: float | None = None) -> None:
        self.config = config
        self.arrivals = arrivals
        try:
            self.tokenizer = Tokenizer.load(config.tokenizer)
        except TokenizerError as e:
            raise WorkloadError(f"--tokenizer: {e}") from None
        self._words = _word_pool(self.tokenizer)
        self._dataset = load_dataset(config.dataset) if config.dataset else None
        salt = [] if config.prompt_salt is None else [config.prompt_salt]
        self._prefix = self.text(np.random.default_rng([config.seed, 1, *salt]),
                                  config.prefix_tokens)
        self._salt_words = (self.text(np.random.default_rng([config.seed, 4, *salt]),
                                      SALT_WORDS).strip() + " " if salt else "")
        self._tenants = _choice(config.tenants)
        self._priorities = _choice(config.priorities)
        self.trace = self._prompts = None
        if arrivals is not None and arrivals.process == "trace":
            self.trace = TraceCursor(arrivals, duration_s)
            self._prompts = TracePrompts(self.words, config.seed, config.prompt_salt,
                                         arrivals.length_scale)
            first = self.trace.first
            if first is not None and first.row.prompt_tokens is not None and config.sessions:
                raise WorkloadError("--turns and --agent-steps build synthetic sessions; the "
                                    f"--trace {arrivals.trace} says what each request sends "
                                    "(and its sessions): drop them")

    def arrival_times(self):
        """The run's arrival offsets (s): the trace window's, else `arrivals`' process."""
        return self.trace.offsets() if self.trace is not None else arrival_times(self.arrivals)

    def request(self, index: int) -> RequestSpec:
        c = self.config
        rng = np.random.default_rng([c.seed, 0, index])
        shared = c.prefix_tokens > 0 and rng.random() < c.prefix_fraction
        spec = RequestSpec(index=index, prompt=None, messages=None, prompt_tokens=None,
                           max_tokens=0, tenant=self._tenants(rng),
                           priority=self._priorities(rng))
        replayed = self._replayed(index)
        if replayed is not None and replayed.row.prompt_tokens is not None:
            self._from_trace(spec, rng, replayed)
        elif self._dataset is None:
            self._synthetic(spec, rng, shared)
        else:
            self._from_dataset(spec, rng, shared)
        if replayed is not None:
            self._trace_labels(spec, replayed)
        self.fit(spec)
        return spec

    def _replayed(self, index: int) -> Replayed | None:
        if self.trace is None:
            return None
        replayed = self.trace.get(index)
        if replayed is None:
            raise WorkloadError(f"--trace {self.arrivals.trace}: the window holds no request "
                                f"{index} (its requests ran out)")
        return replayed

    def _from_trace(self, spec: RequestSpec, rng: np.random.Generator,
                    replayed: Replayed) -> None:
        """The trace's lengths (scaled) and blocks; an output length the trace does not give
        is drawn from --output-tokens."""
        prompt, output = self._prompts.lengths(replayed)
        spec.prompt_tokens = prompt
        spec.max_tokens = output or self.config.output_tokens.sample(rng)
        if replayed.row.api is not None and self.config.api in CHAT_APIS:
            # the row's count is the model's whole input: the server adds the template again
            prompt = max(1, prompt - self.chat_template_tokens)
        text = self._prompts.text(replayed, prompt)
        if self.config.api in CHAT_APIS:
            spec.messages = [{"role": "user", "content": text}]
        else:
            spec.prompt = text

    def _trace_labels(self, spec: RequestSpec, replayed: Replayed) -> None:
        row = replayed.row
        spec.trace = trace_step(replayed)
        spec.session = session_step(replayed, self.trace.turns)
        spec.tenant = row.tenant if row.tenant is not None else spec.tenant
        spec.priority = row.priority if row.priority is not None else spec.priority

    def fit(self, spec: RequestSpec) -> bool:
        """Lower `spec.max_tokens` so that it fits the server's context; False when its
        prompt alone leaves no room for one output token."""
        limit, needed = self.config.context_tokens, spec.context_needed
        if limit is None or needed is None or needed <= limit:
            return True
        if needed - limit >= spec.max_tokens:
            return False
        spec.max_tokens -= needed - limit
        spec.fitted = True
        return True

    @functools.cached_property
    def chat_template_tokens(self) -> int:
        """What the chat template adds around one user message (the tokenizer's)."""
        return len(self.tokenizer.encode(self.tokenizer.apply_chat_template(
            [{"role": "user", "content": ""}])))

    @property
    def dataset(self) -> list | None:
        """The dataset's entries (None for synthetic prompts)."""
        return self._dataset

    @property
    def prefix(self) -> str:
        """The shared system prompt (`--prefix-tokens`), "" without one."""
        return self._prefix

    @property
    def salt_words(self) -> str:
        """A salted run's words before every dataset prompt ("" unsalted)."""
        return self._salt_words

    def labels(self, rng: np.random.Generator) -> tuple[str | None, int | None]:
        """A tenant and a priority, drawn by their weights."""
        return self._tenants(rng), self._priorities(rng)

    def prompts_too_long(self, count: int) -> tuple[int, int, int]:
        """Of the first `count` requests (a trace's window may hold fewer), how many have
        prompts that leave no room for one output token in the server's context, the longest
        prompt (tokens), and how many were looked at."""
        limit = self.config.context_tokens
        if limit is None:
            return 0, 0, 0
        if self.trace is not None:
            count = next((i for i in range(count) if self.trace.get(i) is None), count)
        specs = [self.request(i) for i in range(count)]
        over = [s for s in specs if (s.context_needed or 0) - s.max_tokens + 1 > limit]
        return len(over), max((s.prompt_tokens or 0 for s in specs), default=0), count

    def _synthetic(self, spec: RequestSpec, rng: np.random.Generator, shared: bool) -> None:
        n = self.config.prompt_tokens.sample(rng)
        own = self.text(rng, n)
        if self.config.prompt_salt is not None:  # other words, the same lengths
            own = self.text(np.random.default_rng(
                [self.config.seed, 3, self.config.prompt_salt, spec.index]), n)
        spec.max_tokens = self.config.output_tokens.sample(rng)
        spec.prompt_tokens = n + (self.config.prefix_tokens if shared else 0)
        if self.config.api in CHAT_APIS:
            system = [{"role": "system", "content": self._prefix}] if shared else []
            spec.messages = system + [{"role": "user", "content": own}]
        else:
            spec.prompt = self._prefix + own if shared else own

    def _from_dataset(self, spec: RequestSpec, rng: np.random.Generator, shared: bool) -> None:
        entry = self._dataset[spec.index % len(self._dataset)]
        max_tokens = entry.output_tokens
        if max_tokens is None and entry.output_text is not None:
            max_tokens = max(1, len(self.tokenizer.encode(entry.output_text)))
        spec.max_tokens = max_tokens or self.config.output_tokens.sample(rng)
        spec.tenant = entry.tenant or spec.tenant
        spec.priority = entry.priority if entry.priority is not None else spec.priority
        prefix = self._prefix if shared else ""
        if self.config.api in CHAT_APIS:
            messages = entry.messages or [{"role": "user", "content": entry.prompt}]
            system = [{"role": "system", "content": prefix}] if prefix else []
            first, *rest = system + messages  # the salt goes before the first message's words
            words = self._salt_words + str(first.get("content") or "")
            spec.messages = [{**first, "content": words}, *rest]
            spec.prompt_tokens = sum(len(self.tokenizer.encode(str(m.get("content") or "")))
                                     for m in spec.messages)
        else:
            text = entry.prompt
            if text is None:
                text = self.tokenizer.apply_chat_template(entry.messages)
            spec.prompt = self._salt_words + prefix + text
            spec.prompt_tokens = len(self.tokenizer.encode(spec.prompt))

    def text(self, rng: np.random.Generator, n_tokens: int) -> str:
        """Words that are one token each, drawn at random: exactly `n_tokens` tokens."""
        return "".join(self.words(rng, n_tokens))

    def words(self, rng: np.random.Generator, n_tokens: int) -> list[str]:
        """`n_tokens` words that are one token each, drawn at random."""
        if n_tokens == 0:
            return []
        words = self._words
        return [words[i] for i in rng.integers(0, len(words), n_tokens)]


def _word_pool(tokenizer: Tokenizer) -> list[str]:
    """Lower-case words that encode to exactly one token, alone and after one another."""
    backend = tokenizer.backend
    texts = backend.decode_batch([[i] for i in range(tokenizer.vocab_size)])
    candidates = [(i, t) for i, t in enumerate(texts) if _WORD.fullmatch(t)]
    encoded = backend.encode_batch([t for _, t in candidates], add_special_tokens=False)
    words = [t for (i, t), e in zip(candidates, encoded) if e.ids == [i]]
    probe = words[:200]
    if len(words) < 100 or len(tokenizer.encode("".join(probe))) != len(probe):
        raise WorkloadError("--tokenizer: cannot build prompts of exact token counts with it "
                            "(no single-token words found); use --dataset")
    return words


def _choice(weights: dict[Any, float]):
    if not weights:
        return lambda rng: None
    labels = list(weights)
    p = np.asarray([weights[k] for k in labels], dtype=float)
    p /= p.sum()
    return lambda rng: labels[int(rng.choice(len(labels), p=p))]
