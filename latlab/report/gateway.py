"""A gateway in front of the engine, in words for the console and the report: what it is,
the connections to it, and its hop (`analysis.hop`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.text import Text

from latlab.analysis.connections import connections
from latlab.analysis.hop import Hop

if TYPE_CHECKING:
    from latlab.analysis.run_analysis import RunAnalysis


def print_target(console: Console, analysis: RunAnalysis) -> None:
    """What answered: the gateway in front of the engine, when one was detected or named,
    and over HTTPS or through a gateway the connections, new and reused."""
    for line in target_lines(analysis):
        console.print(Text(line), markup=False, highlight=False)


def target_lines(analysis: RunAnalysis) -> list[str]:
    """The gateway and the connections, in words (nothing for a plain direct run)."""
    t, lines = analysis.config.target, []
    if t.gateway is not None:
        behind = f" in front of {t.server_url}" if t.server_url else ""
        lines.append(f"gateway     {t.gateway.name}{behind} ({t.gateway.evidence})")
    use = connections(analysis.table, analysis.ok)
    if use is not None and (t.gateway is not None or use.tls_ms is not None):
        lines.append(f"connections {use.line()}")
    return lines


def print_hop(console: Console, analysis: RunAnalysis) -> None:
    """The gateway's hop (`analysis.hop`): the time to first token split across it."""
    if analysis.hop is None:
        return
    title, *lines = hop_lines(analysis.hop)
    console.print()
    console.print(Text(title, style="bold"))
    for line in lines:
        console.print(Text(f"  {line}"))


def hop_lines(h: Hop) -> list[str]:
    """The hop in words: its title, the time to first token split, the tail, the join."""
    ways = ", ".join(f"{by} {n}" for by, n in sorted(h.joined_by.items(), key=lambda kv: -kv[1]))
    through = h.gateway.name if h.gateway is not None else "the gateway"
    return [f"Through {through} (mean of {h.joined} of {h.requests} requests, "
            f"{100 * h.coverage:.0f}%)",
            f"first token {h.client_ttft_ms:,.1f} ms = gateway intake {h.intake_ms:,.1f} "
            f"+ engine {h.engine_ttft_ms:,.1f} (queue, prefill) + forwarding "
            f"{h.forward_ms:,.1f}",
            f"after the engine's last byte: gateway tail {h.tail_ms:,.1f} ms "
            + (f"(the engine's whole request {h.engine_ms:,.1f} ms)"
               if h.engine_ms is not None else "(the engine's whole request: not reported)"),
            f"engine spans joined by {ways or 'nothing recorded'}"]
