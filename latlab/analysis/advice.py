"""Advice that knows the server: what a finding says to try, given what the server says of
its own settings (`config.json` → `target.settings`) and who it is. A technique already on
is advised as a change to its setting ("chunked prefill is on at 512 tokens a step: try
128"), one known to be off as turning it on, and one the server did not tell about as "if
not already on". Each server's name for the knob is given where latlab knows it."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from latlab.analysis.run_analysis import RunAnalysis
    from latlab.records.server import ServerSettings

# How each server names a knob (latlab serve's, vLLM's, SGLang's, llama.cpp's options).
FLAGS = {
    "step_tokens": {"latlab": "--max-num-batched-tokens", "vllm": "--max-num-batched-tokens",
                    "sglang": "--chunked-prefill-size", "llamacpp": "--ubatch-size"},
    "prefix_caching": {"latlab": "--enable-prefix-caching", "vllm": "--enable-prefix-caching",
                       "sglang": "the radix cache (off with --disable-radix-cache)",
                       "llamacpp": "cache_prompt"},
    "max_num_seqs": {"latlab": "--max-num-seqs", "vllm": "--max-num-seqs",
                     "sglang": "--max-running-requests", "llamacpp": "--parallel"},
    "fair_share": {"latlab": "--fair-share"},
}


def _server(a: RunAnalysis) -> tuple[ServerSettings | None, str | None]:
    target = a.config.target
    kind = str(target.server_kind) if target.server_kind is not None else None
    if target.embedded and kind is None:
        kind = "latlab"
    settings = target.settings if target.settings is not None and target.settings.known() \
        else None
    return settings, kind


def _flag(knob: str, kind: str | None) -> str:
    name = FLAGS.get(knob, {}).get(kind or "")
    return f" ({name})" if name else ""


def chunked_prefill(a: RunAnalysis) -> str:
    """Smaller prefill chunks, so decodes wait less behind a long prompt."""
    s, kind = _server(a)
    flag = _flag("step_tokens", kind)
    if kind == "llamacpp":
        return (f"a smaller prompt batch{flag}: llama.cpp processes prompts in chunks of it "
                "between decode steps")
    if s is None or s.chunked_prefill is None:
        return f"chunked prefill (a token budget per step{flag}), if not already on"
    if not s.chunked_prefill:
        return f"turn on chunked prefill (a token budget per step{flag})"
    if s.step_tokens:
        smaller = max(16, s.step_tokens // 4)
        return (f"chunked prefill is on at {s.step_tokens} tokens a step: try a smaller budget "
                f"(e.g. {smaller}{flag}) side by side with `latlab ab`")
    return f"chunked prefill is on: try a smaller token budget per step{flag} with `latlab ab`"


def prefix_caching(a: RunAnalysis, what: str = "shared prompt prefixes") -> str:
    """Keeping the KV blocks of shared prefixes, so their prefill is skipped."""
    s, kind = _server(a)
    flag = _flag("prefix_caching", kind)
    if s is None or s.prefix_caching is None:
        return f"prefix caching for {what}{flag}, if not already on"
    if not s.prefix_caching:
        return f"turn on prefix caching for {what}{flag}"
    cache = a.summary.cache
    seen = f" (it served {100 * cache.share:.0f}% of prompt tokens here)" if cache else ""
    return (f"prefix caching is on{seen}: more of it needs {what} that are really the same "
            "text, and KV memory to keep them")


def smaller_batches(a: RunAnalysis) -> str:
    """Fewer sequences decoding at once: each step is shorter."""
    s, kind = _server(a)
    flag = _flag("max_num_seqs", kind)
    if s is not None and s.max_num_seqs:
        return f"smaller decode batches (now {s.max_num_seqs} at most{flag})"
    return f"smaller decode batches{flag}"


def fair_queueing(a: RunAnalysis) -> str:
    """Per-tenant isolation, so one tenant's burst does not queue the others."""
    s, kind = _server(a)
    flag = _flag("fair_share", kind)
    if s is not None and s.scheduling == "fair_share":
        return "fair share is on: per-tenant concurrency limits, or separate replicas"
    return f"per-tenant isolation: fair queueing{flag}, per-tenant concurrency limits"
