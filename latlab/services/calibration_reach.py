"""What a run's own calibration has seen, so what it may predict. A calibration fitted from
a measured run (`Calibration.source == "run"`) timed the steps that run made: prefill
chunks of the size its token budget and prompts gave, decode batches as large as its cap and
its load allowed. A setting that makes the server run steps outside those (chunks of another
size by more than `REACH`, a larger decode batch) is not predicted: the fitted line would be
extrapolated there, and the server's own cost of such a step (llama.cpp pays a fixed cost for
every `-b` batch and `-ub` micro-batch) was never seen.
On llama-server `-b 64 -ub 64` was predicted +7 % output tokens/s and measured −71 %.

Such a setting is measured instead (`latlab ab`; `latlab tune` screens it with a short real
run). latlab's engine calibration (`source == "engine"`) times every size of step in its
probes, so it is trusted across them.

    reason = unseen(cal, analysis, change)   # None: the calibration has seen such steps
"""

from __future__ import annotations

import numpy as np

from latlab.analysis.findings import Change
from latlab.analysis.run_analysis import RunAnalysis
from latlab.records.calibration import Calibration

# How far from the prefill chunks it timed (either way, as a ratio of their sizes) a step
# cost fitted from one run is trusted: a budget that halves the chunks is within it. A decode
# batch larger than any it timed is not: one run's decodes at one batch size cannot tell the
# cost of a sequence from the cost of the step (on a CPU, llama-server decodes 8 sequences at
# less per sequence than 4).
REACH = 2.0


def unseen(cal: Calibration, a: RunAnalysis, change: Change) -> str | None:
    """Why the calibration cannot predict `change`, or None when it has seen steps like the
    ones the change makes."""
    if cal.source != "run" or isinstance(change.value, bool):
        return None
    if change.knob == "step_tokens":
        return _chunks(cal, a, change.value)
    if change.knob == "max_num_seqs":
        return _batch(cal, a, change.value)
    return None


def _chunks(cal: Calibration, a: RunAnalysis, budget: int) -> str | None:
    """The prefill chunks under `budget` against those the run timed (its prompts, less what
    came from the prompt cache, cut at the run's own budget)."""
    t = a.table
    prompts = np.nan_to_num(a.requests.prompt_tokens[a.ok]) - np.nan_to_num(
        t.cached_tokens[a.ok])
    prompts = prompts[prompts > 0]
    if not len(prompts):
        return None
    typical = float(np.median(prompts))
    now = cal.engine.max_prefill_tokens or cal.engine.max_num_batched_tokens
    timed, asked = min(typical, now), min(typical, budget)
    if max(timed, asked) <= REACH * min(timed, asked):
        return None
    return (f"the run timed prefills in steps of about {timed:.0f} prompt tokens; the "
            f"server's cost of a step of {asked:.0f} (its fixed cost per batch included) was "
            "never timed")


def _batch(cal: Calibration, a: RunAnalysis, cap: int) -> str | None:
    """The decode batch under `cap` against the largest the run timed (its cap, or the most
    requests it had in flight)."""
    in_flight = a.requests.in_flight[a.inside]
    if not len(in_flight):
        return None
    offered = int(np.max(in_flight)) + 1  # the request itself, and those already in flight
    timed, asked = min(cal.engine.max_num_seqs, offered), min(cap, offered)
    if asked <= timed:
        return None
    return (f"the run timed decode batches of at most {timed} sequences; the server's cost "
            f"of a batch of {asked} was never timed")
