"""Each "try first" that names a setting, tested before it is given: the run's own
calibration (a predicted run's, or one fitted from the measured run itself) simulates the run
again with the setting changed, both sides in the same drawn worlds, so the change's effect
on the finding's metric has its own interval (with no drawn worlds, `draws=0` as `predict
--draws 0` asks, the two point estimates alone: an effect without an interval); a
suggestion predicted to make that metric or the output rate worse is taken out of the fix,
and every one that stays carries its predicted effect and the `latlab ab` command that
measures it (one predicted to change nothing is left out too); those predicted better come
first, the largest predicted gain first. A setting that would make the server run steps its
calibration never timed (`calibration_reach`) is not predicted: it carries the `latlab ab` alone.

    annotate(analysis, cal)     # cal None: fitted from the run folder, when it can be
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from latlab.analysis.advice import joined
from latlab.analysis.capacity import RunColumns
from latlab.analysis.findings import Advice, Change, Finding
from latlab.analysis.run_analysis import RunAnalysis
from latlab.records.calibration import Calibration
from latlab.records.catalog import statistic_label
from latlab.records.config import RunConfig
from latlab.records.engine import SHAPE_FIELDS
from latlab.records.simulation import Fleet
from latlab.services.advice_ab import ab_command
from latlab.services.calibration_reach import unseen
from latlab.services.predict_intervals import (
    Intervals,
    paired_interval,
    point_outcome,
    reseeded,
    run_draws,
)
from latlab.sim import calibration as calibrations
from latlab.sim.calibrate_run import CalibrationError
from latlab.units import ms

DRAWS = 8
REQUESTS = 2_000  # at most, per draw and side: enough for a p99, quick to simulate
OUTPUT_WORSE = 0.05  # a predicted loss of output tokens/s beyond this share rules a change out
KNOB_FIELDS = {"step_tokens": "max_num_batched_tokens", "prefix_caching": "enable_prefix_caching",
               "max_num_seqs": "max_num_seqs", "fair_share": "fair_share"}
BUSY_HOST = ("the host was busy with other work during the run: the calibration carries it, so "
             "the prediction may not hold; measure on a quiet host")
NO_WORKLOAD = ("the run has no workload latlab can simulate again (it was observed, not "
               "generated)")
Verdict = Literal["better", "worse", "no effect", "can't tell"]
NO_EFFECT = 0.01  # of the metric: a predicted difference within it, both ends, is none
TRADE = 0.05  # a predicted change of TTFT p50 beyond this share is said beside another metric


@dataclass(frozen=True)
class Effect:
    """A change's predicted effect on `metric` (ms; `before` and `after` are the medians of
    the draws) with the interval of the paired difference, and on the output rate. An effect
    without an honest interval (`interval` False: `paired_interval` says when) prints none,
    and decides nothing: "can't tell". A point estimate (`draws` 0: no drawn worlds, both
    sides simulated once as the calibration fitted them) has no interval either; its one
    difference decides, as the prediction's own percentiles are point estimates then."""

    change: Change
    metric: tuple[str, str]
    before: float
    after: float
    lo: float  # the difference (after − before), its interval's ends
    hi: float
    output_change: float  # relative change of output tokens/s (median of the draws)
    output_lo: float
    draws: int
    ttft_change: float = 0.0  # relative change of TTFT p50 (median): the trade, when not the metric
    interval: bool = True  # lo/hi span the drawn worlds (False: they did not set them apart)
    difference: float | None = None  # the paired differences' median (None: after − before)

    @property
    def gain(self) -> float:
        """The predicted improvement as a share of `before` (the paired differences' median;
        positive: the metric shorter), what the changes kept are ranked by."""
        d = self.difference if self.difference is not None else self.after - self.before
        return -d / self.before if self.before > 0 else -d

    @property
    def point(self) -> bool:
        """A point estimate: no drawn worlds."""
        return self.draws == 0

    @property
    def verdict(self) -> Verdict:
        if self.point:
            return self._point_verdict()
        if not self.interval:
            return "can't tell"
        if self.output_lo < -OUTPUT_WORSE and self.output_change < -OUTPUT_WORSE:
            return "worse"
        if self.lo > 0:
            return "worse"
        if self.hi < 0:
            return "better"
        if max(abs(self.lo), abs(self.hi)) <= NO_EFFECT * self.before:
            return "no effect"
        return "can't tell"

    def _point_verdict(self) -> Verdict:
        d = self.after - self.before
        if self.output_change < -OUTPUT_WORSE or d > NO_EFFECT * self.before:
            return "worse"
        if d < -NO_EFFECT * self.before:
            return "better"
        return "no effect"

    def line(self) -> str:
        name = statistic_label(*self.metric)
        share = (self.after - self.before) / self.before if self.before > 0 else math.nan
        if self.point:
            interval = "a point estimate, no interval: no drawn worlds (--draws 0)"
        elif self.interval:
            interval = (f"{100 * Intervals.level:.0f}% difference {_signed(self.lo)} to "
                        f"{_signed(self.hi)}, {self.draws} paired draws")
        else:
            interval = ("no interval: the drawn worlds did not set the sides apart, "
                        f"{self.draws} paired draws")
        out = f", output tokens/s {_percent(self.output_change)}" \
            if abs(self.output_change) >= 0.01 else ""
        if self.metric[0] != "ttft" and abs(self.ttft_change) >= TRADE:
            out += f", TTFT p50 {_percent(self.ttft_change)}"
        return (f"predicted for `{self.change.args}`: {name} {ms(self.before)} → "
                f"{ms(self.after)} ({_percent(share)}; {interval}){out}: {self.verdict}")


def _percent(share: float) -> str:
    return "–" if math.isnan(share) else f"{100 * share:+.0f}%".replace("-", "−")


def _signed(value: float) -> str:
    return ("+" if value > 0 else "−" if value < 0 else "") + ms(abs(value))


def changed(cal: Calibration, change: Change) -> Calibration:
    """`cal` with the setting `change` names set in its engine shape."""
    field = KNOB_FIELDS[change.knob]
    update: dict[str, object] = {field: change.value}
    if change.knob == "step_tokens":
        update |= {"enable_chunked_prefill": True}
        if cal.engine.max_prefill_tokens is not None:
            update["max_prefill_tokens"] = change.value
    return cal.model_copy(update={"engine": cal.engine.model_copy(update=update)})


def run_calibration(analysis: RunAnalysis) -> Calibration:
    """The run's own calibration: its requests fitted, with the server's settings as the
    engine shape (latlab serve tells all of them; others what they tell)."""
    settings = analysis.config.target.settings
    shape: dict[str, object] = {}
    if settings is not None:
        engine = settings.raw.get("/server_info", {}).get("engine") \
            if isinstance(settings.raw.get("/server_info"), dict) else None
        if isinstance(engine, dict):
            shape = {k: engine.get(k) for k in (*SHAPE_FIELDS, "num_kv_blocks")}
        else:
            shape = {"max_num_seqs": settings.max_num_seqs,
                     "max_num_batched_tokens": settings.step_tokens,
                     "enable_chunked_prefill": settings.chunked_prefill,
                     "enable_prefix_caching": settings.prefix_caching}
    return calibrations.run_calibration([analysis.run.path], shape)


def predict_effect(cal: Calibration, config: RunConfig, fleet: Fleet, change: Change,
                   metric: tuple[str, str], draws: int = DRAWS) -> Effect | None:
    """Simulate the run's workload with and without `change` in the same `draws` worlds
    (0: once each, no drawn world: the point estimates alone); None when the simulation gives
    the metric no value."""
    bench = config.bench
    if bench is None:
        return None
    intervals = Intervals(draws=draws, requests=REQUESTS)
    workload_for = reseeded(bench, intervals.requests)

    def judge(run: RunColumns) -> tuple[float, float, float]:
        summary = run.summary
        value, ttft = summary.percentile(*metric), summary.percentile("ttft", "p50")
        rate = summary.throughput.output_tokens_per_s if summary.throughput else math.nan
        return (math.nan if value is None else value), rate, (
            math.nan if ttft is None else ttft)

    if not draws:
        return _point_effect(*(point_outcome(c, workload_for(0), fleet, config, judge).judged
                               for c in (cal, changed(cal, change))), change, metric)
    sides = [run_draws(c, workload_for, fleet, config, intervals, judge)
             for c in (cal, changed(cal, change))]
    a = np.array([o.judged for o in sides[0]], dtype=float)
    b = np.array([o.judged for o in sides[1]], dtype=float)
    both = ~np.isnan(a[:, 0]) & ~np.isnan(b[:, 0])
    if not both.any():
        return None
    diff = b[both, 0] - a[both, 0]
    rates = (b[:, 1] - a[:, 1]) / np.where(a[:, 1] > 0, a[:, 1], np.nan)
    rates = rates[~np.isnan(rates)]
    ttfts = (b[:, 2] - a[:, 2]) / np.where(a[:, 2] > 0, a[:, 2], np.nan)
    ttfts = ttfts[~np.isnan(ttfts)]
    tail = intervals.tail
    span = paired_interval(cal, diff, intervals)
    median = float(np.median(diff))
    lo, hi = span if span is not None else (median, median)
    return Effect(change, metric, before=float(np.median(a[both, 0])),
                  after=float(np.median(b[both, 0])), lo=lo, hi=hi,
                  output_change=float(np.median(rates)) if len(rates) else 0.0,
                  output_lo=float(np.quantile(rates, tail)) if len(rates) else 0.0,
                  draws=int(both.sum()),
                  ttft_change=float(np.median(ttfts)) if len(ttfts) else 0.0,
                  interval=span is not None, difference=median)


def _point_effect(a: tuple[float, float, float], b: tuple[float, float, float],
                  change: Change, metric: tuple[str, str]) -> Effect | None:
    """The effect the two point estimates `a` and `b` (metric, output rate, TTFT p50) give."""
    if math.isnan(a[0]) or math.isnan(b[0]):
        return None

    def relative(i: int) -> float:
        return (b[i] - a[i]) / a[i] if a[i] > 0 and not math.isnan(b[i]) else 0.0

    d = b[0] - a[0]
    return Effect(change, metric, before=a[0], after=b[0], lo=d, hi=d,
                  output_change=relative(1), output_lo=relative(1), draws=0,
                  ttft_change=relative(2), interval=False, difference=d)


def annotate(analysis: RunAnalysis, cal: Calibration | None = None, fleet: Fleet | None = None,
             draws: int = DRAWS) -> list[str]:
    """Test each finding's suggested changes (`Finding.notes` get each one's predicted
    effect and its `latlab ab`; one predicted worse leaves the fix); returns what could not
    be predicted, and why."""
    findings = [f for f in analysis.findings if f.changes and f.metric]
    if not findings:
        return []
    if cal is None:
        try:
            cal = run_calibration(analysis)
        except CalibrationError as e:
            note = f"no predicted effect: the run cannot calibrate the simulator ({e})"
            for f in findings:
                f.notes += [note] + [f"measure it: {ab_command(analysis, c, f.metric)}"
                                     for c in f.changes]
            return [note]
    fleet = fleet or (analysis.config.simulation.fleet if analysis.config.simulation
                      else Fleet())
    for f in findings:
        _test(f, analysis, cal, fleet, draws)
        if analysis.client is not None and analysis.client.host_busy:
            f.notes.append(BUSY_HOST)
    return []


def _test(f: Finding, analysis: RunAnalysis, cal: Calibration, fleet: Fleet,
          draws: int) -> None:
    kept: list[Advice] = []
    notes: list[str] = []
    gains: dict[int, float] = {}  # by id of the advice: those predicted better
    for advice in f.tries:
        if advice.change is None:
            kept.append(advice)
            continue
        reason = NO_WORKLOAD if analysis.config.bench is None else unseen(
            cal, analysis, advice.change)
        effect = None if reason is not None else predict_effect(
            cal, analysis.config, fleet, advice.change, f.metric, draws)
        if effect is not None and effect.verdict in ("worse", "no effect"):
            notes.append(f"not advised: {effect.line()}")
            continue
        kept.append(advice)
        if effect is not None and effect.verdict == "better":
            gains[id(advice)] = effect.gain
        if reason is not None:  # the simulator would extrapolate: measure, do not guess
            notes.append(f"not predicted for `{advice.change.args}`: {reason}")
        else:
            notes.append(effect.line() if effect is not None else
                         f"not predicted for `{advice.change.args}`: the simulation gives "
                         f"no {statistic_label(*f.metric)}")
        notes.append(f"measure it: {ab_command(analysis, advice.change, f.metric)}")
    # those predicted better first, the largest predicted gain (paired) first; the rest as
    # the finding put them
    kept.sort(key=lambda a: (0, -gains[id(a)]) if id(a) in gains else (1, 0.0))
    f.fix, f.tries = joined(*kept)
    f.notes += notes


def predicted(findings: Sequence[Finding]) -> bool:
    """Whether any finding's advice was tested."""
    return any(n.startswith(("predicted", "not advised", "not predicted"))
               for f in findings for n in f.notes)
