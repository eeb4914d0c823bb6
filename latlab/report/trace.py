"""Terminal output of `latlab trace`: a trace's traffic in a few lines, and the synthetic
workload closest to it."""

from __future__ import annotations

from rich.console import Console

from latlab.records.trace import Lengths, TraceProfile
from latlab.units import number, pct


def print_trace(out: Console, p: TraceProfile) -> None:
    def line(label: str, text: str) -> None:
        out.print(f"{label:<11} {text}", highlight=False, markup=False)

    line("trace", f"{p.source} ({p.format}) · {p.requests:,} requests over {p.span_s:,.1f} s"
         + (f" · {p.skipped}" if p.skipped else ""))
    burst = " · ".join(part for part in (
        f"inter-arrival CV {p.interarrival_cv:.2f}" if p.interarrival_cv is not None else "",
        f"gamma shape {p.gamma_shape:.2g}" if p.gamma_shape is not None else "",
        f"dispersion {p.dispersion:.2g} (1 s counts)" if p.dispersion is not None else "")
        if part)
    line("rate", f"{p.rate:.3g} req/s mean, {p.peak_rate:.3g} at peak ({p.bin_s:g} s bins)"
         + (f" · {burst}" if burst else ""))
    for label, lengths in (("prompt", p.prompt), ("output", p.output)):
        line(label, _lengths(lengths))
    s = p.sharing
    if s is not None:
        line("sharing", f"{pct(s.cacheable_share)} of prompt tokens are a prefix seen before "
             f"(what an unbounded prefix cache holds) · {pct(s.hit_requests)} of requests "
             f"find one · {s.reused_blocks:,} of {s.blocks:,} blocks ({s.block_tokens} "
             "tokens) reused")
        if s.reuse_requests_p50 is not None:
            line("", f"reuse distance p50 {s.reuse_requests_p50:,.0f} requests "
                 f"({s.reuse_s_p50:,.1f} s), p90 {s.reuse_requests_p90:,.0f} "
                 f"({s.reuse_s_p90:,.1f} s) · the most common first block starts "
                 f"{pct(s.common_first_share)} of requests")
    else:
        line("sharing", "no prompt blocks in this trace: its prompts replay fresh (no shared "
             "prefix is invented)")
    ss = p.sessions
    if ss is not None:
        line("sessions", f"{ss.sessions:,} sessions ({pct(ss.requests)} of requests) · "
             f"{ss.turns_mean:.1f} turns mean, {ss.turns_max} at most · gap between turns "
             f"p50 {number(ss.gap_s_p50, '{:.1f}')} s, p90 {number(ss.gap_s_p90, '{:.1f}')} s")
    line("synthetic", "latlab bench " + " ".join(p.flags))


def _lengths(lengths: Lengths | None) -> str:
    if lengths is None:
        return "– (the trace gives none: drawn from --prompt-tokens/--output-tokens)"
    return (f"mean {lengths.mean:,.0f} · p50 {lengths.p50:,.0f} · p90 {lengths.p90:,.0f} · "
            f"p99 {lengths.p99:,.0f} · max {lengths.max:,.0f} tokens")
