"""Advice that knows the server: what a finding says to try, given what the server says of
its own settings (`config.json` → `target.settings`), who it is (each server's own flag for a
knob, `FLAGS`), and what the run itself measured.

Advice is never printed when it is already in effect (the server says so, or it is that
server's default), when the run's own data contradicts it (prompt tokens already came from
the prefix cache; a workload whose prompts share nothing), or when the server is host-bound
(`host_bound`: more, smaller steps only cost more there). A suggestion that names a setting
carries it as a `Change`: the server's own options, which `latlab ab` can measure and
`latlab predict` can simulate. Only a server that tells nothing and whose defaults latlab
does not know gets "if not already on"."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from latlab.analysis.findings import Advice, Change, Knob
from latlab.analysis.host_bound import HostBound, host_bound

if TYPE_CHECKING:
    from latlab.analysis.run_analysis import RunAnalysis
    from latlab.records.server import ServerSettings

Where = Literal["option", "environment", "request", "automatic"]


@dataclass(frozen=True)
class Flag:
    """How one server sets one knob: `spelling` with `{n}` for the value, where it is set
    (a command-line option, an environment variable, a field of each request, or nothing to
    set), the server's default, and what is worth knowing about it."""

    spelling: str
    where: Where = "option"
    default: int | bool | None = None
    note: str = ""

    def written(self, value: int | bool) -> str:
        return self.spelling.format(n=value)


# From each server's source or documentation (docs/reference/advice.md shows this table).
FLAGS: dict[Knob, dict[str, Flag]] = {
    "step_tokens": {
        "latlab": Flag("--max-num-batched-tokens {n}", default=512,
                       note="the token budget of one step; prompts are cut into chunks of it"),
        "vllm": Flag("--max-num-batched-tokens {n}",
                     note="chunked prefill is on by default (V1); the default depends on the "
                          "GPU and the usage context"),
        "sglang": Flag("--chunked-prefill-size {n}",
                       note="-1 turns chunking off; the default depends on the GPU's memory"),
        "llamacpp": Flag("-b {n} -ub {n}", default=2048,
                         note="prompts fill a batch up to -b (default 2048) and tokens go out "
                              "after each -b batch; -ub (default 512) only splits the batch's "
                              "compute, so -ub alone does not shorten the stall"),
        "tgi": Flag("--max-batch-prefill-tokens {n}",
                    note="the prefill tokens of one forward pass"),
        "ollama": Flag("num_batch: {n}", "request",
                       default=512, note="a model option (request `options` or a Modelfile "
                                         "PARAMETER)"),
    },
    "prefix_caching": {
        "latlab": Flag("--enable-prefix-caching", default=False),
        "vllm": Flag("--enable-prefix-caching", default=True, note="on by default (V1)"),
        "sglang": Flag("the radix cache (off with --disable-radix-cache)", default=True),
        "llamacpp": Flag("cache_prompt: true", "request", default=True,
                         note="per request, on by default; reuses a slot's own earlier prompt"
                              " (--cache-reuse N shifts chunks of it)"),
        "tgi": Flag("PREFIX_CACHING=1", "environment", default=True,
                    note="on by default since TGI 3"),
        "ollama": Flag("(automatic: a slot keeps its last prompt)", "automatic", default=True),
    },
    "max_num_seqs": {
        "latlab": Flag("--max-num-seqs {n}", default=32),
        "vllm": Flag("--max-num-seqs {n}"),
        "sglang": Flag("--max-running-requests {n}"),
        "llamacpp": Flag("-np {n}", note="slots: each gets the context / -np tokens"),
        "tgi": Flag("--max-batch-size {n}"),
        "ollama": Flag("OLLAMA_NUM_PARALLEL={n}", "environment"),
    },
    "fair_share": {
        "latlab": Flag("--fair-share", default=False,
                       note="tenants (X-Tenant-Id, else `user`) share the batch evenly"),
    },
}

# Where a server can be told a setting on its command line, `latlab ab` can measure it.
MEASURABLE: tuple[Where, ...] = ("option",)
SMALLEST_BUDGET = 16


def joined(*parts: Advice | str | None) -> tuple[str, list[Advice]]:
    """The fix's text (`; `-joined, what was not ruled out) and its parts."""
    kept = [p if isinstance(p, Advice) else Advice(p) for p in parts if p]
    text = "; ".join(p.text for p in kept) or ("nothing the server's settings and this run's "
                                               "data leave to change on the server")
    return text, kept


# Options that are one option under two spellings (llama.cpp's short and long forms).
ALIASES = {"-b": "--batch-size", "-ub": "--ubatch-size", "-np": "--parallel",
           "-c": "--ctx-size"}


def with_args(base: str, change: str) -> str:
    """A server's options `base` with the options of `change` set: those `change` names are
    taken out of `base` (with their values, under either spelling), then `change` added."""
    tokens, new = shlex.split(base), shlex.split(change)

    def name(token: str) -> str:
        flag = token.split("=", 1)[0]
        return ALIASES.get(flag, flag)

    names = {name(t) for t in new if t.startswith("-")}
    out, i = [], 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if token.startswith("-") and name(token) in names:
            if "=" not in token and i < len(tokens) and _a_value(tokens[i]):
                i += 1  # its value
            continue
        out.append(token)
    return shlex.join(out + new)


def launch_option(a: RunAnalysis, name: str) -> str | None:
    """The value of option `name` (either spelling) on the command latlab launched the server
    with (`--launch`, its `{args}` filled in), the last one given; None when not given."""
    target, bench = a.config.target, a.config.bench
    if target.launch is None:
        return None
    args = shlex.join(bench.serve_args) if bench is not None else ""
    tokens = shlex.split(target.launch.replace("{args}", args))
    wanted, value = ALIASES.get(name, name), None
    for i, token in enumerate(tokens):
        flag, equals, inline = token.partition("=")
        if ALIASES.get(flag, flag) == wanted:
            value = inline if equals else (tokens[i + 1] if i + 1 < len(tokens) else None)
    return value


def _a_value(token: str) -> bool:
    """Whether `token` after a flag is its value: not a flag, or a negative number (SGLang's
    `--chunked-prefill-size -1`)."""
    return not token.startswith("-") or re.fullmatch(r"-\d+(\.\d*)?", token) is not None


def server_of(a: RunAnalysis) -> tuple[ServerSettings | None, str | None]:
    """What the server said of its settings (None when nothing), and who it is."""
    target = a.config.target
    kind = str(target.server_kind) if target.server_kind is not None else None
    if kind in (None, "auto") and target.embedded:
        kind = "latlab"
    settings = target.settings if target.settings is not None and target.settings.known() \
        else None
    return settings, kind


def _flag(knob: Knob, kind: str | None) -> Flag | None:
    return FLAGS[knob].get(kind or "")


def _named(knob: Knob, kind: str | None, value: int | bool | None = None) -> str:
    """" (the server's flag)", with `value` written in where given."""
    flag = _flag(knob, kind)
    if flag is None:
        return ""
    written = flag.written(value) if value is not None else flag.spelling.replace(" {n}", "")
    return f" ({written})"


def _change(knob: Knob, kind: str | None, value: int | bool) -> Change | None:
    flag = _flag(knob, kind)
    if flag is None or flag.where not in MEASURABLE or not flag.spelling.startswith("-"):
        return None
    return Change(knob, value, kind, flag.written(value))


def _state(knob: Knob, told: bool | int | None, kind: str | None) -> bool | int | None:
    """What the server said, else its default where latlab knows it, else None."""
    if told is not None:
        return told
    flag = _flag(knob, kind)
    return flag.default if flag is not None else None


def chunked_prefill(a: RunAnalysis) -> Advice | None:
    """Smaller prefill chunks, so decodes wait less behind a long prompt: not on a
    host-bound server, where each step costs the same whatever its tokens."""
    s, kind = server_of(a)
    bound = host_bound(a)
    if bound is not None:
        return host_bound_advice(bound, kind)
    if kind == "llamacpp":  # /props does not tell -b: the launch command, else the default
        given = launch_option(a, "-b")
        batch = (s.step_tokens if s is not None and s.step_tokens else None) or (
            int(given) if given is not None and given.isdigit() else None) or _state(
            "step_tokens", None, kind)
        smaller = max(SMALLEST_BUDGET, int(batch) // 4)
        return Advice(f"a smaller prompt batch{_named('step_tokens', kind, smaller)}: "
                      "llama.cpp fills a batch with prompt tokens up to -b and sends tokens "
                      "only after each batch (-ub alone does not shorten it)",
                      _change("step_tokens", kind, smaller))
    chunked = s.chunked_prefill if s is not None else None
    if chunked is None and kind in ("vllm", "latlab"):
        chunked = True  # both chunk by default
    budget = (s.step_tokens if s is not None and s.step_tokens else None) \
        or _state("step_tokens", None, kind)
    if chunked is None:
        return Advice(f"chunked prefill (a token budget per step{_named('step_tokens', kind)})"
                      ", if not already on")
    if not chunked:
        return Advice(f"turn on chunked prefill (a token budget per step"
                      f"{_named('step_tokens', kind)})")
    if isinstance(budget, int) and budget > SMALLEST_BUDGET:
        smaller = max(SMALLEST_BUDGET, budget // 4)
        return Advice(f"chunked prefill is on at {budget} tokens a step: try a smaller budget"
                      f"{_named('step_tokens', kind, smaller)}",
                      _change("step_tokens", kind, smaller))
    if isinstance(budget, int):
        return None  # the budget is already as small as advice goes
    return Advice(f"chunked prefill is on: try a smaller token budget per step"
                  f"{_named('step_tokens', kind)}")


def host_bound_advice(bound: HostBound, kind: str | None) -> Advice:
    """What helps a server whose host, not its accelerator, sets the step time."""
    extra = {"latlab": "CUDA graphs (no --enforce-eager)",
             "vllm": "CUDA graphs (no --enforce-eager) and --async-scheduling",
             "sglang": "CUDA graphs and the overlap scheduler (no --disable-overlap-schedule)"
             }.get(kind or "", "CUDA graphs or an overlapped scheduler")
    return Advice(f"the server is host-bound ({bound.summary}): a smaller token budget only "
                  f"adds steps; fewer, fuller steps, {extra}, a faster CPU or more replicas")


def shares_prefixes(a: RunAnalysis) -> bool:
    """Whether the run's prompts can share a prefix at all: a synthetic workload without a
    shared system prompt cannot (a dataset, a trace or sessions might)."""
    bench = a.config.bench
    if bench is None:
        return True
    w = bench.workload
    return bool(w.prefix_tokens) or w.dataset is not None or w.sessions is not None \
        or bench.arrivals.process == "trace"


def prefix_caching(a: RunAnalysis, what: str = "shared prompt prefixes") -> Advice | None:
    """Keeping the KV blocks of shared prefixes, so their prefill is skipped: not when the
    server has it on (said, or its default), when prompt tokens already came from a prefix
    cache, or when the prompts share nothing."""
    s, kind = server_of(a)
    cache = a.summary.cache
    if cache is not None and cache.share > 0:
        return None  # the server serves prompt tokens from its cache: it is on
    if not shares_prefixes(a):
        return None
    on = _state("prefix_caching", s.prefix_caching if s is not None else None, kind)
    if on:
        return None
    flag = _flag("prefix_caching", kind)
    if on is None or flag is None:
        return Advice(f"prefix caching for {what}{_named('prefix_caching', kind)}, "
                      "if not already on")
    return Advice(f"turn on prefix caching for {what} ({flag.spelling})",
                  _change("prefix_caching", kind, True))


def smaller_batches(a: RunAnalysis) -> Advice | None:
    """Fewer sequences decoding at once: each step is shorter (not on a host-bound server,
    at one sequence, nor when the run never filled the batch: a cap it did not reach
    changes nothing)."""
    s, kind = server_of(a)
    if host_bound(a) is not None:
        return None
    now = _state("max_num_seqs", s.max_num_seqs if s is not None else None, kind)
    if isinstance(now, int) and not isinstance(now, bool):
        t = a.summary.throughput
        if now <= 1 or (t is not None and t.mean_concurrency <= now / 2):
            return None
        fewer = max(1, now // 2)
        return Advice(f"smaller decode batches (now {now} at most: try "
                      f"{_named('max_num_seqs', kind, fewer).strip(' ()')})",
                      _change("max_num_seqs", kind, fewer))
    return Advice(f"smaller decode batches{_named('max_num_seqs', kind)}")


def fair_queueing(a: RunAnalysis) -> Advice:
    """Per-tenant isolation, so one tenant's burst does not queue the others."""
    s, kind = server_of(a)
    if s is not None and s.scheduling == "fair_share":
        return Advice("fair share is on: per-tenant concurrency limits, or separate replicas")
    return Advice(f"per-tenant isolation: fair queueing{_named('fair_share', kind)}, "
                  "per-tenant concurrency limits", _change("fair_share", kind, True))
