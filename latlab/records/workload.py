"""What a run sends: the workload (prompt and output lengths, dataset, labels, sessions).
Request `i` of a workload depends only on `(seed, i)`; `latlab.load.workload.requests` builds
it. When the requests go is `latlab.records.arrivals`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, field_validator, model_validator

from latlab.records.lengths import LengthDistribution
from latlab.records.settings import SESSIONS, WORKLOAD, derive, derived, flag_of, setting

Api = Literal["completions", "chat", "ollama", "ollama-chat", "sglang"]
CHAT_APIS = ("chat", "ollama-chat")  # the APIs that take messages, not a prompt


SessionKind = Literal["chat", "agent"]
TOOL_MS = "lognormal:100,50"  # an agent's tool step without --tool-latency


def _weights(label: type) -> Any:
    """A validator that also takes the command line's `LABEL[:WEIGHT]` items."""

    def parse(value: Any) -> Any:
        if not isinstance(value, (list, tuple)):
            return value
        weights = {}
        for item in map(str, value):
            name, _, weight = item.rpartition(":") if ":" in item else (item, "", "1")
            try:
                weights[label(name)] = float(weight)
            except ValueError:
                raise ValueError(f"{item!r}: expected LABEL[:WEIGHT]"
                                 + (" with an integer LABEL" if label is int else "")) from None
        return weights

    return field_validator("tenants" if label is str else "priorities", mode="before")(
        classmethod(lambda cls, value: parse(value)))


class SessionConfig(BaseModel):
    """Requests in sessions. A chat (`kind="chat"`) of `turns` turns: every turn's prompt is
    the whole history plus a new user message, the model's real answers included, with
    `think_s` seconds (a distribution; None: none) between a turn's end and the next one.
    An agent task (`agent`) of `turns` model calls with a tool step between two: `tool_ms`
    (a distribution) or a real HTTP tool at `tool_url` (POSTed the model's answer), whose
    output is the next message. `turns` None replays a dataset's conversations whole."""

    kind: SessionKind = "chat"
    turns: LengthDistribution | None = setting(
        LengthDistribution(kind="fixed", a=4), "Sessions: chats of N turns (or a distribution; "
        "`all`: a dataset's whole conversations), each prompt the whole history plus a new "
        "message.", group=SESSIONS, cli_type=str | None)
    agent_steps: LengthDistribution | None = setting(
        None, "Agent tasks: N model calls (or a distribution) with a tool step between two.",
        group=SESSIONS, cli_type=str | None, exclude=True)
    think_s: LengthDistribution | None = setting(
        None, "Seconds between a turn's answer and the next turn (a distribution; 0: none; "
        "default: lognormal around 3 s, at most a tenth of --duration).", "--think-time",
        group=SESSIONS, cli_type=str | None)
    tool_ms: LengthDistribution | None = setting(
        None, f"A tool step's milliseconds (a distribution; default {TOOL_MS}).",
        "--tool-latency", group=SESSIONS, cli_type=str | None)
    tool_url: str | None = setting(
        None, "A real tool: POST it each answer; its reply is the next message (instead of "
        "--tool-latency).", group=SESSIONS, pattern=r"^https?://")
    message_tokens: LengthDistribution | None = setting(
        None, "A session's later messages (user turns, tool output): length distribution "
        "(default: --prompt-tokens).", group=SESSIONS, cli_type=str | None)

    @model_validator(mode="before")
    @classmethod
    def _command_line(cls, data: Any) -> Any:
        """--turns all, --think-time 0, and --agent-steps N as an agent's `turns`."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if data.get("turns") == "all":
            data["turns"] = None
        if str(data.get("think_s")).strip() in ("0", "0.0", "fixed:0"):
            data["think_s"] = None
        if data.get("agent_steps") is not None:
            if "turns" in data:
                raise ValueError("--turns (chats) and --agent-steps (agent tasks) exclude "
                                 "each other")
            data |= {"kind": "agent", "turns": data.pop("agent_steps")}
        elif "turns" not in data and "kind" not in data:
            given = flag_of(cls, next(iter(data), "think_s"))
            raise ValueError(f"{given} shapes sessions: give --turns or --agent-steps")
        return data

    @model_validator(mode="after")
    def _check(self) -> SessionConfig:
        if self.kind == "chat" and (self.tool_ms is not None or self.tool_url is not None):
            raise ValueError("--tool-latency and --tool-url go with --agent-steps")
        if self.kind == "agent":
            if self.think_s is not None:
                raise ValueError("--think-time goes with --turns (an agent's gaps are its "
                                 "tools)")
            if self.tool_url is None and self.tool_ms is None \
                    and "tool_ms" not in self.model_fields_set:
                derive(self, tool_ms=LengthDistribution.model_validate(TOOL_MS))
        return self

    def think_default(self, duration_s: float | None) -> None:
        """A chat without a think time given gets the default: lognormal around 3 s, at most
        a tenth of `duration_s`."""
        if self.kind == "chat" and "think_s" not in self.model_fields_set:
            mean = min(THINK_S, duration_s / 10) if duration_s else THINK_S
            derive(self, think_s=LengthDistribution(kind="lognormal", a=mean, b=mean / 2))


THINK_S = 3.0


class WorkloadConfig(BaseModel):
    """The requests of a run. A dataset replaces the synthetic prompts (and, where it gives
    one, the output length); a `prefix_tokens` system prompt is shared by a `prefix_fraction`
    of the requests; labels are drawn per request by weight. A `prompt_salt` changes every
    prompt's words (not its length), so a server's prompt cache keeps nothing from another
    run; a dataset's prompts get a few salt words in front. `prompts` says which salt a run
    gets: its own (`fresh`, the default: no server has seen them), none (`seed`: the seed's
    own words, the same in every run), or a run folder's (that run's prompts again)."""

    api: Api = setting("completions", "completions, chat (OpenAI), ollama or ollama-chat "
                       "(Ollama's native /api/generate, /api/chat), sglang (SGLang's native "
                       "/generate).", group=WORKLOAD,
                       cli_type=str)
    prompt_tokens: LengthDistribution = setting(
        LengthDistribution(kind="lognormal", a=256, b=128), "Prompt length distribution: N, "
        "fixed:N, uniform:LO,HI, normal:MEAN,STD, lognormal:MEAN,STD (in tokens).",
        group=WORKLOAD, cli_type=str)
    output_tokens: LengthDistribution = setting(
        LengthDistribution(kind="lognormal", a=64, b=32), "Output length distribution (held "
        "with max_tokens, ignore_eos and min_tokens).", group=WORKLOAD, cli_type=str)
    dataset: Path | None = setting(None, "JSONL (prompt or messages, optional output_tokens, "
                                   "tenant, priority) or ShareGPT JSON.", group=WORKLOAD)
    prefix_tokens: int = setting(0, "A shared system prompt of this many tokens...",
                                 group=WORKLOAD, ge=0)
    prefix_fraction: float = setting(1.0, "...for this fraction of the requests.",
                                     group=WORKLOAD, ge=0, le=1)
    tenants: dict[str, float] = setting({}, "Tenant label NAME[:WEIGHT], sent as `user` "
                                        "(repeatable).", "--tenant", group=WORKLOAD,
                                        cli_type=list[str])
    priorities: dict[int, float] = setting({}, "Priority INT[:WEIGHT], sent as `priority` "
                                           "(repeatable).", "--priority", group=WORKLOAD,
                                           cli_type=list[str])
    tokenizer: str | None = setting(None, "The target's tokenizer (tokenizer.json or HF "
                                    "folder) (default: latlab's bundled one).", group=WORKLOAD)
    seed: int = setting(0, "Seed of the workload and the arrivals.", group=WORKLOAD)
    prompts: str = setting("fresh", "Prompt words: fresh (this run's own, the same lengths: "
                           "no server has seen them), seed (the seed's own, the same in every "
                           "run: for prompt-cache studies), or a run folder (its prompts "
                           "again).", group=WORKLOAD, metavar="fresh|seed|RUN_DIR")
    prompt_salt: int | None = derived()  # what `prompts` gave the run (None: the seed's words)
    context_tokens: int | None = derived()  # the server's context: max_tokens fits it
    sessions: SessionConfig | None = None  # None: independent single-turn requests

    _tenants = _weights(str)
    _priorities = _weights(int)

    @model_validator(mode="after")
    def _check(self) -> WorkloadConfig:
        if self.sessions is not None and self.sessions.turns is None and self.dataset is None:
            raise ValueError("--turns all replays a dataset's conversations: give --dataset")
        if self.prompts not in ("fresh", "seed") and not Path(self.prompts).is_dir():
            raise ValueError(f"--prompts {self.prompts!r}: expected fresh, seed or a run folder")
        for option, weights in (("--tenant", self.tenants), ("--priority", self.priorities)):
            if any(w <= 0 for w in weights.values()):
                raise ValueError(f"{option}: weights must be positive")
        return self
