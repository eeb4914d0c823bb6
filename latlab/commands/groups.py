"""The option groups `bench`, `sweep` and `coldstart` share, and what they build: the target,
the workload, the arrivals and when to stop. Each command inherits the groups it takes."""

from __future__ import annotations

import secrets
import shlex
from pathlib import Path
from typing import Any, Sequence

from pydantic import ValidationError

from latlab.commands.common import UsageError
from latlab.commands.options import Options, opt, parse_numbers, validation_message
from latlab.records.config import BenchConfig, parse_slo
from latlab.records.workload import (
    OPEN_LOOP,
    Api,
    LengthDistribution,
    SessionConfig,
    WorkloadConfig,
    WorkloadError,
)

API_NAMES = Api.__args__


def split_serve_args(text: str) -> list[str]:
    """--serve-args as a list of arguments (unbalanced quotes: a usage error)."""
    try:
        return shlex.split(text)
    except ValueError as e:
        raise UsageError(f"--serve-args {text!r}: {e}") from None


class ClientOptions(Options):
    model: str | None = opt(None, "Model name to request (default: the first the server "
                                  "lists at /v1/models).")
    api_key: str | None = opt(None, "Bearer token for the target (never stored).",
                              envvar="OPENAI_API_KEY")
    timeout: float = opt(300.0, "Per-request timeout in seconds.", to="timeout_s")
    ignore_eos: bool = opt(True, "Send ignore_eos and min_tokens to hold the output length.")
    continuous_usage: bool = opt(True, "Ask for cumulative usage in every chunk (tokens per "
                                       "event).")
    stream: bool = opt(True, "Stream the answers; without, a request's first token is its "
                             "whole answer (TTFT = E2E), as TGI's timing headers need.")
    keepalive: bool = opt(True, "Reuse connections; without, every request opens its own.")
    server_kind: str = opt("auto", "Whose server timings to read: auto, latlab, llamacpp, vllm, "
                                   "sglang, tgi, ollama or openai (none).")


class TargetOptions(ClientOptions):
    url: str | None = opt(None, "Target server (http://HOST:PORT). Without it the embedded "
                                "engine (latlab serve) is started.")
    serve_args: str = opt("", "Arguments for the embedded latlab serve.")

    def serve(self) -> list[str]:
        """--serve-args as a list of arguments."""
        return split_serve_args(self.serve_args)


class WorkloadOptions(Options):
    api: str = opt("completions", "completions, chat (OpenAI), ollama or ollama-chat "
                                  "(Ollama's native /api/generate, /api/chat).")
    prompt_tokens: str = opt("lognormal:256,128", "Prompt length distribution: N, fixed:N, "
                             "uniform:LO,HI, normal:MEAN,STD, lognormal:MEAN,STD (in tokens).")
    output_tokens: str = opt("lognormal:64,32", "Output length distribution (held with "
                             "max_tokens, ignore_eos and min_tokens).")
    dataset: Path | None = opt(None, "JSONL (prompt or messages, optional output_tokens, "
                                     "tenant, priority) or ShareGPT JSON.")
    prefix_tokens: int = opt(0, "A shared system prompt of this many tokens...")
    prefix_fraction: float = opt(1.0, "...for this fraction of the requests.")
    tenant: list[str] = opt([], "Tenant label NAME[:WEIGHT], sent as `user` (repeatable).",
                            to="tenants")
    priority: list[str] = opt([], "Priority INT[:WEIGHT], sent as `priority` (repeatable).",
                              to="priorities")
    tokenizer: str | None = opt(None, "The target's tokenizer (tokenizer.json or HF folder) "
                                      "(default: latlab's bundled one).")
    seed: int = opt(0, "Seed of the workload and the arrivals.")
    salt_prompts: bool = opt(False, "Give this run its own prompt words (same lengths), so the "
                                    "server's prompt cache keeps nothing from earlier runs.",
                             to="prompt_salt")

    def workload(self, tokenizer: str | None = None) -> WorkloadConfig:
        """The workload; `tokenizer` stands in for an unset --tokenizer."""
        if self.api not in API_NAMES:
            raise UsageError(f"--api {self.api!r}: expected one of {', '.join(API_NAMES)}")
        try:
            return WorkloadConfig(
                api=self.api,
                prompt_tokens=LengthDistribution.parse(self.prompt_tokens, "--prompt-tokens"),
                output_tokens=LengthDistribution.parse(self.output_tokens, "--output-tokens"),
                dataset=self.dataset, prefix_tokens=self.prefix_tokens,
                prefix_fraction=self.prefix_fraction,
                tenants=_weights(self.tenant, "--tenant", str),
                priorities=_weights(self.priority, "--priority", int),
                tokenizer=self.tokenizer or tokenizer, seed=self.seed,
                prompt_salt=secrets.randbits(31) if self.salt_prompts else None)
        except ValidationError as e:
            raise UsageError(validation_message(e, type(self).flags_by_target())) from None
        except WorkloadError as e:
            raise UsageError(str(e)) from None


THINK_S = 3.0  # the default think time's mean, at most a tenth of --duration
TOOL_MS = "lognormal:100,50"


class SessionOptions(Options):
    turns: str | None = opt(None, "Sessions: chats of N turns (or a distribution; `all`: a "
                                  "dataset's whole conversations), each prompt the whole "
                                  "history plus a new message.")
    think_time: str | None = opt(None, "Seconds between a turn's answer and the next turn "
                                       "(a distribution; 0: none; default: lognormal around "
                                       "3 s, at most a tenth of --duration).")
    agent_steps: str | None = opt(None, "Agent tasks: N model calls (or a distribution) with a "
                                        "tool step between two.")
    tool_latency: str | None = opt(None, "A tool step's milliseconds (a distribution; default "
                                         f"{TOOL_MS}).")
    tool_url: str | None = opt(None, "A real tool: POST it each answer; its reply is the next "
                                     "message (instead of --tool-latency).")
    message_tokens: str | None = opt(None, "A session's later messages (user turns, tool "
                                           "output): length distribution (default: "
                                           "--prompt-tokens).")

    def sessions(self, duration_s: float | None) -> SessionConfig | None:
        """The sessions asked for, None for independent requests; `UsageError` names the
        option that does not fit."""
        chat = self.turns is not None
        if chat and self.agent_steps is not None:
            raise UsageError("--turns (chats) and --agent-steps (agent tasks) exclude each other")
        if not chat and self.agent_steps is None:
            for flag, value in (("--think-time", self.think_time),
                                ("--tool-latency", self.tool_latency),
                                ("--tool-url", self.tool_url),
                                ("--message-tokens", self.message_tokens)):
                if value is not None:
                    raise UsageError(f"{flag} shapes sessions: give --turns or --agent-steps")
            return None
        if chat and (self.tool_latency is not None or self.tool_url is not None):
            raise UsageError("--tool-latency and --tool-url go with --agent-steps")
        if not chat and self.think_time is not None:
            raise UsageError("--think-time goes with --turns (an agent's gaps are its tools)")
        if self.tool_url is not None and not self.tool_url.startswith(("http://", "https://")):
            raise UsageError(f"--tool-url {self.tool_url!r}: expected http://HOST:PORT/PATH")
        try:
            turns = self.turns if chat else self.agent_steps
            return SessionConfig(
                kind="chat" if chat else "agent",
                turns=None if turns == "all" else LengthDistribution.parse(
                    turns, "--turns" if chat else "--agent-steps"),
                think_s=self._think(duration_s) if chat else None,
                tool_ms=None if chat or self.tool_url else LengthDistribution.parse(
                    self.tool_latency or TOOL_MS, "--tool-latency"),
                tool_url=self.tool_url,
                message_tokens=LengthDistribution.parse(self.message_tokens, "--message-tokens")
                if self.message_tokens is not None else None)
        except WorkloadError as e:
            raise UsageError(str(e)) from None

    def _think(self, duration_s: float | None) -> LengthDistribution | None:
        if self.think_time is None:
            mean = min(THINK_S, duration_s / 10) if duration_s else THINK_S
            return LengthDistribution(kind="lognormal", a=mean, b=mean / 2)
        if self.think_time.strip() in ("0", "0.0", "fixed:0"):
            return None
        return LengthDistribution.parse(self.think_time, "--think-time")


class ArrivalShape(Options):
    arrival: str | None = opt(None, "Open-loop arrivals: poisson, gamma or constant (default: "
                                    "poisson).")
    burstiness: float | None = opt(None, "Gamma shape: 1 is Poisson, below 1 burstier "
                                         "(CV = 1/sqrt(burstiness)).")
    max_concurrency: int | None = opt(None, "Cap on requests in flight (open loop); waiting "
                                            "shows as lateness.")


class SweepPlan(ArrivalShape):
    """The loads of a sweep and what its points are judged at (`latlab sweep`, `latlab
    predict --sweep`)."""

    rates: str | None = opt(None, "Sweep: open-loop request rates to run, e.g. 1,2,4 "
                                  "(default: automatic).")
    points: int = opt(6, "Sweep, automatic plan: rates spread between the synchronous rate "
                         "and the saturation throughput.")
    percentile: float = opt(99.0, "Sweep: the percentile the SLOs and the knee are judged at.")

    def plan(self, base: BenchConfig, **more: object):
        """A `SweepConfig` over `base` (its arrival shape from --arrival/--burstiness; a
        usage error names the option at fault)."""
        from latlab.commands.sweep_points import SweepConfig

        try:
            return SweepConfig(
                base=base, rates=parse_numbers(self.rates, "--rates"), points=self.points,
                percentile=self.percentile,
                burstiness=1.0 if self.burstiness is None else self.burstiness,
                arrival=self.arrival or ("gamma" if self.burstiness is not None else "poisson"),
                **more)
        except ValidationError as e:
            raise UsageError(validation_message(e, self.flags_by_target())) from None


def arrival_process(arrival: str | None, burstiness: float | None, rate: float | None,
                    users: int | None, trace: object | None) -> str:
    """The arrival process the load options ask for (`ArrivalConfig.process`), or a usage
    error for options that exclude each other or shape nothing."""
    if arrival is not None and arrival not in OPEN_LOOP:
        raise UsageError(f"--arrival {arrival!r}: expected one of {', '.join(OPEN_LOOP)}")
    if trace is not None:
        if rate is not None or users is not None:
            raise UsageError("--trace replays its own timestamps: drop --rate/--users")
        return "trace"
    if rate is not None:
        if users is not None:
            raise UsageError("--users (closed loop) and --rate (open loop) exclude each "
                             "other; cap an open loop with --max-concurrency")
        return arrival or ("gamma" if burstiness is not None else "poisson")
    if arrival is not None or burstiness is not None:
        raise UsageError("--arrival and --burstiness shape an open loop: give --rate")
    return "closed"


def window_s(duration: float | None, warmup: float | None, cooldown: float | None
             ) -> tuple[float, float]:
    """The warm-up and cool-down excluded from statistics: as given, else 10% of the duration
    (at most 5 s) and 5% (at most 2 s); none for a run without a duration."""
    return (warmup if warmup is not None else (min(0.1 * duration, 5.0) if duration else 0.0),
            cooldown if cooldown is not None else (min(0.05 * duration, 2.0) if duration else 0.0))


class StopOptions(Options):
    duration: float | None = opt(None, "Seconds of load (default: 20 unless --requests).",
                                 to="duration_s")
    requests: int | None = opt(None, "Stop after this many requests.")
    warmup: float | None = opt(None, "Seconds excluded from statistics at the start (default: "
                                     "10% of --duration, at most 5).", to="warmup_s")
    cooldown: float | None = opt(None, "Seconds excluded at the end (default: 5% of "
                                       "--duration, at most 2).", to="cooldown_s")
    drain: float = opt(30.0, "After --duration, seconds the requests in flight may still take; "
                             "then they are cancelled and recorded as unfinished.",
                       to="drain_s")
    workers: str = opt("1", "Client processes sharing the schedule, or `auto`: as many as the "
                            "offered load needs, from a short self-check of this machine.")
    ray: str | None = opt(None, "Run the workers as Ray actors spread over a cluster's nodes: "
                                "its head's HOST:PORT, or `auto` for the "
                                "cluster on this machine (started for the run if none runs).",
                          metavar="ADDRESS")

    def worker_count(self) -> int | str:
        """--workers as a count, or "auto"; `UsageError` for anything else."""
        if self.workers == "auto":
            return "auto"
        try:
            return int(self.workers)
        except ValueError:
            raise UsageError(f"--workers {self.workers!r}: expected a count or auto") from None


class SloOptions(Options):
    slo: list[str] = opt([], "SLO like ttft=200ms or tpot=50ms (repeatable); sets goodput.",
                         to="slos")

    def slos(self) -> dict[str, float]:
        try:
            return dict(parse_slo(text) for text in self.slo)
        except ValueError as e:
            raise UsageError(f"--slo: {e}") from None


class OutputOptions(SloOptions):
    out: Path = opt(Path("runs"), "Folder for run folders.")
    name: str | None = opt(None, "Run name (in the folder name).")
    tag: list[str] = opt([], "Free-form tag recorded in config.json (repeatable).", to="tags")
    progress: bool | None = opt(None, "Live progress (default: on a terminal).",
                                "--progress/--no-progress")


def engine_tokenizer(serve_args: Sequence[str]) -> str | None:
    """The embedded engine's checkpoint folder, when it serves one: prompts are then counted
    in that model's tokens."""
    for i, arg in enumerate(serve_args):
        value = serve_args[i + 1] if arg == "--model" and i + 1 < len(serve_args) else (
            arg.removeprefix("--model=") if arg.startswith("--model=") else None)
        if value and (Path(value) / "tokenizer.json").is_file():
            return value
    return None


def _weights(items: Sequence[str], option: str, kind: type) -> dict[Any, float]:
    weights: dict[Any, float] = {}
    for item in items:
        label, _, weight = item.rpartition(":") if ":" in item else (item, "", "1")
        try:
            weights[kind(label)] = float(weight)
        except ValueError:
            raise UsageError(f"{option} {item!r}: expected LABEL[:WEIGHT]"
                             + (" with an integer LABEL" if kind is int else "")) from None
    return weights
