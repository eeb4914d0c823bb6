"""The `latlab ab` that measures a suggestion: the server's arguments as the run had them and
with the change, on the run's own workload, rounds until the finding's metric is decided,
each round long enough to hold the streams a verdict on it needs.

    ab_command(analysis, change, ("itl_max", "mean"))
"""

from __future__ import annotations

import math
import shlex

from latlab.analysis.advice import with_args
from latlab.analysis.findings import Change
from latlab.analysis.run_analysis import RunAnalysis
from latlab.records.verdict import key_of

# Requests a round should hold. A round's mean of per-request values over a dozen requests is
# mostly their draw: llama-server's rounds of 7–15 streams (1,024-token prompts, 15 s) moved
# 23 % between themselves in an A/A, as much as the bootstrap of their own streams; 40 halve
# that (docs/performance/advice.md).
ROUND_REQUESTS = 40
ROUND_STEP_S = 5  # a longer round is rounded up to this


def ab_command(analysis: RunAnalysis, change: Change, metric: tuple[str, str]) -> str:
    """The `latlab ab` that measures `change` on the run's own workload and runs rounds
    until the finding's `metric` is decided: the server's arguments as they were and with the
    change — latlab serve's, or those of the run's `--launch` template; a server latlab did
    not start, through a template to fill in (its command with `{port}` and `{args}`). The
    sides are the server alone, each started by ab: a gateway the run went through points at
    one server, not at one a side. Rounds run longer than the run did where it held fewer
    than ROUND_REQUESTS requests (`round_duration`)."""
    config, target, bench = analysis.config, analysis.config.target, analysis.config.bench
    folder = shlex.quote(str(analysis.run.path))
    started = target.embedded or target.launch is not None or (
        config.kind == "predict" and target.server_kind == "latlab")
    a = shlex.join(bench.serve_args) if started and bench is not None else ""
    b = with_args(a, change.args)
    launch = "" if target.launch is None and started else " --launch " + shlex.quote(
        target.launch or "SERVER-COMMAND --port {port} {args}")
    longer = round_duration(analysis)
    duration = "" if longer is None else f" --duration {longer:g}"
    return (f"latlab ab --config {folder}{launch} --a {shlex.quote(a)} --b {shlex.quote(b)} "
            f"--decide-on {key_of(*metric)}{duration}")


def round_duration(analysis: RunAnalysis) -> float | None:
    """Seconds of load a round needs to hold ROUND_REQUESTS of the run's requests, where the
    run (its duration) held fewer; None where it held enough, or was not timed by duration
    (a measured run only: a predicted one's requests are not what a real round holds)."""
    bench = analysis.config.bench
    if bench is None or bench.duration_s is None or analysis.config.kind == "predict":
        return None
    held = int(analysis.ok.sum())
    if held >= ROUND_REQUESTS:
        return None
    needed = bench.duration_s * ROUND_REQUESTS / max(held, 1)
    return float(math.ceil(needed / ROUND_STEP_S) * ROUND_STEP_S)
