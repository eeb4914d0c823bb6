"""The command-line options `bench`, `sweep` and `coldstart` share, declared once.

    def bench(model: options.Model = None, prompt_tokens: options.PromptTokens = "256", ...)

The parameter's name gives the option's name and its default stays in the signature.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

Url = Annotated[str | None, typer.Option(
    help="Target server (http://HOST:PORT). Without it the embedded engine (latlab serve) "
         "is started.")]
Model = Annotated[str | None, typer.Option(
    help="Model name to request (default: the first the server lists at /v1/models).")]
ApiKey = Annotated[str | None, typer.Option(
    envvar="OPENAI_API_KEY", show_envvar=True, help="Bearer token for the target.")]
Api = Annotated[str, typer.Option(help="completions or chat.")]
PromptTokens = Annotated[str, typer.Option(
    help="Prompt length distribution: N, fixed:N, uniform:LO,HI, normal:MEAN,STD, "
         "lognormal:MEAN,STD (in tokens).")]
OutputTokens = Annotated[str, typer.Option(
    help="Output length distribution (held with max_tokens, ignore_eos and min_tokens).")]
Dataset = Annotated[Path | None, typer.Option(
    help="JSONL (prompt or messages, optional output_tokens, tenant, priority) or ShareGPT "
         "JSON.")]
PrefixTokens = Annotated[int, typer.Option(help="A shared system prompt of this many tokens...")]
PrefixFraction = Annotated[float, typer.Option(help="...for this fraction of the requests.")]
Tenant = Annotated[list[str], typer.Option(
    help="Tenant label NAME[:WEIGHT], sent as `user` (repeatable).")]
Priority = Annotated[list[str], typer.Option(
    help="Priority INT[:WEIGHT], sent as `priority` (repeatable).")]
Tokenizer = Annotated[str | None, typer.Option(
    help="The target's tokenizer (tokenizer.json or HF folder) (default: latlab's bundled one).")]
Seed = Annotated[int, typer.Option(help="Seed of the workload and the arrivals.")]
Arrival = Annotated[str | None, typer.Option(
    help="Open-loop arrivals: poisson, gamma or constant (default: poisson).")]
Burstiness = Annotated[float | None, typer.Option(
    help="Gamma shape: 1 is Poisson, below 1 burstier (CV = 1/sqrt(burstiness)).")]
MaxConcurrency = Annotated[int | None, typer.Option(
    help="Cap on requests in flight (open loop); waiting shows as lateness.")]
Duration = Annotated[float | None, typer.Option(
    help="Seconds of load (default: 20 unless --requests).")]
Requests = Annotated[int | None, typer.Option(help="Stop after this many requests.")]
Warmup = Annotated[float | None, typer.Option(
    help="Seconds excluded from statistics at the start (default: 10% of --duration, at "
         "most 5).")]
Cooldown = Annotated[float | None, typer.Option(
    help="Seconds excluded at the end (default: 5% of --duration, at most 2).")]
Timeout = Annotated[float, typer.Option(help="Per-request timeout in seconds.")]
Workers = Annotated[int, typer.Option(help="Client processes sharing the schedule.")]
IgnoreEos = Annotated[bool, typer.Option(
    help="Send ignore_eos and min_tokens to hold the output length.")]
ContinuousUsage = Annotated[bool, typer.Option(
    help="Ask for cumulative usage in every chunk (tokens per event).")]
Slo = Annotated[list[str], typer.Option(
    help="SLO like ttft=200ms or tpot=50ms (repeatable); sets goodput.")]
ServeArgs = Annotated[str, typer.Option(help="Arguments for the embedded latlab serve.")]
Out = Annotated[Path, typer.Option(help="Folder for run folders.")]
Name = Annotated[str | None, typer.Option(help="Run name (in the folder name).")]
Tag = Annotated[list[str], typer.Option(
    help="Free-form tag recorded in config.json (repeatable).")]
Progress = Annotated[bool | None, typer.Option(
    "--progress/--no-progress", help="Live progress (default: on a terminal).")]


def parse_numbers(text: str | None, option: str, kind: type = float) -> list | None:
    """`"1,2,4"` → `[1.0, 2.0, 4.0]` (None stays None); a bad list is a usage error."""
    if text is None:
        return None
    try:
        return [kind(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise typer.BadParameter(f"{text!r}: expected a comma-separated list of "
                                 f"{'whole ' if kind is int else ''}numbers",
                                 param_hint=option) from None


_UNITS_S = {"ms": 1e-3, "s": 1.0, "m": 60.0, "": 1.0}


def parse_seconds(text: str, option: str) -> list[float]:
    """`"500ms,5s,1m"` → `[0.5, 5.0, 60.0]` (a bare number is seconds)."""
    gaps = []
    for item in (i.strip() for i in text.split(",") if i.strip()):
        number = item.rstrip("ms")
        unit = item[len(number):]
        try:
            gaps.append(float(number) * _UNITS_S[unit])
        except (ValueError, KeyError):
            raise typer.BadParameter(f"{item!r}: expected a duration like 500ms, 5s or 1m",
                                     param_hint=option) from None
    return gaps
