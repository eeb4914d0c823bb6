"""What a comparison decides about one statistic: better, worse, same, or can't tell.

The evidence is replicates (`replicates.py`): each side's rounds in `latlab ab`, each run's
time blocks in `latlab compare`. The statistic (a p99 TTFT, an output rate) is taken on each
replicate, and the change is the ratio of the sides' geometric means with a two-sample t
interval on the logs (pooled variance, n_A + n_B − 2 degrees of freedom). Logs, because a
server's timings vary in proportion to their size: a setting that makes TTFT 20× slower
spreads its rounds 20× wider in milliseconds but not in ratio, and a band in milliseconds
called that "the same".

With δ the minimum effect:

* same — the whole interval lies inside ±δ (an equivalence test: the change is too small to
  matter, with confidence);
* better / worse — the interval excludes no change and the estimate is at least δ; from two
  single runs (`strict`: their blocks cannot see the drift between runs) the whole interval
  must also lie past δ;
* can't tell — anything else, with roughly how many more rounds would decide.

Error rates: headline metrics (`HEADLINE`, with those an A/B decides on) share the family's
α by Bonferroni (each at α/5), the other statistics share another α among themselves, so the
headline intervals stay narrow however many rows are shown; a sequential A/B spends each α
over its looks (`spent`, a Pocock-type spending function), each look tested at its
increment.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from latlab.records.verdict import HEADLINE, Verdict

FAMILY_ALPHA = 0.05
MAX_MORE_ROUNDS = 50


def alpha(key: str, keys: Sequence[str], headline: Sequence[str] = HEADLINE) -> float:
    """The α of `key`'s test among the compared `keys` (Bonferroni within its family: the
    `headline` keys, or the others)."""
    if key in headline:
        return FAMILY_ALPHA / len(headline)
    return FAMILY_ALPHA / max(1, sum(k not in headline for k in keys))


def spent(fraction: float) -> float:
    """The share of α spent once `fraction` of the most rounds have run: Lan and DeMets'
    Pocock-type function ln(1 + (e − 1)·t), which spends early for effects that show early."""
    return math.log1p((math.e - 1) * min(max(fraction, 0.0), 1.0))


def look_share(rounds: int, previous: int, most: int) -> float:
    """The share of α a look after `rounds` rounds may spend, the previous look having been
    after `previous` (0: none), of at most `most`."""
    return spent(rounds / most) - spent(previous / most)


@dataclass(frozen=True, slots=True)
class RatioInterval:
    """B against A as a relative change (B / A − 1), its interval, and what it rests on."""

    estimate: float
    low: float
    high: float
    confidence: float
    units: tuple[int, int]  # replicates a side
    half_width: float  # of the interval on the scale it was taken on
    logs: bool = True  # taken on the logs (else on the values, relative to A's mean)

    def more_rounds(self, min_effect: float) -> int | None:
        """About how many more replicates a side would narrow the interval enough to
        decide (the t quantile held fixed: a lower bound); None when nothing would."""
        if self.logs:
            d, bound = abs(math.log1p(self.estimate)), math.log1p(min_effect)
        else:
            d, bound = abs(self.estimate), min_effect
        room = d if d >= bound else bound - d  # to exclude no change, or to fit inside ±δ
        if room <= 0 or not 0 < self.half_width < math.inf or not math.isfinite(room):
            return None
        n = max(self.units)
        needed = math.ceil(n * (self.half_width / room) ** 2) - n
        return max(needed, 1) if needed <= MAX_MORE_ROUNDS else None


def ratio_interval(a: Sequence[float], b: Sequence[float],
                   confidence: float) -> RatioInterval | None:
    """The t interval of B / A − 1 from each side's replicate values: on their logs, or
    where a replicate is 0 (a rate), on the values relative to A's mean; where A is 0 in
    every replicate, infinite if B's excess over it is significant, else from 0 to
    infinity. None with fewer than three replicates in all, one a side, or a negative one."""
    va, vb = np.asarray(a, float), np.asarray(b, float)
    if len(va) < 1 or len(vb) < 1 or len(va) + len(vb) < 3 \
            or not (np.isfinite(va).all() and np.isfinite(vb).all()):
        return None
    if (va > 0).all() and (vb > 0).all():
        d, half = _t_difference(np.log(va), np.log(vb), confidence)
        return RatioInterval(math.expm1(d), math.expm1(d - half), math.expm1(d + half),
                             confidence, (len(va), len(vb)), half)
    if (va < 0).any() or (vb < 0).any():
        return None
    scale = float(va.mean())
    if scale == 0:  # goodput 0 → 5 req/s: no ratio, but B's excess can still be shown
        d, half = _t_difference(va, vb, confidence)
        low = math.inf if d - half > 0 else 0.0
        return RatioInterval(math.inf if d > 0 else 0.0, low, math.inf if d > 0 else 0.0,
                             confidence, (len(va), len(vb)), math.inf, logs=False)
    d, half = _t_difference(va / scale, vb / scale, confidence)
    return RatioInterval(d, d - half, d + half, confidence, (len(va), len(vb)), half,
                         logs=False)


def _t_difference(a: np.ndarray, b: np.ndarray, confidence: float) -> tuple[float, float]:
    """mean(b) − mean(a) and the half-width of its two-sample t interval (pooled variance)."""
    from scipy.stats import t as student

    df = len(a) + len(b) - 2
    pooled = (np.sum((a - a.mean()) ** 2) + np.sum((b - b.mean()) ** 2)) / df
    se = math.sqrt(pooled * (1 / len(a) + 1 / len(b)))
    return float(b.mean() - a.mean()), float(student.ppf(1 - (1 - confidence) / 2, df)) * se


@dataclass(frozen=True, slots=True)
class Judgement:
    verdict: Verdict
    why: str | None = None  # for same and can't tell: the reason, and what would decide


def judge(interval: RatioInterval | None, min_effect: float, lower_is_better: bool,
          strict: bool, unit_name: str = "rounds") -> Judgement:
    """The verdict on one statistic's interval (module docstring)."""
    if interval is None:
        return Judgement("can't tell", f"too few {unit_name} with a value on both sides")
    low, high, estimate = interval.low, interval.high, interval.estimate
    if -min_effect < low and high < min_effect:
        return Judgement("same", f"inside ±{100 * min_effect:g}% with "
                                 f"{100 * interval.confidence:.3g}% confidence")
    excludes_none = low > 0 or high < 0
    past = abs(estimate) >= min_effect and (not strict or min(abs(low), abs(high)) >= min_effect)
    if excludes_none and past:
        return Judgement("better" if (estimate < 0) == lower_is_better else "worse")
    more = interval.more_rounds(min_effect)
    if strict:
        hint = "two single runs cannot see the drift between runs: use latlab ab"
    elif more is None:
        hint = f"more {unit_name} would hardly decide"
    else:
        hint = f"about {more} more {unit_name} a side would decide"
    if excludes_none:
        return Judgement("can't tell", f"a change, but perhaps under the "
                                       f"{100 * min_effect:g}% minimum effect; {hint}")
    return Judgement("can't tell", hint)
